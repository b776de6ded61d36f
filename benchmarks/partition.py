"""Partitioner benchmark: simulated makespan of every method, its ratio to the MILP optimum, planner time.

Methods: the baselines (all_cpu, all_gpu, greedy, heft), ``cp_greedy`` (the critical-path greedy correction
from its own greedy start, with seeded kicks), ``portfolio`` (every baseline's plan and cp_greedy's start,
each corrected by cp_greedy's correction, best kept: never worse than a baseline by construction) and
``milp`` (graphs up to ``--milp-max-ops``). cp_greedy and portfolio get the same default simulation budget.

The reference of each case is the MILP optimum when HiGHS proves it within ``--milp-time-limit``, else the
best lower bound (HiGHS' dual bound or the combinatorial bound of ``hetpart.partition.milp.lower_bound_us``);
graphs above ``--milp-max-ops`` get only the combinatorial bound, so their ratios are upper bounds on the
true ratio. The summary states the scope of every optimality claim: how many cases have a proven optimum,
their sizes in ops, and how many of those optima are single-device plans (all on the GPU or all on the CPU),
where the baselines are optimal too.

Cases are ``(name, OpGraph, CostTable)`` triples: ``run_benchmark`` takes any list of them.
``--synthetic-only`` runs the seeded synthetic DAGs of ``hetpart.partition.synthetic`` (layered, branchy,
series-parallel; random per-op costs on the datasheet P2200 preset, GPU speed-ups scaled by 1 and by 0.1 for
a weak GPU). Without it, the zoo models: the kernel graph hetpart compiles, CPU costs from a shipped CPU
latency predictor (fitted to measured kernel times; ``--cpu-predictor``, used unscaled so that the costs do not
depend on the benchmarking host) and GPU costs from the analytic datasheet model of each preset
(``predictors.analytic.AnalyticGpuModel``).

    python benchmarks/partition.py --synthetic-only            # writes benchmarks/results/partition.{json,md}
    python benchmarks/partition.py --name partition_zoo        # zoo x presets x batch 1, 8

Planner times: the table and the summary use CPU (process) time of the planning call, because the machine is
shared and wall time includes waiting for a core; wall time is kept in the JSON. Compare within one run.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import shlex
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
BASELINES = ("all_cpu", "all_gpu", "greedy", "heft")
HEURISTICS = BASELINES + ("cp_greedy", "portfolio")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CPU_PREDICTOR = "predictors/data/cpu_default.json"      # relative to the repository
OPTIMAL_REL_TOL = 1e-6          # a makespan within this of the proven optimum counts as optimal
SYNTHETIC_COSTS = ("Costs: synthetic (seeded random per-op latencies from `hetpart.partition.synthetic`, datasheet "
                   "GPU preset and links), not measurements.")
ZOO_COSTS = ("Costs: CPU latencies from the shipped CPU latency predictor `{predictor}` (fitted to measured kernel "
             "times; used as shipped, not scaled to the benchmarking host), GPU latencies from the analytic datasheet "
             "model of each preset (`predictors.analytic.AnalyticGpuModel`), copies from the preset's link model: "
             "predictions, not measurements of these runs.")


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


def _steps(r: dict) -> str:
    """cp_greedy's accepted device moves and re-orders, and kicks that improved / kicks made."""
    st = r.get("stats", {})
    if "moves" not in st:
        return "—"
    return f"{st['moves']} / {st['reorders']} / {st['perturbations_improved']} of {st['perturbations']}"


def _makespans(row: dict, methods: Sequence[str]) -> list[float]:
    return [row["methods"][m]["makespan_us"] for m in methods if "makespan_us" in row["methods"].get(m, {})]


def _geomean(values: Sequence[float]) -> float | None:
    return float(math.exp(sum(math.log(v) for v in values) / len(values))) if values else None


def _compare(rows: list[dict], method: str, other: Sequence[str]) -> dict[str, Any]:
    """How often ``method`` is better / equal / worse than the best of ``other``, and its worst ratio to it."""
    better = equal = worse = 0
    worst = 0.0
    for r in rows:
        ours, theirs = _makespans(r, [method]), _makespans(r, other)
        if not ours or not theirs:
            continue
        ratio = ours[0] / min(theirs)
        worst = max(worst, ratio)
        if ratio < 1 - 1e-9:
            better += 1
        elif ratio > 1 + 1e-9:
            worse += 1
        else:
            equal += 1
    return {"better": better, "equal": equal, "worse": worse, "max_ratio": worst}


def summary(rows: list[dict]) -> dict[str, Any]:
    proven = [r for r in rows if r["reference"] == "optimum"]

    def optimal(r: dict, method: str) -> bool:
        return bool(_makespans(r, [method])) and _makespans(r, [method])[0] <= r["reference_us"] * (1 + OPTIMAL_REL_TOL)

    single = [r for r in proven if len(r["methods"]["milp"]["devices_used"]) == 1]
    trivial = [r for r in proven if r in single or optimal(r, "all_cpu") or optimal(r, "all_gpu")]
    nontrivial = [r for r in proven if r not in trivial]
    out: dict[str, Any] = {
        "cases": len(rows),
        "milp_run": sum(1 for r in rows if "milp" in r["methods"]),
        "milp_proofs": len(proven),
        "milp_proof_sizes_ops": sorted({r["n_ops"] for r in proven}),
        "milp_proofs_optimum_all_gpu": sum(1 for r in single if r["methods"]["milp"]["devices_used"] != ["cpu"]),
        "milp_proofs_optimum_all_cpu": sum(1 for r in single if r["methods"]["milp"]["devices_used"] == ["cpu"]),
        "milp_proofs_matched_by_all_cpu_or_all_gpu": len(trivial),
        "milp_proofs_nontrivial": len(nontrivial),
        "milp_proofs_nontrivial_sizes_ops": sorted({r["n_ops"] for r in nontrivial}),
        "milp_returned": {k: sum(1 for r in rows if r["methods"].get("milp", {}).get("stats", {}).get("returned") == k)
                          for k in sorted({r["methods"]["milp"].get("stats", {}).get("returned", "error")
                                           for r in rows if "milp" in r["methods"]})},
    }
    for method in ("cp_greedy", "portfolio", "heft"):
        ratios = [r["methods"][method]["ratio"] for r in proven]
        hard = [r["methods"][method]["ratio"] for r in nontrivial]
        out[f"{method}_max_ratio_to_proven_optimum"] = max(ratios) if ratios else None
        out[f"{method}_max_ratio_to_nontrivial_optimum"] = max(hard) if hard else None
        out[f"{method}_optimal_in_proven_cases"] = sum(1 for r in proven if optimal(r, method))
        out[f"{method}_within_1.02_of_proven_optimum"] = sum(1 for x in ratios if x <= 1.02)
        out[f"{method}_geomean_ratio_to_reference"] = _geomean(
            [r["methods"][method]["ratio"] for r in rows if "ratio" in r["methods"][method]])
    out["cp_greedy_vs_best_baseline"] = _compare(rows, "cp_greedy", BASELINES)
    out["portfolio_vs_best_baseline"] = _compare(rows, "portfolio", BASELINES)
    out["portfolio_never_worse_than_baselines"] = out["portfolio_vs_best_baseline"]["worse"] == 0
    out["portfolio_vs_cp_greedy"] = _compare(rows, "portfolio", ["cp_greedy"])
    cp_stats = [r["methods"]["cp_greedy"].get("stats", {}) for r in rows]
    out["cp_greedy_cases_with_moves"] = sum(1 for st in cp_stats if st.get("moves", 0) + st.get("reorders", 0) > 0)
    out["cp_greedy_cases_improved_by_kicks"] = sum(1 for st in cp_stats if st.get("perturbations_improved", 0) > 0)
    out["cp_greedy_stopped"] = {k: sum(1 for st in cp_stats if st.get("stopped") == k)
                                for k in sorted({st.get("stopped") for st in cp_stats if st.get("stopped")})}
    for method in ("cp_greedy", "portfolio", "heft"):
        for n in sorted({r["n_ops"] for r in rows}):
            cpu = [r["methods"][method]["cpu_s"] for r in rows if r["n_ops"] == n and "cpu_s" in r["methods"][method]]
            out[f"{method}_max_cpu_s_at_{n}_ops"] = max(cpu) if cpu else None
    return out


def scope(summ: dict[str, Any]) -> str:
    """The optimality claims' scope in one paragraph."""
    sizes = summ["milp_proof_sizes_ops"]
    hard = summ["milp_proofs_nontrivial_sizes_ops"]
    text = (f"MILP ran on {summ['milp_run']} of {summ['cases']} cases and proved the optimum in "
            f"{summ['milp_proofs']}" + (f" (graphs of {', '.join(map(str, sizes))} ops)" if sizes else "") + ". "
            f"Of these optima, {summ['milp_proofs_optimum_all_gpu']} put every op on the GPU and "
            f"{summ['milp_proofs_optimum_all_cpu']} every op on the CPU; "
            f"{summ['milp_proofs_matched_by_all_cpu_or_all_gpu']} are single-device plans or are matched by all_cpu "
            "or all_gpu, so only "
            f"{summ['milp_proofs_nontrivial']} proofs ({', '.join(map(str, hard)) or 'no'} ops) test a split. "
            "Every other ratio is against a lower bound and overstates the gap. The plan milp returned, by source: "
            + ", ".join(f"{k} {v}" for k, v in summ["milp_returned"].items()) + ".")
    return text


def markdown(rows: list[dict], summ: dict[str, Any], command: str, costs_note: str = SYNTHETIC_COSTS,
             note: str = "") -> str:
    methods = list(HEURISTICS) + ["milp"]
    lines = ["# Partitioner benchmark", "", f"Command: `{command}`", ""] + ([note, ""] if note else []) + [
             "Cells: makespan / reference (planner CPU time, process time of the planning call; wall time is in "
             "the JSON). Reference = MILP optimum when proven, else the best lower bound (ratios against a bound "
             "overstate the true gap). cp_greedy steps: device moves / re-orders accepted on the way to its plan / "
             "kicks that improved of kicks made. " + costs_note, "",
             "## Scope of the optimality claims", "", scope(summ), "",
             "| case | ops | reference | " + " | ".join(methods) + " | cp_greedy steps |",
             "|---|---:|---|" + "---:|" * (len(methods) + 1)]
    for r in rows:
        lines.append(f"| {r['case']} | {r['n_ops']} | {r['reference']} | "
                     + " | ".join(_cell(r["methods"].get(m)) for m in methods)
                     + f" | {_steps(r['methods']['cp_greedy'])} |")
    lines += ["", "## Summary", ""] + [f"- {k}: {v}" for k, v in summ.items()]
    return "\n".join(lines) + "\n"


def zoo_cases(models: Sequence[str], presets: Sequence[str], batches: Sequence[int],
              cpu_predictor: str | Path = DEFAULT_CPU_PREDICTOR) -> list[Case]:
    """Zoo models at their default input size: the kernel graph hetpart compiles, the shipped CPU predictor
    (fitted to measured kernel times; used as shipped, not scaled to this host, so that the costs do not depend
    on the machine running the benchmark) and the analytic datasheet model of each GPU preset."""
    from hetpart.driver.api import import_model
    from hetpart.driver.compiler import parse_devices
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.registry import load_cpu_predictor
    from tvm_passes.extract import extract_op_graph

    cpu = load_cpu_predictor(REPO / cpu_predictor, scale_to_host=False)
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
    parser.add_argument("--cpu-predictor", default=DEFAULT_CPU_PREDICTOR,
                        help="CPU predictor file for the zoo cases, relative to the repository (used unscaled)")
    parser.add_argument("--name", default="partition", help="result file stem in --out")
    parser.add_argument("--note", default="", help="a sentence written under the command in the result files "
                        "(e.g. why a reduced set was run)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("hetpart").setLevel(logging.WARNING)
    if args.synthetic_only:
        cases = synthetic_cases([int(s) for s in args.sizes.split(",")])
    else:
        cases = zoo_cases(args.models.split(","), args.presets.split(","), [int(b) for b in args.batches.split(",")],
                          args.cpu_predictor)
    rows = run_benchmark(cases, milp_max_ops=args.milp_max_ops, milp_time_limit_s=args.milp_time_limit)
    summ = summary(rows)
    command = "python benchmarks/partition.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                                                 else argv))
    costs_note = SYNTHETIC_COSTS if args.synthetic_only else ZOO_COSTS.format(predictor=args.cpu_predictor)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(
        {"command": command, "note": args.note, "machine": platform.platform(), "costs": costs_note,
         "summary": summ, "rows": rows}, indent=1, default=str))
    (args.out / f"{args.name}.md").write_text(markdown(rows, summ, command, costs_note, args.note))
    logger.info("%s", json.dumps(summ, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
