"""Training stage partitioning benchmark: every partitioner of ``hetpart.training`` on the zoo.

For each model x cluster x micro-batch count: the bottleneck (steady-state time per micro-batch, the DPs'
objective), the simulated iteration time of the plan's schedule, the speedup over one device (the fastest device
of the cluster running every micro-batch alone, forward + backward), whether the plan fits memory, and the
planner's CPU time. Goals checked in the summary:

1. antichain_dp's bottleneck is at most every baseline's on every case of identical devices;
2. simulated speedup of a straight pipeline (antichain_dp without replication) at 4 and 8 identical GPUs
   against the published 3.4x / 3.76x (Ju et al. 2024), with the bound from the largest indivisible op and
   the cheapest cut, and the ratio to that bound;
3. GroPipe against pure data parallelism and pure pipelining on ResNet-50 and VGG-16 at 8 devices;
4. planner time under 10 s for every zoo model at 8 devices.

Costs: the kernel graph hetpart compiles, CPU latencies from the shipped CPU predictor (unscaled, so the costs
do not depend on the host), GPU latencies from the analytic datasheet model of each preset, backward = 2 x
forward (assumed), links from the cluster presets: predictions, not measurements.

    python benchmarks/training_partition.py                       # writes benchmarks/results/training_partition*
    python benchmarks/training_partition.py --models resnet50 --devices 4 --microbatches 8 --name quick
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hetpart.errors import HetpartError
from hetpart.graph import OpGraph
from hetpart.training import Cluster, StagePlan, TrainCosts, get_method
from hetpart.training.common import GraphCuts, PlannerConfig, build_plan, topological_prefix_masks
from hetpart.training.schedule_search import search
from hetpart.training.schedules import simulate_plan

logger = logging.getLogger("benchmarks.training_partition")

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CPU_PREDICTOR = "predictors/data/cpu_default.json"
PUBLISHED = {4: 3.4, 8: 3.76}
BASELINES = ("uniform_ops", "uniform_params", "balance_time", "data_parallel")
# (label, method, extra options)
IDENTICAL_METHODS = [("uniform_ops", "uniform_ops", {}), ("uniform_params", "uniform_params", {}),
                     ("balance_time", "balance_time", {}), ("balance_time/gpipe", "balance_time", {"schedule": "gpipe"}),
                     ("data_parallel", "data_parallel", {}), ("pipedream_dp", "pipedream_dp", {}), ("antichain_dp", "antichain_dp", {}),
                     ("antichain_dp/straight", "antichain_dp", {"replication": False}),
                     ("antichain_dp/iteration", "antichain_dp", {"objective": "iteration"}),
                     ("gropipe", "gropipe", {})]
MIXED_METHODS = [("uniform_ops", "uniform_ops", {}), ("uniform_params", "uniform_params", {}),
                 ("balance_time", "balance_time", {}), ("data_parallel", "data_parallel", {}),
                 ("hetero", "hetero", {}), ("hetero/straight", "hetero", {"replication": False}),
                 ("hetero/iteration", "hetero", {"objective": "iteration"})]


def zoo_graphs(models: Sequence[str], batch: int, cpu_predictor: str) -> dict[str, tuple[OpGraph, dict]]:
    """Kernel graph + one CostTable per GPU preset (and the CPU column) for each model, built once per run."""
    from hetpart.driver.api import import_model
    from hetpart.driver.compiler import parse_devices
    from hetpart.threads import ensure_tvm_threads
    ensure_tvm_threads()
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.registry import load_cpu_predictor
    from tvm_passes.extract import extract_op_graph

    cpu = load_cpu_predictor(REPO / cpu_predictor, scale_to_host=False)
    out = {}
    for model in models:
        started = time.perf_counter()
        imported = import_model(model, batch=batch)
        graph = extract_op_graph(imported.mod, name=f"{model}-b{batch}",
                                 source_hash=imported.source_hash).kernel_graph()
        tables = {}
        for preset in ("a100", "t4"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tables[preset] = build_cost_table(graph, {"cpu": cpu, "gpu": AnalyticGpuModel(preset)},
                                                  parse_devices(f"cpu,gpu={preset}").devices)
        out[model] = (graph, tables)
        logger.info("prepared %s: %d kernels in %.1f s", model, graph.num_ops, time.perf_counter() - started)
    return out


def clusters(device_counts: Sequence[int]) -> list[tuple[str, Cluster]]:
    cases = []
    for n in device_counts:
        cases.append(("identical", Cluster.parse(f"gpu=a100x{n},link=pcie")))
    for n in device_counts:
        cases.append(("mixed", Cluster.parse(f"gpu=a100x{n // 2},gpu=t4x{n - n // 2}")))
    if 8 in device_counts:
        cases.append(("two-node", Cluster.parse("gpu=a100x8,link=pcie,per_node=4,inter=ethernet")))
    return cases


def single_device_us(costs: TrainCosts, cluster: Cluster, microbatches: int) -> tuple[float, str]:
    col = costs.preset_column(cluster.presets[0])
    return float((costs.forward_us[:, col] + costs.backward_us[:, col]).sum()) * microbatches, cluster.names[col]


def pipeline_bound(graph: OpGraph, costs: TrainCosts, cluster: Cluster, devices: int) -> dict[str, float]:
    """Steady-state speedup bound of a straight pipeline: total / max(total / W, largest op, cheapest cut)."""
    col = costs.preset_column(cluster.presets[0])
    per_op = costs.forward_us[:, col] + costs.backward_us[:, col]
    masks = topological_prefix_masks(graph.num_ops)[1:-1]
    from hetpart.training.antichain_dp import AntichainConfig, state_family
    family, _ = state_family(graph, AntichainConfig())
    inner = family[(family.sum(axis=1) > 0) & (family.sum(axis=1) < graph.num_ops)]
    cuts = GraphCuts(graph).cut_bytes(np.vstack([masks, inner]))
    link = cluster.intra_node_link
    cheapest_cut = float(link.transfer_us(cuts.min())) if devices > 1 and len(cuts) else 0.0
    total = float(per_op.sum())
    limit = max(total / devices, float(per_op.max()), cheapest_cut)
    return {"total_us": total, "largest_op_us": float(per_op.max()), "cheapest_cut_us": cheapest_cut,
            "speedup_bound": total / limit}


def run_case(model: str, graph: OpGraph, tables: dict, kind: str, cluster: Cluster, microbatches: int) -> dict:
    costs = TrainCosts.build(graph, tables, cluster)
    single, single_dev = single_device_us(costs, cluster, microbatches)
    row: dict[str, Any] = {"model": model, "kind": kind, "cluster": cluster.spec, "devices": cluster.size,
                           "microbatches": microbatches, "n_ops": graph.num_ops, "single_device_us": single,
                           "single_device": single_dev, "methods": {}}
    for label, method, extra in (IDENTICAL_METHODS if cluster.is_homogeneous else MIXED_METHODS):
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            plan = get_method(method)(graph, costs, cluster, {"microbatches": microbatches, **extra})
        except HetpartError as exc:       # a method that cannot plan this case is reported, not fatal
            row["methods"][label] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        row["methods"][label] = summarize(plan, single, time.thread_time() - cpu0, time.perf_counter() - wall0)
    if cluster.is_homogeneous:
        row["pipeline_bound"] = pipeline_bound(graph, costs, cluster, cluster.size)
    return row


def summarize(plan: StagePlan, single_us: float, cpu_s: float, wall_s: float) -> dict:
    return {"bottleneck_us": plan.bottleneck_us, "iteration_us": plan.iteration_us,
            "speedup": single_us / plan.iteration_us, "bubble_fraction": plan.bubble_fraction,
            "stages": plan.num_stages, "replicas": [s.replicas for s in plan.stages], "groups": plan.groups,
            "devices_used": len(plan.devices_used), "schedule": plan.schedule,
            "fits_memory": bool(plan.stats.get("fits_memory")), "states": plan.stats.get("states"),
            "peak_memory_gib": max(plan.peak_memory_bytes.values()) / 2**30, "planner_cpu_s": cpu_s,
            "planner_wall_s": wall_s, "notes": list(plan.notes),
            **({"gropipe_candidates": plan.stats["candidates"]} if plan.method == "gropipe" else {})}


def interleaved_plan(graph: OpGraph, tables: dict, cluster: Cluster, microbatches: int, v: int = 2) -> StagePlan:
    """v stages per device: the straight DP on v x W virtual devices, stage s then placed on device s % W."""
    preset = cluster.presets[0]
    virtual = Cluster.parse(f"gpu={preset}x{v * cluster.size},link={cluster.intra_node_link.name}")
    vcosts = TrainCosts.build(graph, tables, virtual)
    vplan = get_method("antichain_dp")(graph, vcosts, virtual, {"microbatches": microbatches, "replication": False,
                                                                "allow_fewer_devices": False})
    costs = TrainCosts.build(graph, tables, cluster)
    config = PlannerConfig(microbatches=microbatches, schedule="interleaved_1f1b")
    devices = [(cluster.names[k % cluster.size],) for k in range(vplan.num_stages)]
    return build_plan(graph, costs, cluster, [s.op_ids for s in vplan.stages], devices, config,
                      "antichain_dp/interleaved", started=time.perf_counter())


def schedule_comparison(model: str, graph: OpGraph, tables: dict, cluster: Cluster, microbatches: int) -> dict:
    """One straight-pipeline split under every schedule, the repetend search, and an interleaved split."""
    costs = TrainCosts.build(graph, tables, cluster)
    plan = get_method("antichain_dp")(graph, costs, cluster, {"microbatches": microbatches, "replication": False,
                                                              "allow_fewer_devices": False})
    single, _ = single_device_us(costs, cluster, microbatches)
    out: dict[str, Any] = {"model": model, "cluster": cluster.spec, "microbatches": microbatches, "schedules": {}}
    for schedule in ("gpipe", "1f1b", "zero_bubble"):
        r = simulate_plan(plan, schedule=schedule)
        out["schedules"][schedule] = {"iteration_us": r.iteration_us, "bubble_fraction": r.bubble_fraction,
                                      "speedup": single / r.iteration_us,
                                      "peak_memory_gib": max(r.peak_memory_bytes.values()) / 2**30}
    t0 = time.thread_time()
    found = search(plan)
    out["schedules"]["tessel"] = {"iteration_us": found.result.iteration_us,
                                  "bubble_fraction": found.result.bubble_fraction,
                                  "speedup": single / found.result.iteration_us,
                                  "peak_memory_gib": max(found.result.peak_memory_bytes.values()) / 2**30,
                                  "period_us": found.repetend.period_us,
                                  "repetend_microbatches": max(found.repetend.offsets) + 1,
                                  "candidates": found.candidates, "search_cpu_s": time.thread_time() - t0}
    if microbatches % cluster.size == 0:
        inter = interleaved_plan(graph, tables, cluster, microbatches)
        out["schedules"]["interleaved_1f1b (2 stages/device)"] = {
            "iteration_us": inter.iteration_us, "bubble_fraction": inter.bubble_fraction,
            "speedup": single / inter.iteration_us,
            "peak_memory_gib": max(inter.peak_memory_bytes.values()) / 2**30}
    out["plan"] = plan.to_dict()
    return out


def gantt_png(plan: StagePlan, path: Path, title: str) -> int:
    """Draw the simulated schedule of ``plan`` (one row per device) into a small PNG; returns its size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    result = simulate_plan(plan, keep_events=True)
    devices = list(plan.devices_used)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(devices) + 1.2), dpi=90)
    colours = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
    for e in result.events:
        y = devices.index(e.device)
        ax.barh(y, (e.end_us - e.start_us) / 1e3, left=e.start_us / 1e3, color=colours[e.task.kind],
                edgecolor="white", linewidth=0.4)
        if e.end_us - e.start_us > result.iteration_us / 60:
            ax.text((e.start_us + e.end_us) / 2e3, y, str(e.task.microbatch), ha="center", va="center",
                    fontsize=6, color="white")
    for stage, start, end in result.allreduce_events:
        for d in plan.stages[stage].devices:
            ax.barh(devices.index(d), (end - start) / 1e3, left=start / 1e3, height=0.25, color="#8172B2")
    stage_of = {d: s.index for s in plan.stages for d in s.devices}
    ax.set_yticks(range(len(devices)), [f"{d} (stage {stage_of[d]})" for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()][:2]
    ax.legend(handles, ["forward", "backward"], loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.stat().st_size


def summary(rows: list[dict], comparisons: list[dict]) -> dict:
    s: dict[str, Any] = {}
    identical = [r for r in rows if r["kind"] == "identical"]
    worse = []
    for r in identical:
        a = r["methods"]["antichain_dp"]["bottleneck_us"]
        for b in BASELINES + ("pipedream_dp",):
            if r["methods"][b].get("bottleneck_us", float("inf")) < a * (1 - 1e-9):
                worse.append(f"{r['model']} x{r['devices']} n={r['microbatches']} vs {b}")
    s["goal1_antichain_bottleneck_le_baselines"] = {"cases": len(identical), "violations": worse,
                                                   "met": not worse}
    speed = {}
    for r in identical:
        if r["devices"] in PUBLISHED:
            m = r["methods"]
            speed.setdefault(f"x{r['devices']} n={r['microbatches']}", {})[r["model"]] = {
                "straight": round(m["antichain_dp/straight"]["speedup"], 2),
                "bound": round(r["pipeline_bound"]["speedup_bound"], 2),
                "ratio_to_bound": round(m["antichain_dp/straight"]["speedup"] / r["pipeline_bound"]["speedup_bound"],
                                        3),
                "with_replication": round(m["antichain_dp"]["speedup"], 2),
                "best_iteration_objective": round(m["antichain_dp/iteration"]["speedup"], 2)}
    s["goal2_speedup_vs_published"] = {"published": PUBLISHED, "cases": speed}
    gro = {}
    for r in rows:
        if r["model"] in ("resnet50", "vgg16") and r["devices"] == 8 and r["kind"] in ("identical", "two-node"):
            m = r["methods"]
            g, dp, pipe = m["gropipe"], m["data_parallel"], m["balance_time/gpipe"]
            gro[f"{r['model']} {r['kind']} n={r['microbatches']}"] = {
                "gropipe_shape": f"{g['groups']}x{g['stages']}", "gropipe_speedup": round(g["speedup"], 2),
                "data_parallel_speedup": round(dp["speedup"], 2), "torchgpipe_speedup": round(pipe["speedup"], 2),
                "vs_dp_percent": round(100 * (g["speedup"] / dp["speedup"] - 1), 1),
                "vs_torchgpipe_percent": round(100 * (g["speedup"] / pipe["speedup"] - 1), 1)}
    s["goal3_gropipe"] = {"published_percent": {"resnet50": {"vs_dp": 59.6, "vs_torchgpipe": 14.3},
                                                "vgg16": {"vs_dp": 111.2, "vs_torchgpipe": 30.9}}, "cases": gro}
    slow = {}
    for r in rows:
        if r["devices"] == 8:
            for label, m in r["methods"].items():
                if "planner_cpu_s" in m:
                    slow[r["model"]] = max(slow.get(r["model"], 0.0), m["planner_cpu_s"])
    s["goal4_planner_under_10s_at_8_devices"] = {"max_cpu_s_per_model": {k: round(v, 2) for k, v in slow.items()},
                                                 "met": all(v < 10 for v in slow.values())}
    s["schedules"] = {f"{c['model']} {c['cluster']} n={c['microbatches']}":
                      {k: round(v["speedup"], 2) for k, v in c["schedules"].items()} for c in comparisons}
    return s


def goals_markdown(summ: dict) -> list[str]:
    g1, g4 = summ["goal1_antichain_bottleneck_le_baselines"], summ["goal4_planner_under_10s_at_8_devices"]
    out = [f"1. antichain_dp's bottleneck <= every baseline's (uniform_ops, uniform_params, balance_time, "
           f"data_parallel, pipedream_dp): {'met' if g1['met'] else 'MISSED'} on {g1['cases']} identical-device "
           f"cases" + (f"; violations: {g1['violations']}" if g1["violations"] else "") + ".",
           "2. Straight-pipeline speedup (antichain_dp without replication, 1F1B) against the published 3.4x on 4 "
           "and 3.76x on 8 GPUs, the steady-state bound from the largest kernel and the cheapest cut, and the ratio:"]
    for case, models in summ["goal2_speedup_vs_published"]["cases"].items():
        devices = int(case.split()[0][1:])
        out.append(f"   - {case} (published {PUBLISHED[devices]}x): " + "; ".join(
            f"{m} {v['straight']}x (bound {v['bound']}, ratio {v['ratio_to_bound']}; with replication "
            f"{v['with_replication']}x, iteration objective {v['best_iteration_objective']}x)"
            for m, v in models.items()))
    out.append("3. GroPipe at 8 devices against data parallelism (DDP buckets) and a torchgpipe pipeline "
               "(balance_time, GPipe); published: ResNet-50 +59.6% / +14.3%, VGG-16 +111.2% / +30.9%:")
    for case, v in summ["goal3_gropipe"]["cases"].items():
        out.append(f"   - {case}: GroPipe {v['gropipe_shape']} (G x P) {v['gropipe_speedup']}x, DP "
                   f"{v['data_parallel_speedup']}x ({v['vs_dp_percent']:+.1f}%), torchgpipe "
                   f"{v['torchgpipe_speedup']}x ({v['vs_torchgpipe_percent']:+.1f}%)")
    out.append(f"4. Planner CPU time < 10 s for every model at 8 devices: {'met' if g4['met'] else 'MISSED'} "
               f"(max per model: {g4['max_cpu_s_per_model']}).")
    return out


def markdown(rows: list[dict], comparisons: list[dict], summ: dict, command: str, note: str) -> str:
    lines = ["# Training stage partitioning", "", f"Command: `{command}`", ""] + ([note, ""] if note else []) + [
        "## Goals", ""] + goals_markdown(summ) + ["", "## Cases", "", 
        "Costs: kernel graphs of the zoo at micro-batch size 8, CPU latencies from the shipped CPU predictor "
        "(unscaled), GPU latencies from the analytic datasheet model (A100 40GB PCIe, T4), backward = 2 x forward "
        "(assumed, not measured), Adam state, links from the cluster presets (PCIe, 10 GbE between nodes). "
        "Every number is a prediction of hetpart's cost model and schedule simulator, not a measured run.", "",
        "Speedup = (micro-batches x forward + backward of the whole model on one device of the cluster's first "
        "preset) / simulated iteration time. Bottleneck = steady-state time per micro-batch (the DPs' objective). "
        "Planner time is CPU time of the planning call.", ""]
    for r in rows:
        lines += [f"### {r['model']} ({r['n_ops']} kernels), `{r['cluster']}` ({r['kind']}), "
                  f"{r['microbatches']} micro-batches", "",
                  "| method | stages x replicas | bottleneck ms | iteration ms | speedup | bubble | fits | planner s |",
                  "|---|---|---|---|---|---|---|---|"]
        for label, m in r["methods"].items():
            if "error" in m:
                lines.append(f"| {label} | {m['error'][:90]} | | | | | | |")
                continue
            lines.append(f"| {label} | {m['stages']} x {m['replicas'] if len(set(m['replicas'])) > 1 else m['replicas'][0]}"
                         f"{' (G=' + str(m['groups']) + ')' if m['groups'] > 1 else ''} | {m['bottleneck_us'] / 1e3:.2f} | "
                         f"{m['iteration_us'] / 1e3:.1f} | {m['speedup']:.2f} | {m['bubble_fraction']:.2f} | "
                         f"{'yes' if m['fits_memory'] else 'no'} | {m['planner_cpu_s']:.2f} |")
        if "pipeline_bound" in r:
            b = r["pipeline_bound"]
            lines.append(f"\nStraight-pipeline bound: largest op {b['largest_op_us'] / 1e3:.2f} ms, cheapest cut "
                         f"{b['cheapest_cut_us'] / 1e3:.3f} ms, steady-state speedup <= {b['speedup_bound']:.2f}.")
        lines.append("")
    lines += ["## Schedules on one straight-pipeline split", "",
              "| case | " + " | ".join(comparisons[0]["schedules"]) + " |" if comparisons else "",
              "|---|" + "---|" * (len(comparisons[0]["schedules"]) if comparisons else 0)]
    for c in comparisons:
        lines.append(f"| {c['model']} `{c['cluster']}` n={c['microbatches']} | " + " | ".join(
            f"{v['speedup']:.2f}x ({v['peak_memory_gib']:.2f} GiB)" for v in c["schedules"].values()) + " |")
    lines += ["", "## Summary (all figures)", "", "```json", json.dumps(summ, indent=1), "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="vgg16,resnet50,googlenet,densenet121,bert_small,lstm_lm")
    parser.add_argument("--devices", default="2,4,8")
    parser.add_argument("--microbatches", default="8,32")
    parser.add_argument("--batch", type=int, default=8, help="micro-batch size the graphs are built for")
    parser.add_argument("--cpu-predictor", default=DEFAULT_CPU_PREDICTOR)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="training_partition")
    parser.add_argument("--gantt", type=Path, default=REPO / "docs" / "training_gantt.png")
    parser.add_argument("--note", default="")
    parser.add_argument("--markdown-only", action="store_true",
                        help="rewrite the README from the JSON of an earlier run (no planning)")
    args = parser.parse_args(argv)
    if args.markdown_only:
        data = json.loads((args.out / f"{args.name}.json").read_text())
        (args.out / args.name / "README.md").write_text(markdown(data["rows"], data["schedule_comparisons"],
                                                                 data["summary"], data["command"], data["note"]))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("hetpart").setLevel(logging.WARNING)
    models = args.models.split(",")
    graphs = zoo_graphs(models, args.batch, args.cpu_predictor)
    device_counts = [int(v) for v in args.devices.split(",")]
    rows, comparisons = [], []
    for model, (graph, tables) in graphs.items():
        for kind, cluster in clusters(device_counts):
            for n in (int(v) for v in args.microbatches.split(",")):
                started = time.perf_counter()
                rows.append(run_case(model, graph, tables, kind, cluster, n))
                logger.info("%s %s n=%d: %.1f s", model, cluster.spec, n, time.perf_counter() - started)
        for n_dev in device_counts:
            if n_dev in (4, 8):
                comparisons.append(schedule_comparison(model, graph, tables, Cluster.parse(f"gpu=a100x{n_dev},link=pcie"),
                                                       max(int(v) for v in args.microbatches.split(","))))
    if "resnet50" in graphs and args.gantt:
        graph, tables = graphs["resnet50"]
        cluster = Cluster.parse("gpu=a100x4,link=pcie")
        plan = get_method("antichain_dp")(graph, TrainCosts.build(graph, tables, cluster), cluster,
                                          {"microbatches": 8, "replication": False, "allow_fewer_devices": False})
        size = gantt_png(plan, args.gantt, f"ResNet-50, 4 x A100 (PCIe), antichain_dp straight pipeline, 1F1B, "
                                           f"8 micro-batches: {plan.iteration_us / 1e3:.1f} ms")
        (args.out / args.name).mkdir(parents=True, exist_ok=True)
        (args.out / args.name / "gantt_plan.json").write_text(plan.to_json(indent=1))
        logger.info("wrote %s (%d bytes)", args.gantt, size)
    summ = summary(rows, comparisons)
    command = "python benchmarks/training_partition.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    (args.out / args.name).mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(
        {"command": command, "note": args.note, "machine": platform.platform(), "summary": summ, "rows": rows,
         "schedule_comparisons": comparisons}, indent=1, default=str))
    (args.out / args.name / "README.md").write_text(markdown(rows, comparisons, summ, command, args.note))
    logger.info("%s", json.dumps(summ, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
