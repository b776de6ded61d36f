"""The report's sections for a plan made for many requests in flight: a Gantt chart of N requests and, for a
``timeslice`` plan, "Which cut and why".

They appear when the plan was made for several requests (``plan.config["requests"] > 1``) or by ``timeslice``.
The plan's own figures and the Gantt chart come from ``hetpart.simulate_requests`` run here, in the runtime model the
plan was made with (``plan.config["dispatch_overhead_us_by_device"]`` and, for ``timeslice``, the segmentation
``plan.stats["segments"]``): the figures the planner compared and the compile printed. The candidates and the
single-device and ``cp_greedy`` baselines are the planner's (``plan.stats``, hetpart.partition.timeslice) when its
recorded figures equal this simulation, else they are simulated here; request-level load balancing is always
simulated here (hetpart.partition.request_balance). Nothing is measured.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.driver.report_data import ReportData, fmt_us, md_table
from hetpart.partition import cp_greedy
from hetpart.partition.common import PartitionConfig, Problem
from hetpart.partition.request_balance import simulate_request_balance
from hetpart.partition.request_score import runtime_model, score_plan
from hetpart.partition.single_device import single_device_assignment
from hetpart.partition.slices import build_slice_grid
from hetpart.partition.timeslice import CONSIDERED, slice_segmentation
from hetpart.plan import Plan
from hetpart.simulate_requests import RequestsTimeline, RuntimeModel, simulate_requests

log = logging.getLogger(__name__)

GANTT_IMAGE = "gantt_requests.png"
MAX_CANDIDATE_ROWS = 12            # the best candidates listed (plus the chosen and the published one)
LABELLED_REQUESTS = 10             # requests named in the Gantt chart's legend
COLOURS_PER_CYCLE = 20             # request r and r + 20 share a colour
MIN_LABEL_IN = 0.16                # bars at least this wide (inches) carry their request number
MAX_BAR_LABELS = 600
REL_TOL = 1e-9
BALANCE_MEANING = "each request whole on the device that frees first (request-level load balancing)"


@dataclass(frozen=True)
class RequestFigures:
    """N requests of one plan in the task runtime's model (p50/p99: numpy's linear percentiles)."""

    name: str
    meaning: str
    n_requests: int
    makespan_us: float
    period_us: float
    latency_p50_us: float
    latency_p99_us: float

    @property
    def throughput_per_s(self) -> float:
        """Requests per second over the whole batch (requests / makespan), as the planner reports it."""
        return self.n_requests / self.makespan_us * 1e6 if self.makespan_us > 0 else math.inf

    @classmethod
    def of(cls, name: str, meaning: str, latency_us: Sequence[float], makespan_us: float,
           period_us: float) -> "RequestFigures":
        latency = np.asarray(latency_us)
        return cls(name, meaning, len(latency), float(makespan_us), float(period_us),
                   float(np.percentile(latency, 50)), float(np.percentile(latency, 99)))

    @classmethod
    def recorded(cls, name: str, meaning: str, n_requests: int, stats: Mapping[str, Any]) -> "RequestFigures":
        return cls(name, meaning, n_requests, float(stats["makespan_us"]), float(stats["period_us"]),
                   float(stats["latency_p50_us"]), float(stats["latency_p99_us"]))


@dataclass(frozen=True)
class RequestsView:
    """What the sections show: the plan's N-request timeline and figures, and the baselines'."""

    runtime: RuntimeModel
    segments: str                            # "runtime" (segment_plan) or "slices" (one segment per slice task)
    timeline: RequestsTimeline
    plan: RequestFigures
    baselines: tuple[RequestFigures, ...]    # every single device, cp_greedy, request-level balance
    planner_agrees: bool                     # the planner's recorded figures equal this simulation

    @property
    def n_requests(self) -> int:
        return self.timeline.n_requests


def applies(plan: Plan) -> bool:
    """The plan was made for several requests in flight, or by ``timeslice``."""
    return plan.method == "timeslice" or int(plan.config.get("requests", 1) or 1) > 1


def baseline_meaning(name: str) -> str:
    if name == "cp_greedy":
        return "cp_greedy's plan of one request (kernels interleaved across the devices), for every request"
    if name == "request_balance":
        return BALANCE_MEANING
    return f"every request on {name.removeprefix('all_')} alone (a kernel it cannot run goes to the host)"


def requests_view(data: ReportData) -> RequestsView | None:
    """Simulate the plan's requests (and whatever baseline the planner did not record); None if not applicable."""
    plan = data.plan
    if not applies(plan):
        return None
    config = PartitionConfig.coerce(plan.config)
    runtime = runtime_model(config, data.costs.device_names)
    segments = str(plan.stats.get("segments", "runtime"))
    segmentation = None
    if segments == "slices":
        segmentation = slice_segmentation(data.graph, plan, build_slice_grid(data.graph, config.slice_steps))
    timeline = simulate_requests(data.graph, data.costs, plan, n_requests=config.requests, runtime=runtime,
                                 segmentation=segmentation)
    figures = RequestFigures.of(f"hetpart ({plan.method})", "the chosen plan", timeline.latency_us,
                                timeline.makespan_us, timeline.period_us)
    chosen = plan.stats.get("chosen")
    agrees = isinstance(chosen, Mapping) and all(
        math.isclose(float(chosen[k]), getattr(figures, k), rel_tol=1e-6, abs_tol=1e-6)
        for k in ("makespan_us", "period_us", "latency_p50_us", "latency_p99_us"))
    if isinstance(chosen, Mapping) and not agrees:
        log.warning("the planner's recorded %d-request makespan (%.1f us) differs from the simulation of the plan "
                    "with the current costs (%.1f us); the report simulates the baselines again",
                    config.requests, float(chosen["makespan_us"]), figures.makespan_us)
    recorded = plan.stats.get("baselines") if agrees else None
    if isinstance(recorded, Mapping):
        baselines = [RequestFigures.recorded(name, baseline_meaning(name), config.requests, value)
                     for name, value in recorded.items()]
    else:
        baselines = _simulated_baselines(data, config, runtime)
    if len(data.costs.device_names) > 1:
        balance = simulate_request_balance(data.graph, data.costs, n_requests=config.requests, config=config,
                                           runtime=runtime)
        baselines.append(RequestFigures.of("request_balance", BALANCE_MEANING, balance.latency_us,
                                           balance.makespan_us, balance.period_us))
    return RequestsView(runtime, segments, timeline, figures, tuple(baselines), agrees)


def _simulated_baselines(data: ReportData, config: PartitionConfig, runtime: RuntimeModel) -> list[RequestFigures]:
    """Every single device and cp_greedy, each plan of one request run for N requests, as timeslice scores them."""
    problem = Problem(data.graph, data.costs, config, "report")
    candidates = [(f"all_{name}", single_device_assignment(problem, d), list(range(problem.n)))
                  for d, name in enumerate(problem.names)]
    if problem.n_dev > 1:
        dev, order, _, _ = cp_greedy.search(problem)
        candidates.append(("cp_greedy", list(dev), list(order)))
    out = []
    for name, dev, order in candidates:
        if not math.isfinite(problem.model.makespan(dev, order)):
            log.info("baseline %s does not fit a device's memory; left out of the report", name)
            continue
        plan = Plan(device_of=tuple(problem.names[d] for d in dev), order=tuple(order), devices=problem.names,
                    method=name, pins=config.pins, level=data.graph.level)
        score = score_plan(data.graph, data.costs, plan, config.requests, runtime=runtime, config=config.simulation)
        out.append(RequestFigures(name, baseline_meaning(name), config.requests, score.makespan_us, score.period_us,
                                  score.latency_p50_us, score.latency_p99_us))
    return out


# ---------------------------------------------------------------------------------------------- markdown
def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


def _overhead_text(runtime: RuntimeModel) -> str:
    values = {d: v for d, v in runtime.dispatch_overhead_us_by_device.items() if v}
    if not values:
        return "no overhead per segment (the plan was made with none)"
    return "an overhead per segment of " + ", ".join(f"{fmt_us(v)} µs on {d}" for d, v in values.items())


def requests_section(data: ReportData, view: RequestsView, image: str) -> list[str]:
    """Markdown: the plan's N requests and the Gantt chart, then "Which cut and why" (timeslice) or the
    baselines."""
    n, f = view.n_requests, view.plan
    segments = ("one segment per slice task of the grid" if view.segments == "slices" else
                "the segments the task runtime cuts, one per run of a device's kernels in plan order")
    lines = ["## Many requests in flight (simulated)", "",
             f"This plan was made for **{_requests(n)} in flight**, all waiting at t = 0, in the "
             f"task runtime's model (docs/runtime_model.md): one worker per device runs whole segments ({segments}; "
             f"{len(view.timeline.events_of(0, 'segment'))} per request), with {_overhead_text(view.runtime)}."
             + (" With cross-device sharing a free device runs the other's ready segments when it is predicted to "
                "end them sooner (a bar in its row may be another device's segment)." if
                view.runtime.cross_device_sharing else "") + " Simulated with `simulate_requests`, not measured:", "",
             f"- **{_requests(n)}: makespan {fmt_us(f.makespan_us)} µs, {fmt_us(f.throughput_per_s)} requests/s**; in "
             f"the second half one request completes every {fmt_us(f.period_us)} µs (steady-state period);",
             f"- latency (completion minus admission): **p50 {fmt_us(f.latency_p50_us)} µs, p99 "
             f"{fmt_us(f.latency_p99_us)} µs**.", ""]
    if data.task_runtime:
        lines += [f"The *Task runtime* section below predicts {data.task_runtime['requests']} requests with the "
                  f"overhead per segment measured at compile time "
                  f"({fmt_us(data.task_runtime['overhead_per_segment_us'])} µs), so its figures differ.", ""]
    if isinstance(data.plan.stats.get("chosen"), Mapping) and not view.planner_agrees:
        lines += [f"The planner recorded a makespan of {fmt_us(float(data.plan.stats['chosen']['makespan_us']))} "
                  "µs for this plan with other costs (a given plan re-simulated): the figures here and the "
                  "baselines are simulated with the current costs; a candidate table below is the planner's.", ""]
    lines += [f"![{_requests(n)} in flight]({image})", "",
              f"Simulated timeline of {_requests(n)}: one row per device (its segments) and per copy direction "
              "(thinner bars), every bar coloured by its request ("
              + (f"colours repeat every {COLOURS_PER_CYCLE} requests; " if n > COLOURS_PER_CYCLE else "")
              + "wide bars carry their request number).", ""]
    if data.plan.method == "timeslice" and isinstance(data.plan.stats.get("chosen"), Mapping):
        return lines + which_cut_section(data, view)
    return lines + ["### Baselines on the same simulator", ""] + baselines_table(view) + [""]


SHORT_CONSIDERED = {"every cut": "every cut", "estimate": "best estimate", "balance": "most balanced",
                    "whole grid": "whole grid", "refinement": "one-slice move", "baseline": "baseline"}


def _per_layer(values: Sequence[int]) -> str:
    return str(values[0]) if len(set(values)) == 1 else f"{', '.join(map(str, values))} (by layer)"


def _cut_parts(grid: Mapping[str, Any], cut: Sequence[int], first: str, second: str) -> list[str]:
    """Which device runs which slices (and recurrence steps) of every RNN layer."""
    k, out = int(grid["slice_steps"]), []
    for layer, steps, slices, c in zip(grid["layers"], grid["steps"], grid["slices"], cut):
        if c in (0, slices):
            what = f"all {slices} slices on {second if c == 0 else first}"
        else:
            what = (f"slices 0–{c - 1} (steps 0–{min(c * k, steps) - 1}) on {first}, slices {c}–{slices - 1} "
                    f"(steps {c * k}–{steps - 1}) on {second}")
        out.append(f"- RNN layer {layer} ({steps} steps): {what};")
    return out


def _name(row: Mapping[str, Any]) -> str:
    if row["candidate"] != "cut":
        return str(row["candidate"])
    return str(list(row["cut"])) + (", a segment per slice" if row.get("segments") == "slices" else "")


def _chosen_lines(stats: Mapping[str, Any], chosen_row: Mapping[str, Any] | None, view: RequestsView) -> list[str]:
    chosen, grid, n = stats["chosen"], stats["grid"], view.n_requests
    if chosen["candidate"] != "cut":
        best = stats["best_cut"]
        return [f"**Chosen: the {chosen['candidate']} plan.** No cut beat it: the best cut, the {best['kind']} cut "
                f"{best['cut']} with {best['first_device']} first, takes {fmt_us(best['makespan_us'])} µs for "
                f"{_requests(n)}.", ""]
    first, second, kind = chosen["first_device"], chosen["second_device"], chosen["kind"]
    if kind in ("empty", "all"):
        return [f"**Chosen: the whole grid on {first if kind == 'all' else second}** (no cut pays here).", ""]
    lines = [f"**Chosen: the {kind} cut {chosen['cut']}**, {first} runs the cut and {second} the rest "
             f"(slices of {grid['slice_steps']} step{'s' if grid['slice_steps'] > 1 else ''}):", ""]
    lines += _cut_parts(grid, chosen["cut"], first, second)
    if chosen_row is not None and "first_us" in chosen_row:
        a, b = chosen_row["first_us"], chosen_row["second_us"]
        lines.append(f"- one request's kernels: {fmt_us(a)} µs on {first}, {fmt_us(b)} µs on {second} (balance: the "
                     f"smaller side is {min(a, b) / max(a, b):.0%} of the larger, a difference of "
                     f"{fmt_us(abs(a - b))} µs);")
    per_request = len(view.timeline.events_of(0, "segment"))
    what = ("one segment per slice task, so the second device starts a request's first slices while the first "
            "device runs its next ones" if chosen["segments"] == "slices" else
            "one segment per device, so a request's second part waits for all of its first")
    lines += [f"- the task runtime runs {per_request} segments per request ({what})"
              + ("; requests pipeline across the devices." if n > 1 else "."), ""]
    return lines


def which_cut_section(data: ReportData, view: RequestsView) -> list[str]:
    """The chosen cut, the candidates the planner simulated, and the baselines (timeslice plans)."""
    stats, n = data.plan.stats, view.n_requests
    grid = stats["grid"]
    rows = list(stats.get("candidates") or stats.get("shortlist") or [])
    chosen_row = next((r for r in rows if r.get("chosen")), None)
    lines = ["## Which cut and why", "",
             f"`timeslice` cuts the recurrence into time slices of {grid['slice_steps']} step"
             f"{'s' if grid['slice_steps'] > 1 else ''}: {len(grid['layers'])} RNN layer(s) of "
             f"{_per_layer(grid['steps'])} steps, {_per_layer(grid['slices'])} slices each, {grid['tasks']} slice "
             "tasks. A cut gives the first device a prefix of slices of every layer (a set of tasks that needs no "
             "task outside it) and the second device the rest, so data flows one way; cut `[c0, c1, ...]` = the "
             "first device's slice count per layer. Kinds: layer split (whole layers), layer and time split (one "
             "layer cut in time), time split (the same prefix in every layer), wavefront (anything else).", ""]
    lines += _chosen_lines(stats, chosen_row, view)
    counts: dict[str, int] = {}
    for row in rows:
        for reason in row.get("considered", ()):
            counts[reason] = counts.get(reason, 0) + 1
    stride = f", at a stride of {stats['cut_stride']} slices" if stats.get("cut_stride", 1) > 1 else ""
    why = (f"**Why.** The planner enumerated {stats['cuts_per_order']} cuts per device order (both orders{stride}), "
           f"ranked them by a two-stage pipeline estimate of the {n}-request makespan (a + c + b + (N − 1) · "
           "max(a, b, links); a, b: the two sides' kernel time, c: the copies across the cut) and simulated "
           f"{len(rows)} candidates ({stats['simulated']} distinct plans) with `simulate_requests`"
           + (" (" + ", ".join(f"{SHORT_CONSIDERED.get(k, k)}: {v}" for k, v in counts.items()) + ")" if counts else "")
           + ". The plan is the candidate with the smallest simulated makespan (ties: the smaller p99 latency)")
    few = stats.get("few_in_flight")
    if isinstance(few, Mapping):
        why += (f", except that with cross-device sharing the {few['compared']} candidates within "
                f"{float(few['tolerance']):.0%} of it were simulated again with {few['max_in_flight']} requests in "
                f"flight and the best of them there chosen ({fmt_us(float(few['makespan_us']))} µs for "
                f"{_requests(n)} at {few['max_in_flight']} in flight)")
    best_us = float(stats["chosen"]["makespan_us"])
    runner = next((r for r in rows if r["makespan_us"] > best_us * (1 + REL_TOL)), None)
    if runner is not None:
        why += (f"; the next larger makespan, {_name(runner)}'s, is {fmt_us(runner['makespan_us'])} µs "
                f"({runner['makespan_us'] / best_us - 1:+.1%})")
    published = stats["published_criterion"]
    why += (f". The published criterion (\"comparable performance\": the cut whose sides' kernel times differ "
            f"least) picks {published['cut']} with {published['first_device']} first: "
            f"{fmt_us(published['makespan_us'])} µs for {_requests(n)} "
            f"({published['makespan_us'] / best_us:.2f}× the chosen makespan).")
    lines += [why, "", "### Candidates simulated", ""] + candidates_table(rows, n) + [""]
    legend = "; ".join(f"*{SHORT_CONSIDERED[k]}*: {v}" for k, v in CONSIDERED.items())
    source = "`stats.candidates`" if stats.get("candidates") else "`stats.shortlist` (its best 8)"
    lines += [f"{min(len(rows), MAX_CANDIDATE_ROWS)} best of {len(rows)} simulated candidates shown (and the chosen "
              f"and published ones), smallest makespan first; `plan.json` lists them in {source}. *First "
              "device*: the one that runs the cut; *balance*: the smaller side's kernel time over the larger's. "
              f"Considered as: {legend}.", "", "### Baselines on the same simulator", ""]
    return lines + baselines_table(view) + [""]


def _kind(row: Mapping[str, Any]) -> str:
    kind = str(row.get("kind", "baseline"))
    if kind in ("empty", "all"):
        return f"whole grid on {row['second_device'] if kind == 'empty' else row['first_device']}"
    return kind


def candidates_table(rows: Sequence[Mapping[str, Any]], n: int) -> list[str]:
    shown = [(k, r) for k, r in enumerate(rows) if k < MAX_CANDIDATE_ROWS or r.get("chosen") or r.get("published")]
    cells = []
    for k, row in shown:
        name = f"**{_name(row)}** (chosen)" if row.get("chosen") else _name(row)
        name += " (published criterion)" if row.get("published") else ""
        a, b = row.get("first_us"), row.get("second_us")
        balance = "—" if a is None else f"{min(a, b) / max(a, b):.0%}" if max(a, b) > 0 else "100%"
        throughput = row.get("throughput_per_s", n / row["makespan_us"] * 1e6)
        cells.append([str(k + 1), name, row.get("first_device", "—"), _kind(row),
                      "—" if a is None else fmt_us(a), "—" if b is None else fmt_us(b), balance,
                      fmt_us(row["estimate_us"]) if "estimate_us" in row else "—", fmt_us(row["makespan_us"]),
                      fmt_us(throughput), fmt_us(row["latency_p50_us"]), fmt_us(row["latency_p99_us"]),
                      ", ".join(SHORT_CONSIDERED.get(c, c) for c in row.get("considered", ()))])
    header = ["rank", "candidate", "first device", "kind", "one request on the first device (µs)",
              "on the second (µs)", "balance", "pipeline estimate (µs)", f"makespan of {_requests(n)} (µs)",
              "throughput (requests/s)", "p50 latency (µs)", "p99 latency (µs)", "considered as"]
    return md_table(header, cells, "rlllrrrrrrrrl")


def baselines_table(view: RequestsView) -> list[str]:
    n, own = view.n_requests, view.plan
    rows = [own] + sorted(view.baselines, key=lambda b: b.makespan_us)
    cells = [[f"**{b.name}**" if b is own else b.name, b.meaning, fmt_us(b.makespan_us), fmt_us(b.throughput_per_s),
              fmt_us(b.period_us), fmt_us(b.latency_p50_us), fmt_us(b.latency_p99_us),
              f"{b.throughput_per_s / own.throughput_per_s:.2f}×"] for b in rows]
    header = ["plan", "what it does", f"makespan of {_requests(n)} (µs)", "throughput (requests/s)",
              "steady-state period (µs)", "p50 latency (µs)", "p99 latency (µs)", "throughput / the hetpart plan's"]
    return md_table(header, cells, "llrrrrrr") + [
        "", "Throughput = requests / makespan; the steady-state period is the mean interval between completions over "
        "the second half of the requests. Every row is simulated in the same runtime model."]


# ---------------------------------------------------------------------------------------------- Gantt chart
def request_colour(request: int) -> Any:
    """tab20 reordered so that neighbouring requests get different hues: the 10 dark shades, then the 10 light."""
    import matplotlib

    position = request % COLOURS_PER_CYCLE
    return matplotlib.colormaps["tab20"](2 * position if position < 10 else 2 * (position - 10) + 1)


def requests_gantt_png(data: ReportData, view: RequestsView, path: Path) -> Path:
    """One row per device (segments) and per copy direction (copies, thinner bars), bars coloured by request."""
    from matplotlib.patches import Patch

    from hetpart.driver.report_plots import cost_sources_text, pyplot

    plt = pyplot()
    timeline, f, n = view.timeline, view.plan, view.n_requests
    links = sorted({e.resource for e in timeline.events if e.kind == "copy"})
    rows = list(data.plan.devices) + links
    fig, ax = plt.subplots(figsize=(14, 2.4 + 0.6 * len(rows)))
    x_max = max(timeline.makespan_us, 1e-3) * 1.01
    axis_in = 14 * 0.8
    min_width_us = x_max * 1e-3          # copies of a few µs stay visible
    labels = 0
    for y, resource in enumerate(rows):
        events = [e for e in timeline.events if e.resource == resource]
        copy = resource in links
        ax.broken_barh([(e.start_us, max(e.end_us - e.start_us, min_width_us)) for e in events],
                       (y - (0.25 if copy else 0.38), 0.5 if copy else 0.76),
                       facecolors=[request_colour(e.request) for e in events],
                       edgecolor="none" if copy else "black", linewidth=0.3)
        for e in events:
            if labels < MAX_BAR_LABELS and (e.end_us - e.start_us) / x_max * axis_in >= MIN_LABEL_IN:
                ax.text((e.start_us + e.end_us) / 2, y, str(e.request), ha="center", va="center", fontsize=6)
                labels += 1
    ax.set_yticks(range(len(rows)), list(data.plan.devices) + [f"copy {r.replace('->', ' → ')}" for r in links])
    ax.set_xlim(0, x_max)
    ax.invert_yaxis()
    ax.set_xlabel("time since the requests were admitted (µs, simulated)")
    ax.set_title(f"{data.graph.name}: {_requests(n)} in flight, {data.plan.method} plan: makespan "
                 f"{f.makespan_us:,.0f} µs, {f.throughput_per_s:,.1f} requests/s, latency p50 "
                 f"{f.latency_p50_us:,.0f} µs, p99 {f.latency_p99_us:,.0f} µs\nsimulated in the task runtime's model "
                 f"({_overhead_text(view.runtime)}; costs {cost_sources_text(data)}), not measured", fontsize=9)
    handles = [Patch(facecolor=request_colour(r), edgecolor="black", linewidth=0.3, label=f"request {r}")
               for r in range(min(n, LABELLED_REQUESTS))]
    if n > LABELLED_REQUESTS:
        repeat = f"colours repeat every {COLOURS_PER_CYCLE}" if n > COLOURS_PER_CYCLE else "numbered on their bars"
        handles.append(Patch(facecolor="white", edgecolor="white",
                             label=f"… requests {LABELLED_REQUESTS}–{n - 1}: {repeat}"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.5 / (1 + 0.25 * len(rows))),
              ncol=6, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
