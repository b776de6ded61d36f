"""Partitioner benchmark: simulated makespan of every method, its ratio to the MILP optimum, planner wall time.

Metric and goals (issue 4): ``cp_greedy`` <= 1.02 x the MILP optimum wherever MILP proves optimality and
never worse than all_cpu / all_gpu / greedy / heft; planner time for cp_greedy and heft < 1 s at 1k ops and
< 10 s at 10k ops. The reference of each case is the MILP optimum when proven, else the best lower bound
(HiGHS' dual bound or the combinatorial bound of ``hetpart.partition.milp.lower_bound_us``); graphs above
``--milp-max-ops`` get only the combinatorial bound, so their ratios are upper bounds on the true ratio.

Cases are ``(name, OpGraph, CostTable)`` triples: ``run_benchmark`` takes any list of them, so real models
(zoo graphs with predicted CPU and analytic GPU costs) can be added by the caller. ``--synthetic-only`` runs
the seeded synthetic DAGs of ``hetpart.partition.synthetic`` (layered, branchy, series-parallel; the GPU is
the datasheet P2200 preset with random per-op speed-ups, scaled by 1 and by 0.1 for a weak GPU).

    python benchmarks/partition.py --synthetic-only            # writes benchmarks/results/partition.{json,md}
    python benchmarks/partition.py --name partition_zoo        # zoo x presets x batch 1, 8

Planner times: the table and the goals use CPU (process) time of the planning call, because the machine is
shared and wall time includes waiting for a core; wall time is kept in the JSON. Compare within one run.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from hetpart.costs import CostTable
from hetpart.errors import DegeneratePlanWarning, HetpartError
from hetpart.graph import OpGraph
from hetpart.partition import get_method
from hetpart.partition.common import PartitionConfig, Problem
from hetpart.partition.milp import lower_bound_us
from hetpart.partition.synthetic import synthetic_problem

logger = logging.getLogger("benchmarks.partition")

Case = tuple[str, OpGraph, CostTable]
HEURISTICS = ("all_cpu", "all_gpu", "greedy", "heft", "cp_greedy")
RESULTS = Path(__file__).resolve().parent / "results"


def synthetic_cases(sizes: Sequence[int], shapes: Sequence[str] = ("layered", "branchy", "series_parallel"),
                    speedup_scales: Sequence[float] = (1.0, 0.1), seed: int = 0) -> list[Case]:
    cases = []
    for n in sizes:
        for scale in speedup_scales:
            for shape in shapes:
                graph, costs = synthetic_problem(shape, n, seed, gpu_speedup_scale=scale)
                cases.append((f"{shape}-{n}-gpu_x{scale:g}", graph, costs))
    return cases


def _solve(method: str, graph: OpGraph, costs: CostTable, config: PartitionConfig) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegeneratePlanWarning)
        try:
            plan = get_method(method)(graph, costs, config)
        except HetpartError as exc:
            return {"method": method, "error": f"{type(exc).__name__}: {exc}"}
    return {"method": method, "makespan_us": plan.makespan_us, "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu_started,
            "devices_used": sorted(set(plan.device_of)), "stats": dict(plan.stats)}


def run_benchmark(cases: Sequence[Case], *, milp_max_ops: int = 120, milp_time_limit_s: float = 30.0) -> list[dict]:
    """One row per case: every method's makespan, wall time and ratio to the reference (optimum or bound)."""
    rows = []
    for name, graph, costs in cases:
        config = PartitionConfig(time_limit_s=milp_time_limit_s, milp_max_ops=milp_max_ops)
        results = {m: _solve(m, graph, costs, config) for m in HEURISTICS}
        if graph.num_ops <= milp_max_ops:
            results["milp"] = _solve("milp", graph, costs, config)
        milp = results.get("milp", {})
        proven = bool(milp.get("stats", {}).get("proven_optimal"))
        bound = lower_bound_us(Problem(graph, costs, config, "bound"))
        if "stats" in milp:
            bound = max(bound, milp["stats"]["lower_bound_us"])
        reference = milp["makespan_us"] if proven else bound
        for r in results.values():
            if "makespan_us" in r:
                r["ratio"] = r["makespan_us"] / reference if reference > 0 else 1.0
        rows.append({"case": name, "graph": graph.name, "n_ops": graph.num_ops, "n_edges": len(graph.edges),
                     "reference": "optimum" if proven else "lower bound", "reference_us": reference,
                     "methods": results})
        logger.info("%s: %s", name, {m: round(r.get("ratio", float("nan")), 4) for m, r in results.items()})
    return rows


def _cell(r: dict | None) -> str:
    if r is None:
        return "—"
    if "error" in r:
        return "error"
    return f"{r['ratio']:.3f} ({r['cpu_s']:.2f} s)"


def summary(rows: list[dict]) -> dict[str, Any]:
    proven = [r for r in rows if r["reference"] == "optimum"]
    cp_vs_opt = [r["methods"]["cp_greedy"]["ratio"] for r in proven]
    never_worse = all(r["methods"]["cp_greedy"]["makespan_us"] <= min(
        r["methods"][m]["makespan_us"] for m in HEURISTICS[:-1] if "makespan_us" in r["methods"][m]) * (1 + 1e-9)
        for r in rows)
    times = {}
    for method in ("cp_greedy", "heft"):
        for n in sorted({r["n_ops"] for r in rows}):
            cpu = [r["methods"][method]["cpu_s"] for r in rows if r["n_ops"] == n]
            times[f"{method}_max_cpu_s_at_{n}_ops"] = max(cpu)
    return {"cases": len(rows), "cases_with_proven_optimum": len(proven),
            "cp_greedy_max_ratio_to_proven_optimum": max(cp_vs_opt) if cp_vs_opt else None,
            "cp_greedy_cases_within_1.02_of_optimum": sum(1 for x in cp_vs_opt if x <= 1.02),
            "cp_greedy_never_worse_than_baselines": never_worse, **times}


def markdown(rows: list[dict], summ: dict[str, Any], command: str) -> str:
    methods = list(HEURISTICS) + ["milp"]
    lines = ["# Partitioner benchmark", "", f"Command: `{command}`", "",
             "Cells: makespan / reference (planner CPU time, process time of the planning call; wall time is in "
             "the JSON). Reference = MILP optimum when proven, else the "
             "best lower bound (ratios against a bound overstate the true gap). Synthetic costs, not measurements.",
             "", "| case | ops | reference | " + " | ".join(methods) + " |",
             "|---|---:|---|" + "---:|" * len(methods)]
    for r in rows:
        lines.append(f"| {r['case']} | {r['n_ops']} | {r['reference']} | "
                     + " | ".join(_cell(r["methods"].get(m)) for m in methods) + " |")
    lines += ["", "## Goals", ""] + [f"- {k}: {v}" for k, v in summ.items()]
    return "\n".join(lines) + "\n"


def zoo_cases(models: Sequence[str], presets: Sequence[str], batches: Sequence[int],
              cpu_predictor: str | None = None) -> list[Case]:
    """Zoo models at their default input size: the kernel graph hetpart compiles, the shipped (measured,
    fitted) CPU predictor and each analytic GPU preset."""
    from hetpart.api import import_model
    from hetpart.compiler import load_cpu_predictor, parse_devices
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from tvm_passes.extract import extract_op_graph

    cpu = load_cpu_predictor(cpu_predictor)
    cases: list[Case] = []
    for model in models:
        for batch in batches:
            imported = import_model(model, batch=batch)
            graph = extract_op_graph(imported.mod, name=f"{model}-b{batch}",
                                     source_hash=imported.source_hash).kernel_graph()
            for preset in presets:
                choice = parse_devices(f"cpu,gpu={preset}")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # extrapolation warnings are summarised by the predictor
                    costs = build_cost_table(graph, {"cpu": cpu, "gpu": AnalyticGpuModel(preset)}, choice.devices)
                cases.append((f"{model}-b{batch}-{preset}", graph, costs))
            logger.info("prepared %s batch %d: %d kernels", model, batch, graph.num_ops)
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic-only", action="store_true", help="run the synthetic DAGs only (no zoo models)")
    parser.add_argument("--sizes", default="12,24,100,1000,10000", help="synthetic graph sizes (ops)")
    parser.add_argument("--milp-max-ops", type=int, default=120)
    parser.add_argument("--milp-time-limit", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--models", default="resnet18,resnet50,vgg16,mobilenetv2,squeezenet1_1,densenet121,googlenet,"
                        "lstm_lm,gru_lm,bert_small", help="zoo models (without --synthetic-only)")
    parser.add_argument("--presets", default="p2200,t4,a100,rtx3090,jetson-orin", help="analytic GPU presets")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--name", default="partition", help="result file stem in --out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("hetpart").setLevel(logging.WARNING)
    if args.synthetic_only:
        cases = synthetic_cases([int(s) for s in args.sizes.split(",")])
    else:
        cases = zoo_cases(args.models.split(","), args.presets.split(","), [int(b) for b in args.batches.split(",")])
    rows = run_benchmark(cases, milp_max_ops=args.milp_max_ops, milp_time_limit_s=args.milp_time_limit)
    summ = summary(rows)
    command = "python benchmarks/partition.py " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(
        {"command": command, "machine": platform.platform(), "summary": summ, "rows": rows}, indent=1, default=str))
    (args.out / f"{args.name}.md").write_text(markdown(rows, summ, command))
    logger.info("%s", json.dumps(summ, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
