"""The ``torchrun`` entry point: the same plan file and the same per-rank code as ``hetpart train-run``, with the
process group and the ranks taken from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), e.g. NCCL on GPUs::

    torchrun --nnodes 1 --nproc-per-node 4 -m hetpart.training_torch.torchrun_main plan.json \\
        --steps 100 --backend nccl --device cuda --report report.json

Rank ``r`` runs the stages :func:`hetpart.training_torch.run.rank_layout` gives it (those of the device of stage
``r``), on that device's GPU of its node (a cluster's devices are numbered node by node: ``gpu5`` of
``gpu=a100x8,per_node=4`` is GPU 1 of node 1); ``WORLD_SIZE`` must equal the number of devices the plan uses.
Rank 0 gathers every rank's timings (and, with ``--check``, gradients and parameters), prints the report and writes
it as JSON with ``--report``. Not run on GPUs here (no GPU): only with ``--backend gloo --device cpu``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Sequence

from hetpart.training_torch.errors import PipelineRunError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun ... -m hetpart.training_torch.torchrun_main",
                                description="run a hetpart training plan under torchrun (one process per rank)")
    p.add_argument("plan", help="a plan file written by `hetpart train-plan`")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--schedule", default=None, help="run under another schedule than the plan's")
    p.add_argument("--check", action="store_true", help="compare with one process on rank 0 (the whole model on "
                   "one device; gradients and parameters are gathered to rank 0)")
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per process (default 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="process-group timeout in seconds")
    p.add_argument("--report", default=None, help="rank 0 writes the run report here (JSON)")
    return p


def gpu_indices(plan_file: Any, devices: Sequence[str], rank: int, node: int) -> tuple[int, ...]:
    """Per rank, the GPU index on its node of the device the plan put its stages on (a cluster's devices are listed
    node by node, so the k-th device of a node is GPU k there); rank ``rank`` must run on that device's node."""
    cluster = plan_file.plan.cluster
    position = {}
    for n in {d.node for d in cluster.devices}:
        for k, d in enumerate(d for d in cluster.devices if d.node == n):
            position[d.name] = (n, k)
    wanted_node = position[devices[rank]][0]
    if wanted_node != node:
        raise PipelineRunError(f"rank {rank} runs stage {rank} on {devices[rank]}, a device of node {wanted_node}, "
                               f"but torchrun started it on node {node}; order the nodes (--node-rank) so that the "
                               "stages' devices come first on the first nodes, or re-plan")
    return tuple(position[d][1] for d in devices)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    import torch.distributed as dist

    from hetpart.training_torch.plan_file import TrainingPlanFile
    from hetpart.training_torch.run import build_report, check_against_one_process, rank_layout
    from hetpart.training_torch.run_worker import WorkerJob, train_stages

    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as exc:
        raise PipelineRunError(f"{exc} is not set: start this module with torchrun (or set RANK, WORLD_SIZE, "
                               "MASTER_ADDR and MASTER_PORT)") from None
    plan_file = TrainingPlanFile.load(args.plan)
    schedule = args.schedule or plan_file.plan.schedule
    devices, rank_stages = rank_layout(plan_file, schedule)
    if world != len(devices):
        raise PipelineRunError(f"the plan uses {len(devices)} devices ({', '.join(devices)}) but torchrun started "
                               f"{world} processes; start --nproc-per-node x --nnodes = {len(devices)}")
    job = WorkerJob(plan=plan_file.to_dict(), world=world, port=0, schedule=schedule,
                    rank_stages=tuple(rank_stages), steps=args.steps, lr=args.lr, threads=args.threads, out_dir="",
                    pg_timeout_s=args.timeout, save_tensors=args.check, device=args.device, dtype=args.dtype,
                    cuda_index=gpu_indices(plan_file, devices, rank, int(os.environ.get("GROUP_RANK", "0"))))
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        result, tensors = train_stages(rank, job, started)
        gathered: list | None = [None] * world if rank == 0 else None
        dist.gather_object((result, tensors), gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    import torch

    results = [r for r, _ in gathered]
    check = None
    if args.check:
        check = check_against_one_process(plan_file, results, {r["rank"]: t for r, t in gathered}, args.steps,
                                          args.lr, args.tolerance, args.dtype)
    report = build_report(plan_file, schedule, devices, results, args.steps, args.threads, check,
                          torch.__version__)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    from hetpart.driver.cli_train import print_run_report

    return print_run_report(report)


if __name__ == "__main__":
    sys.exit(main())
