"""RNN time-slice pipeline benchmark: ``timeslice`` against single devices, cp_greedy and request load balancing.

Models: stacked ONNX LSTM / GRU / RNN nodes (``Squeeze`` between layers, as torch exports them) built in code with
seeded random weights, input ``x[seq, batch, hidden]``, imported and unrolled by hetpart's frontend; the grid
varies one factor at a time around a base configuration (cell, layers, hidden size, sequence length, batch).
Costs as ``hetpart compile`` builds them, on the kernel graph: the shipped CPU predictor (``--cpu-predictor``, used
unscaled so that the figures do not depend on the host running the benchmark) and the analytic datasheet model of
each GPU preset, with the preset's link. Every figure is simulated (``hetpart.simulate_requests``: one worker per
device, whole segments, ``--overhead-us`` per segment on every device), none is measured.

Per configuration, GPU preset and request count R:

* ``timeslice`` (``config.requests = R``, ``slice_steps`` 1 unless ``--slice-steps``), ``all_cpu``, ``all_gpu`` and
  ``cp_greedy`` (one request's plan, replicated per request), scored with R requests in flight;
* request-level load balancing (``hetpart.partition.request_balance``): each whole request on the device that frees
  first;
* the two-device limit: the sum of the two devices' throughputs running whole requests back to back;
* ``timeslice_shared``: timeslice planned with ``cross_device_sharing`` (its candidates scored with that runtime
  model) and simulated with ``RuntimeModel(..., cross_device_sharing=True)``: a free device's worker runs a ready
  segment planned for the other, busy device when it is predicted to end it sooner (``hetpart/cross_sharing.py``;
  the task runtime then needs every segment built for every device). The goals are computed for it as for
  ``timeslice``, against the same baselines and request balancing (simulated without sharing).

Throughput is R / makespan (requests per second over the whole batch). Latencies are per request, completion minus
admission, in two admission regimes: all R requests waiting at t = 0 (``batch``) and at most two in flight, one per
device (``closed``: a completion admits the next). The ablation (``--ablation``) plans and simulates the static
``timeslice`` only.

    python benchmarks/rnn_pipeline.py        # writes benchmarks/results/rnn_pipeline.json and rnn_pipeline/README.md

``--measured``: the timeslice plan run by the task runtime on two one-core CPU devices instead
(``rnn_pipeline_measured.py``; ``--measured --help``); each keeps the other's section of the README.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import platform
import shlex
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hetpart.costs import CostTable
from hetpart.graph import OpGraph
from hetpart.paths import cache_root
from hetpart.partition import partition
from hetpart.partition.request_balance import simulate_request_balance, two_device_limit_per_s
from hetpart.partition.slices import build_slice_grid
from hetpart.partition.timeslice import slice_segmentation
from hetpart.plan import Plan
from hetpart.simulate_requests import RuntimeModel, simulate_requests

logger = logging.getLogger("benchmarks.rnn_pipeline")

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CPU_PREDICTOR = "predictors/data/cpu_default.json"
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
PRESETS = ("p2200", "t4", "a100", "rtx3090", "jetson-orin")
OVERHEAD_RECORD = RESULTS / "dispatch_overhead" / "dispatch_overhead.json"   # benchmarks/dispatch_overhead.py
GAIN_PUBLISHED = (0.14, 0.38)
BASELINES = ("all_cpu", "all_gpu", "cp_greedy")


def measured_overhead_us() -> float:
    """The task runtime's cost per segment, as ``benchmarks/dispatch_overhead.py`` last measured it (rounded to
    0.1 us); rerun that benchmark on the host whose runtime the sweep should model."""
    try:
        return round(float(json.loads(OVERHEAD_RECORD.read_text())["overhead_per_segment_us"]), 1)
    except (OSError, KeyError, ValueError) as err:
        raise SystemExit(f"no measured overhead per segment in {OVERHEAD_RECORD} ({err}); run "
                         "benchmarks/dispatch_overhead.py first or pass --overhead-us") from err


@dataclass(frozen=True)
class RnnConfig:
    cell: str = "LSTM"
    layers: int = 2
    hidden: int = 512
    seq: int = 32
    batch: int = 1

    @property
    def name(self) -> str:
        return f"{self.cell}-L{self.layers}-H{self.hidden}-S{self.seq}-B{self.batch}"


def one_factor_grid(base: RnnConfig) -> list[RnnConfig]:
    """The base configuration and every variation of one factor (cell, layers, hidden, sequence, batch)."""
    grid = [base]
    for field, values in (("cell", ("GRU", "RNN")), ("layers", (1, 4)), ("hidden", (128, 1024)),
                          ("seq", (16, 128)), ("batch", (8, 32))):
        grid += [replace(base, **{field: v}) for v in values if v != getattr(base, field)]
    return grid


def build_onnx(config: RnnConfig, path: Path, seed: int = 0) -> Path:
    """Stacked ONNX ``config.cell`` nodes, uniform weights in +-1/sqrt(hidden); GRU with linear_before_reset=1."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    h, gates, bound = config.hidden, GATES[config.cell], 1.0 / np.sqrt(config.hidden)
    inits, nodes, x = [], [], "x"
    for layer in range(config.layers):
        def init(name: str, value: np.ndarray) -> str:
            inits.append(numpy_helper.from_array(value, f"{name}{layer}"))
            return f"{name}{layer}"

        def rand(*shape: int) -> np.ndarray:
            return rng.uniform(-bound, bound, shape).astype(np.float32)

        attrs: dict[str, Any] = {"hidden_size": h}
        if config.cell == "GRU":
            attrs["linear_before_reset"] = 1
        weights = [init("W", rand(1, gates * h, h)), init("R", rand(1, gates * h, h)),
                   init("B", rand(1, 2 * gates * h))]
        nodes.append(helper.make_node(config.cell, [x, *weights], [f"Y{layer}"], name=f"{config.cell.lower()}{layer}",
                                      **attrs))
        nodes.append(helper.make_node("Squeeze", [f"Y{layer}", init("axis", np.array([1], np.int64))], [f"S{layer}"]))
        x = f"S{layer}"
    shape = [config.seq, config.batch, h]
    graph = helper.make_graph(nodes, config.name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path


def kernel_graph(config: RnnConfig, work: Path, slice_steps: int | None) -> OpGraph:
    """The kernel graph hetpart plans (per-slice input projections when ``slice_steps`` is given)."""
    from hetpart.driver.api import import_model
    from tvm_passes.extract import extract_op_graph
    from tvm_passes.rnn import RnnImportOptions

    options = None if slice_steps is None else RnnImportOptions("per_slice", slice_steps)
    imported = import_model(build_onnx(config, work / f"{config.name}.onnx"), rnn_options=options)
    return extract_op_graph(imported.mod, name=config.name, source_hash=imported.source_hash).kernel_graph()


def cost_tables(graph: OpGraph, presets: Sequence[str], cpu_predictor: Path) -> dict[str, CostTable]:
    from hetpart.driver.device_choice import parse_devices
    from predictors.analytic import AnalyticGpuModel
    from predictors.costs import build_cost_table
    from predictors.registry import load_cpu_predictor

    cpu = load_cpu_predictor(cpu_predictor, scale_to_host=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # extrapolation warnings are summarised by the predictor
        return {p: build_cost_table(graph, {"cpu": cpu, "gpu": AnalyticGpuModel(p)},
                                    parse_devices(f"cpu,gpu={p}").devices) for p in presets}


def _figures(makespan_us: float, latency_us: Sequence[float], n: int) -> dict[str, float]:
    latency = np.asarray(latency_us)
    return {"throughput_per_s": n / makespan_us * 1e6, "makespan_us": makespan_us,
            "p50_us": float(np.percentile(latency, 50)), "p99_us": float(np.percentile(latency, 99))}


def plan_figures(graph: OpGraph, costs: CostTable, plan: Plan, n: int, runtime: RuntimeModel) -> dict[str, Any]:
    segmentation = None
    if plan.stats.get("segments") == "slices":       # a timeslice plan simulated with one segment per task
        segmentation = slice_segmentation(graph, plan, build_slice_grid(graph, int(plan.stats["slice_steps"])))
    batch = simulate_requests(graph, costs, plan, n_requests=n, runtime=runtime, segmentation=segmentation)
    closed = simulate_requests(graph, costs, plan, n_requests=n, max_in_flight=min(2, n), runtime=runtime,
                               segmentation=segmentation)
    links: dict[str, float] = {}
    for e in batch.events:
        if e.kind == "copy":
            links[e.resource] = links.get(e.resource, 0.0) + (e.end_us - e.start_us) / n
    return {"batch": _figures(batch.makespan_us, batch.latency_us, n),
            "closed": _figures(closed.makespan_us, closed.latency_us, n), "link_us_per_request": links}


def run_case(graph: OpGraph, costs: CostTable, n: int, runtime: RuntimeModel, slice_steps: int,
             segments: str = "runtime", baselines: bool = True) -> dict[str, Any]:
    """``timeslice`` (static placement); with ``baselines`` also all_cpu, all_gpu, cp_greedy, request balancing,
    the two-device limit and ``timeslice_shared`` (planned and simulated with cross-device sharing)."""
    overheads = dict(runtime.dispatch_overhead_us_by_device)
    config = {"requests": n, "slice_steps": slice_steps, "dispatch_overhead_us_by_device": overheads,
              "timeslice_segments": segments}
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # single-device plans are degenerate on purpose
        plan = partition(graph, costs, "timeslice", config)
        planner_cpu_s = time.process_time() - started
        plans = {m: partition(graph, costs, m, config) for m in BASELINES} if baselines else {}
    row: dict[str, Any] = {"timeslice": plan_figures(graph, costs, plan, n, runtime)}
    row["timeslice"].update(chosen=plan.stats["chosen"], planner_cpu_s=planner_cpu_s, segments=plan.stats["segments"],
                            published=plan.stats["published_criterion"], baselines=plan.stats["baselines"])
    if not baselines:
        return row
    shared_config = {**config, "cross_device_sharing": True}
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared = partition(graph, costs, "timeslice", shared_config)
    shared_cpu_s = time.process_time() - started
    row["timeslice_shared"] = plan_figures(graph, costs, shared, n, replace(runtime, cross_device_sharing=True))
    row["timeslice_shared"].update(chosen=shared.stats["chosen"], planner_cpu_s=shared_cpu_s,
                                   segments=shared.stats["segments"], published=shared.stats["published_criterion"],
                                   baselines=shared.stats["baselines"])
    for method, base in plans.items():
        row[method] = plan_figures(graph, costs, base, n, runtime)
    balance = simulate_request_balance(graph, costs, n_requests=n, runtime=runtime)
    closed = simulate_request_balance(graph, costs, n_requests=n, max_in_flight=min(2, n), runtime=runtime)
    row["request_balance"] = {"batch": _figures(balance.makespan_us, balance.latency_us, n),
                              "closed": _figures(closed.makespan_us, closed.latency_us, n),
                              "services": [s.to_dict() for s in balance.services]}
    row["limit_per_s"] = two_device_limit_per_s(balance.services)
    return row


def goals(row: dict[str, Any], n: int, variant: str = "timeslice") -> dict[str, Any]:
    """The goals of ``row[variant]`` (``timeslice`` or ``timeslice_shared``) against the row's baselines, request
    balancing and two-device limit."""
    ts = row[variant]
    thr = ts["batch"]["throughput_per_s"]
    best_base = max(row[m]["batch"]["throughput_per_s"] for m in BASELINES)
    single = max(row[m]["batch"]["throughput_per_s"] for m in ("all_cpu", "all_gpu"))
    limit_period_us = 1e6 / row["limit_per_s"]
    link_busy = max(ts["link_us_per_request"].values(), default=0.0)
    out = {"not_slower": thr >= best_base * (1 - 1e-9), "gain_vs_single": thr / single - 1,
           "share_of_limit": thr / row["limit_per_s"], "link_allows": link_busy < 0.9 * limit_period_us}
    for regime in ("batch", "closed"):
        lb = row["request_balance"][regime]
        mine = ts[regime]
        out[f"p99_below_balance_{regime}"] = (mine["p99_us"] < lb["p99_us"]
                                              and mine["throughput_per_s"] >= lb["throughput_per_s"] * (1 - 1e-9))
    out["limit_goal"] = None if n < 16 or not out["link_allows"] else out["share_of_limit"] >= 0.9
    out["published_gain"] = GAIN_PUBLISHED[0] <= out["gain_vs_single"]
    return out


def _plan_text(chosen: dict[str, Any]) -> str:
    """"wavefront [32, 5] gpu first" / "all on gpu" / "cp_greedy", plus "/slices" for one segment per task."""
    if chosen["candidate"] != "cut":
        what = chosen["candidate"]
    elif chosen["kind"] in ("empty", "all"):
        what = f"all on {chosen['second_device' if chosen['kind'] == 'empty' else 'first_device']}"
    else:
        what = f"{chosen['kind']} {chosen['cut']} {chosen['first_device']} first"
    return what + ("/slices" if chosen.get("segments") == "slices" else "")


def _md_row(r: dict[str, Any]) -> str:
    ts, lb, sh = r["timeslice"], r["request_balance"], r["timeslice_shared"]
    g, gs = r["goals"], r["goals_shared"]
    thr = {m: r[m]["batch"]["throughput_per_s"] for m in ("timeslice", "all_cpu", "all_gpu", "cp_greedy")}
    what = _plan_text(ts["chosen"])
    return (f"| {r['config']} | {r['requests']} | {what} | {thr['timeslice']:,.0f} | {thr['all_cpu']:,.0f} | "
            f"{thr['all_gpu']:,.0f} | {thr['cp_greedy']:,.0f} | {lb['batch']['throughput_per_s']:,.0f} | "
            f"{r['limit_per_s']:,.0f} | {g['share_of_limit']:.0%} | {g['gain_vs_single']:+.0%} | "
            f"{ts['batch']['p50_us'] / 1e3:,.1f} / {ts['batch']['p99_us'] / 1e3:,.1f} | "
            f"{lb['batch']['p50_us'] / 1e3:,.1f} / {lb['batch']['p99_us'] / 1e3:,.1f} | "
            f"{ts['closed']['throughput_per_s']:,.0f}, {ts['closed']['p99_us'] / 1e3:,.1f} | "
            f"{lb['closed']['throughput_per_s']:,.0f}, {lb['closed']['p99_us'] / 1e3:,.1f} | "
            f"{_plan_text(sh['chosen'])} | {sh['batch']['throughput_per_s']:,.0f} | {gs['share_of_limit']:.0%} | "
            f"{sh['batch']['p50_us'] / 1e3:,.1f} / {sh['batch']['p99_us'] / 1e3:,.1f} | "
            f"{sh['closed']['throughput_per_s']:,.0f}, {sh['closed']['p99_us'] / 1e3:,.1f} |")


def summary(rows: list[dict[str, Any]], goals_key: str = "goals") -> dict[str, Any]:
    """Counts of the goals ``r[goals_key]`` over the rows (``goals``: timeslice; ``goals_shared``: with sharing)."""
    def count(key: str, subset: list[dict[str, Any]]) -> dict[str, int]:
        values = [r[goals_key][key] for r in subset if r[goals_key][key] is not None]
        return {"met": sum(values), "of": len(values)}

    many = [r for r in rows if r["requests"] >= 16]
    gains = [r[goals_key]["gain_vs_single"] for r in rows]
    return {"not_slower": count("not_slower", rows), "limit_90pct_r16": count("limit_goal", many),
            "link_limited_r16": sum(1 for r in many if not r[goals_key]["link_allows"]),
            "p99_below_balance_batch_r16": count("p99_below_balance_batch", many),
            "p99_below_balance_closed_r16": count("p99_below_balance_closed", many),
            "published_gain_14pct": count("published_gain", rows),
            "published_gain_14pct_r16": count("published_gain", many),
            "gain_vs_single_min": min(gains), "gain_vs_single_median": float(np.median(gains)),
            "gain_vs_single_max": max(gains),
            "share_of_limit_r16_min": min((r[goals_key]["share_of_limit"] for r in many), default=None)}


HEADER = ("| config | R | timeslice plan | timeslice | all_cpu | all_gpu | cp_greedy | balance | limit | of limit | "
          "vs best single | timeslice p50 / p99 (ms) | balance p50 / p99 (ms) | closed: timeslice req/s, p99 ms | "
          "closed: balance req/s, p99 ms | shared plan | shared | shared of limit | shared p50 / p99 (ms) | "
          "closed: shared req/s, p99 ms |\n"
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")


def _met(s: dict[str, int]) -> str:
    return f"{s['met']} of {s['of']}"


def write_markdown(result: dict[str, Any], path: Path) -> None:
    meta, rows, summ = result["meta"], result["rows"], result["summary"]
    sh = summ["shared"]
    lines = [
        "# RNN time-slice pipeline: timeslice against single devices, cp_greedy and request load balancing", "",
        f"Command: `{meta['command']}` ({meta['date']}, {meta['host']}; {meta['wall_s']:.0f} s). Every figure is "
        "simulated by `hetpart.simulate_requests` (one worker per device running whole segments, "
        f"{meta['overhead_us']} us per segment on every device: {meta['overhead_source']}); nothing here is a "
        "measurement of a run.", "",
        f"Costs: {meta['costs']}", "",
        "Models: stacked ONNX LSTM/GRU/RNN nodes built in code (seeded random weights), input `x[seq, batch, "
        "hidden]`, unrolled by hetpart's importer with the input projection hoisted over all steps (the default); "
        f"{meta['slice_steps']}-step slices. Base configuration {meta['base']}, every other row varies one factor.", "",
        "Columns: throughput in requests per second = R / makespan with all R requests waiting at t = 0 (`batch`). "
        "`balance`: request-level load balancing (each whole request on the device that frees first). `limit`: "
        "the two-device limit, the sum of the two devices' throughputs on whole requests back to back. "
        "`vs best single`: timeslice against the better of all_cpu and all_gpu. Latencies are completion minus "
        "admission: in `batch` every request is admitted at t = 0, so they include queueing; `closed` admits at "
        "most two requests at a time (a completion admits the next).", "",
        "`shared`: timeslice planned and simulated with cross-device sharing (`cross_device_sharing`, "
        "[hetpart/cross_sharing.py](../../../hetpart/cross_sharing.py)): a free device's worker runs a ready segment "
        "planned for the other, busy device when it is predicted to end it sooner (its start when that device frees, "
        "copies in, the segment's cost on each device), and the segment's outputs stay on the taker's device; a "
        "device with work of its own in the plan takes only while more requests are in flight than devices. The "
        "task runtime then needs every segment built for every device. Planning for it, `timeslice` takes, among "
        "its candidates within 2% of the best N-request makespan, the one that holds best with two requests in "
        "flight. `timeslice` keeps its static placement.", "",
        "## Goals", "",
        f"- never slower than the best single device and cp_greedy (simulated, batch): **{_met(summ['not_slower'])}** "
        "rows (by construction: both are candidates of the scheduler);",
        f"- R >= 16, throughput >= 90% of the two-device limit where the link allows: "
        f"**{_met(summ['limit_90pct_r16'])}** rows (lowest share of the limit at R >= 16: "
        f"{summ['share_of_limit_r16_min']:.1%}; {summ['link_limited_r16']} rows link-limited, excluded);",
        f"- R >= 16, p99 below request load balancing at equal or better throughput: batch admission "
        f"**{_met(summ['p99_below_balance_batch_r16'])}**, closed (two in flight) "
        f"**{_met(summ['p99_below_balance_closed_r16'])}**;",
        f"- the published 14-38% gain over the best single device: reached (>= 14%) in "
        f"**{_met(summ['published_gain_14pct'])}** rows ({_met(summ['published_gain_14pct_r16'])} at R >= 16); "
        f"gain min {summ['gain_vs_single_min']:+.0%}, median {summ['gain_vs_single_median']:+.0%}, max "
        f"{summ['gain_vs_single_max']:+.0%}.", "",
        "Timeslice with cross-device sharing (`shared`; baselines, request load balancing and the limit as above, "
        "simulated without sharing):", "",
        f"- never slower than the best single device and cp_greedy (simulated, batch): **{_met(sh['not_slower'])}** "
        "rows (the scheduler's candidates include both, scored with sharing);",
        f"- R >= 16, throughput >= 90% of the two-device limit where the link allows: "
        f"**{_met(sh['limit_90pct_r16'])}** rows (lowest share of the limit at R >= 16: "
        f"{sh['share_of_limit_r16_min']:.1%}; {sh['link_limited_r16']} rows link-limited, excluded);",
        f"- R >= 16, p99 below request load balancing at equal or better throughput: batch admission "
        f"**{_met(sh['p99_below_balance_batch_r16'])}**, closed (two in flight) "
        f"**{_met(sh['p99_below_balance_closed_r16'])}**;",
        f"- the published 14-38% gain over the best single device: reached (>= 14%) in "
        f"**{_met(sh['published_gain_14pct'])}** rows ({_met(sh['published_gain_14pct_r16'])} at R >= 16); "
        f"gain min {sh['gain_vs_single_min']:+.0%}, median {sh['gain_vs_single_median']:+.0%}, max "
        f"{sh['gain_vs_single_max']:+.0%}.", ""]
    for preset in meta["presets"]:
        lines += [f"## {preset}", "", HEADER]
        lines += [_md_row(r) for r in rows if r["preset"] == preset]
        lines.append("")
    if result.get("ablation"):
        lines += ["## Input projection per slice and one segment per task (base configuration)", "",
                  "Command: the same run (`--ablation`, `--ablation-presets`, `--ablation-overheads`). The base model "
                  "imported with the input projection hoisted over all steps or computed per k steps "
                  "(`input_projection=\"per_slice\"`), cut into k-step slices, and the chosen plan simulated with the "
                  "segments the task runtime cuts (`runtime`: one per device and request for a cut) or one segment per "
                  "task allowed as well (`slices`, `timeslice_segments=\"slices\"`: a wavefront inside one request; "
                  "the task runtime cannot run it yet; the plan column ends in `/slices` when the plan needs it). "
                  "`vs best single`: throughput against the better single device of the same graph; "
                  "`vs best single, hoisted`: against the better single device of the default (hoisted) graph, same "
                  "overhead.", "",
                  "| preset | overhead (us) | R | projection | k | segments allowed | kernels | timeslice req/s | "
                  "vs best single | vs best single, hoisted | plan | batch p99 (ms) | closed p99 (ms) |",
                  "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|---:|---:|"]
        for a in result["ablation"]:
            hoisted_gain = a["hoisted_best_single_makespan_us"] / a["batch"]["makespan_us"] - 1
            gain = a["best_single_makespan_us"] / a["batch"]["makespan_us"] - 1
            lines.append(f"| {a['preset']} | {a['overhead_us']:g} | {a['requests']} | {a['projection']} | "
                         f"{a['slice_steps']} | {a['segments']} | {a['kernels']} | "
                         f"{a['batch']['throughput_per_s']:,.0f} | {gain:+.0%} | {hoisted_gain:+.0%} | "
                         f"{_plan_text(a['chosen'])} | {a['batch']['p99_us'] / 1e3:,.2f} | "
                         f"{a['closed']['p99_us'] / 1e3:,.2f} |")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + _measured_module().kept_section(path))   # keep the measured section


def _measured_module() -> Any:
    """``rnn_pipeline_measured.py`` next to this file (the measured benchmark, ``--measured``)."""
    spec = importlib.util.spec_from_file_location("rnn_pipeline_measured", Path(__file__).with_name(
        "rnn_pipeline_measured.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("hetpart", "predictors", "tvm_passes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if "--measured" in argv:     # the timeslice plan run by the task runtime (rnn_pipeline_measured.py)
        return _measured_module().main([a for a in argv if a != "--measured"], RnnConfig, build_onnx, RESULTS)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--requests", default="1,16,64")
    parser.add_argument("--base", default="LSTM,2,512,32,1", help="cell,layers,hidden,seq,batch")
    parser.add_argument("--only-base", action="store_true", help="the base configuration only")
    parser.add_argument("--slice-steps", type=int, default=1)
    parser.add_argument("--overhead-us", type=float, default=None,
                        help="the runtime's cost per segment (default: benchmarks/results/dispatch_overhead)")
    parser.add_argument("--ablation", default="hoisted:1,per_slice:4,per_slice:8",
                        help="projection:slice_steps pairs tried on the base configuration ('' for none)")
    parser.add_argument("--ablation-presets", default="p2200,a100")
    parser.add_argument("--ablation-overheads", default="measured,10",
                        help="overheads per segment (us) of the ablation ('measured': --overhead-us)")
    parser.add_argument("--cpu-predictor", default=DEFAULT_CPU_PREDICTOR)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="rnn_pipeline")
    args = parser.parse_args(argv)
    overhead_source = "given by --overhead-us"
    if args.overhead_us is None:
        args.overhead_us = measured_overhead_us()
        overhead_source = "the task runtime's overhead measured in [dispatch_overhead](../dispatch_overhead/README.md)"
    started = time.time()
    presets = [p for p in args.presets.split(",") if p]
    counts = [int(n) for n in args.requests.split(",")]
    cell, layers, hidden, seq, batch = args.base.split(",")
    base = RnnConfig(cell, int(layers), int(hidden), int(seq), int(batch))
    configs = [base] if args.only_base else one_factor_grid(base)
    work = cache_root() / "benchmarks" / args.name        # the built ONNX models, outside the repository
    work.mkdir(parents=True, exist_ok=True)
    runtime = RuntimeModel({"cpu": args.overhead_us, "gpu": args.overhead_us}, copies="consumer")
    predictor = REPO / args.cpu_predictor
    rows: list[dict[str, Any]] = []
    for config in configs:
        graph = kernel_graph(config, work, None)
        for preset, costs in cost_tables(graph, presets, predictor).items():
            for n in counts:
                row = {"config": config.name, "preset": preset, "requests": n, "kernels": graph.num_ops,
                       **run_case(graph, costs, n, runtime, args.slice_steps)}
                row["goals"] = goals(row, n)
                row["goals_shared"] = goals(row, n, "timeslice_shared")
                rows.append(row)
                logger.info("%s %s R=%d: timeslice %.0f/s, shared %.0f/s (limit %.0f/s, balance %.0f/s), planned in "
                            "%.1f s and %.1f s", config.name, preset, n, row["timeslice"]["batch"]["throughput_per_s"],
                            row["timeslice_shared"]["batch"]["throughput_per_s"], row["limit_per_s"],
                            row["request_balance"]["batch"]["throughput_per_s"], row["timeslice"]["planner_cpu_s"],
                            row["timeslice_shared"]["planner_cpu_s"])
    ablation = []
    hoisted_single: dict[tuple[str, float, int], float] = {}
    overheads = [args.overhead_us if v == "measured" else float(v) for v in args.ablation_overheads.split(",") if v]
    for projection, k in [(p, int(k)) for p, k in (item.split(":") for item in args.ablation.split(",") if item)]:
        graph = kernel_graph(base, work, k if projection == "per_slice" else None)
        for preset, costs in cost_tables(graph, args.ablation_presets.split(","), predictor).items():
            for overhead in overheads:
                model = RuntimeModel({"cpu": overhead, "gpu": overhead}, copies="consumer")
                for segments in ("runtime", "slices"):
                    for n in (1, 16):
                        case = run_case(graph, costs, n, model, k, segments, baselines=False)["timeslice"]
                        best_single = min(case["baselines"][m]["makespan_us"] for m in ("all_cpu", "all_gpu"))
                        hoisted_single.setdefault((preset, overhead, n), best_single)   # the first entry: hoisted
                        ablation.append({"preset": preset, "requests": n, "projection": projection, "slice_steps": k,
                                         "overhead_us": overhead, "segments": segments, "kernels": graph.num_ops,
                                         "chosen": case["chosen"], "plan_segments": case["segments"],
                                         "batch": case["batch"], "closed": case["closed"],
                                         "best_single_makespan_us": best_single,
                                         "hoisted_best_single_makespan_us": hoisted_single[(preset, overhead, n)]})
                logger.info("ablation %s k=%d %s overhead %.0f us done", projection, k, preset, overhead)
    meta = {"command": "python benchmarks/rnn_pipeline.py " + " ".join(shlex.quote(a) for a in argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node() or "unknown",
            "wall_s": time.time() - started, "overhead_us": args.overhead_us, "overhead_source": overhead_source,
            "presets": presets,
            "requests": counts, "base": base.name, "slice_steps": args.slice_steps,
            "costs": f"CPU latencies from the shipped CPU latency predictor `{args.cpu_predictor}` (fitted to measured "
                     "kernel times, used as shipped, not scaled to this host), GPU latencies from the analytic "
                     "datasheet model of each preset (`predictors.analytic.AnalyticGpuModel`), copies over the "
                     "preset's datasheet link: predictions, not measurements."}
    result = {"meta": meta, "summary": {**summary(rows), "shared": summary(rows, "goals_shared")}, "rows": rows,
              "ablation": ablation}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=float))
    write_markdown(result, out / args.name / "README.md")
    logger.info("wrote %s and %s in %.0f s", out / f"{args.name}.json", out / args.name / "README.md",
                time.time() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
