"""Measure backward / forward time per op kind with torch on this CPU: the ratio table of
:class:`hetpart.training.cost_model.BackwardRatios`.

hetpart's predictors model inference kernels only; a training plan needs backward times too. Each *case* below is
one operator of a representative shape (a 3x3 convolution, an LSTM cell's gate matmul, a LayerNorm, ...), tagged
with the op kind hetpart's graphs use (``conv2d``, ``matmul``, ``layer_norm``, ... as
:func:`hetpart.training.cost_model.normalize_kind` names them). For each case the forward pass (autograd
recording, as in training) and the backward pass of that forward's output are timed back to back, ``repeats``
times after ``warmup`` untimed passes; gradients are dropped before every pass (as a training step does). The
cases are timed in ``rounds`` round-robin passes, so a burst of load on a shared machine hits one round of every
case rather than all repeats of one. A case's ratio is the median over rounds of (median backward / median
forward) within the round; a kind's ratio is the median of its cases' ratios; ``default_ratio`` (kinds without a
measurement) is the median of the kinds' ratios.

The ratios are those of torch's CPU kernels on ``threads`` threads (1 by default: one thread per pipeline stage
process, as the runs use). They are applied unchanged to GPU forward costs: the GPU ratio is *assumed* equal.
"""
from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hetpart.training.cost_model import BackwardRatios, normalize_kind
from hetpart.training_torch.errors import CalibrationError

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
SHIPPED_RATIOS = DATA_DIR / "backward_ratios_cpu.json"


@dataclass(frozen=True)
class CaseResult:
    """One timed operator: medians in µs and the ratio backward / forward (median over rounds)."""

    kind: str
    name: str
    description: str
    forward_us: float
    backward_us: float
    ratio: float
    round_ratios: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "description": self.description,
                "forward_us": round(self.forward_us, 2), "backward_us": round(self.backward_us, 2),
                "ratio": round(self.ratio, 4), "round_ratios": [round(r, 4) for r in self.round_ratios]}


@dataclass(frozen=True)
class CalibrationResult:
    """The measured ratio table plus every case behind it and the host it was measured on."""

    kind_ratio: Mapping[str, float]
    default_ratio: float
    source: str
    host: Mapping[str, Any]
    settings: Mapping[str, Any]
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    def to_backward_ratios(self) -> BackwardRatios:
        return BackwardRatios(dict(self.kind_ratio), self.default_ratio, self.source).validate()

    def to_dict(self) -> dict[str, Any]:
        return {"kind_ratio": {k: round(v, 4) for k, v in self.kind_ratio.items()},
                "default_ratio": round(self.default_ratio, 4), "source": self.source,
                "definition": "backward time / forward time of one operator, both with autograd recording; GPU "
                              "ratios are assumed equal to these CPU ones",
                "host": dict(self.host), "settings": dict(self.settings),
                "cases": [c.to_dict() for c in self.cases]}

    def save(self, path: str | Path) -> Path:
        import json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


# ------------------------------------------------------------------------------------------------ cases
def _cases() -> list[tuple[str, str, str, Callable[[Any], tuple[Callable[[], Any], list[Any]]]]]:
    """(kind, name, description, build): ``build(torch)`` returns (forward callable, tensors whose grads to drop)."""
    import torch
    from torch import nn

    def module(make: Callable[[], nn.Module], shape: Sequence[int]):
        def build(_torch):
            m = make()
            x = torch.randn(*shape, requires_grad=True)
            return (lambda: m(x)), [x, *m.parameters()]
        return build

    def binary(op: Callable[[Any, Any], Any], shape: Sequence[int]):
        def build(_torch):
            a, b = torch.randn(*shape, requires_grad=True), torch.randn(*shape, requires_grad=True)
            return (lambda: op(a, b)), [a, b]
        return build

    def embedding(vocab: int, dim: int, shape: Sequence[int]):
        def build(_torch):
            m = nn.Embedding(vocab, dim)
            ids = torch.randint(0, vocab, tuple(shape))
            return (lambda: m(ids)), list(m.parameters())
        return build

    def batch_norm(channels: int, shape: Sequence[int]):
        def build(_torch):
            m = nn.BatchNorm2d(channels).train()
            x = torch.randn(*shape, requires_grad=True)
            return (lambda: m(x)), [x, *m.parameters()]
        return build

    return [
        ("conv2d", "conv3x3", "Conv2d 32->32, 3x3, stride 1, on 4x32x28x28",
         module(lambda: nn.Conv2d(32, 32, 3, padding=1), (4, 32, 28, 28))),
        ("conv2d", "conv1x1", "Conv2d 64->128, 1x1, on 4x64x28x28",
         module(lambda: nn.Conv2d(64, 128, 1), (4, 64, 28, 28))),
        ("conv2d", "conv3x3_s2", "Conv2d 32->64, 3x3, stride 2, on 4x32x56x56",
         module(lambda: nn.Conv2d(32, 64, 3, stride=2, padding=1), (4, 32, 56, 56))),
        ("matmul", "dense", "Linear 512->512 on 128x512", module(lambda: nn.Linear(512, 512), (128, 512))),
        ("matmul", "lstm_cell_gates", "an LSTM cell's gate matmul: Linear 650->2600 (4 x 650 gates) on 20x650",
         module(lambda: nn.Linear(650, 2600), (20, 650))),
        ("matmul", "ffn", "a transformer FFN matmul: Linear 256->1024 on 512x256",
         module(lambda: nn.Linear(256, 1024), (512, 256))),
        ("batch_norm", "batch_norm", "BatchNorm2d(32), training mode, on 8x32x28x28", batch_norm(32, (8, 32, 28, 28))),
        ("relu", "relu", "ReLU on 4x32x56x56", module(nn.ReLU, (4, 32, 56, 56))),
        ("gelu", "gelu", "GELU on 4x32x56x56", module(nn.GELU, (4, 32, 56, 56))),
        ("tanh", "tanh", "Tanh on 4x32x56x56", module(nn.Tanh, (4, 32, 56, 56))),
        ("sigmoid", "sigmoid", "Sigmoid on 4x32x56x56", module(nn.Sigmoid, (4, 32, 56, 56))),
        ("add", "add", "a + b (a residual add), both 4x32x56x56", binary(lambda a, b: a + b, (4, 32, 56, 56))),
        ("multiply", "multiply", "a * b (an LSTM gate product), both 4x32x56x56",
         binary(lambda a, b: a * b, (4, 32, 56, 56))),
        ("max_pool2d", "max_pool_3x3_s2", "MaxPool2d 3x3, stride 2, on 4x64x56x56",
         module(lambda: nn.MaxPool2d(3, 2, 1), (4, 64, 56, 56))),
        ("avg_pool2d", "avg_pool_2x2", "AvgPool2d 2x2, stride 2, on 4x64x56x56",
         module(lambda: nn.AvgPool2d(2, 2), (4, 64, 56, 56))),
        ("adaptive_avg_pool2d", "global_avg_pool", "AdaptiveAvgPool2d(1) on 16x512x7x7",
         module(lambda: nn.AdaptiveAvgPool2d(1), (16, 512, 7, 7))),
        ("layer_norm", "layer_norm", "LayerNorm(256) on 8x128x256", module(lambda: nn.LayerNorm(256), (8, 128, 256))),
        ("softmax", "softmax", "Softmax over the last axis of 8x4x128x128 (attention scores)",
         module(lambda: nn.Softmax(-1), (8, 4, 128, 128))),
        ("take", "embedding", "Embedding 10000x256 looked up by 8x128 ids (dense weight gradient)",
         embedding(10_000, 256, (8, 128))),
    ]


def case_kinds() -> list[str]:
    """The op kinds the calibration measures (in :func:`normalize_kind` form)."""
    return sorted({normalize_kind(kind) for kind, *_ in _cases()})


# ------------------------------------------------------------------------------------------------ timing
def _time_round(forward: Callable[[], Any], tensors: list[Any], grad: Any, warmup: int,
                repeats: int) -> tuple[float, float]:
    """Median forward and backward seconds over ``repeats`` passes, after ``warmup`` untimed passes."""
    forward_s: list[float] = []
    backward_s: list[float] = []
    for k in range(warmup + repeats):
        for t in tensors:
            t.grad = None
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        if k >= warmup:
            forward_s.append(t1 - t0)
            backward_s.append(t2 - t1)
    return statistics.median(forward_s), statistics.median(backward_s)


def host_info(threads: int) -> dict[str, Any]:
    """The CPU (``/proc/cpuinfo`` model name, family and model), core count, torch version and thread count."""
    import torch

    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
                            "torch": torch.__version__, "threads": threads, "python": platform.python_version()}
    try:
        fields_seen: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags") and key not in fields_seen:
                fields_seen[key] = value.strip()
        if "model name" in fields_seen:
            info["cpu"] = fields_seen["model name"]
        if "cpu family" in fields_seen:
            info["cpu_family"] = int(fields_seen["cpu family"])
            info["cpu_model"] = int(fields_seen.get("model", "0"))
        flags = set(fields_seen.get("flags", "").split())
        info["simd"] = [f for f in ("avx2", "avx512f", "fma") if f in flags]
    except OSError:
        pass
    return info


def _load_average() -> float:
    """The host's 1-minute load average (NaN where the OS has none): how busy the machine was while timing."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def measure_backward_ratios(*, repeats: int = 15, warmup: int = 3, rounds: int = 3, threads: int = 1,
                            kinds: Sequence[str] | None = None, seed: int = 0) -> CalibrationResult:
    """Time every case (or only those of ``kinds``) and return the ratio table. Takes ~10-40 s on 2 cores."""
    import torch

    if repeats < 1 or rounds < 1 or warmup < 0 or threads < 1:
        raise CalibrationError(f"repeats, rounds and threads must be >= 1 and warmup >= 0; found repeats={repeats}, "
                               f"rounds={rounds}, warmup={warmup}, threads={threads}")
    wanted = None if kinds is None else {normalize_kind(k) for k in kinds}
    cases = [c for c in _cases() if wanted is None or normalize_kind(c[0]) in wanted]
    if not cases:
        raise CalibrationError(f"no calibration case measures the kinds {sorted(wanted or ())}; known kinds: "
                               f"{', '.join(case_kinds())}")
    before_load = _load_average()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        torch.manual_seed(seed)
        built = [(kind, name, desc, *build(torch)) for kind, name, desc, build in cases]
        grads = []
        for _, _, _, forward, _ in built:
            with torch.no_grad():
                grads.append(torch.randn_like(forward()))
        per_round: dict[str, list[tuple[float, float]]] = {name: [] for _, name, *_ in built}
        for r in range(rounds):
            for (_, name, _, forward, tensors), grad in zip(built, grads):
                per_round[name].append(_time_round(forward, tensors, grad, warmup, repeats))
            log.info("backward calibration: round %d of %d done (%.1f s)", r + 1, rounds, time.perf_counter() - started)
    finally:
        torch.set_num_threads(previous_threads)
    results = []
    for kind, name, desc, _, _ in built:
        samples = per_round[name]
        ratios = [b / f for f, b in samples if f > 0]
        if len(ratios) != len(samples) or any(not r > 0 for r in ratios):
            raise CalibrationError(f"case {name} ({kind}) gave forward/backward times {samples}: a ratio needs both "
                                   "to be positive")
        results.append(CaseResult(kind=normalize_kind(kind), name=name, description=desc,
                                  forward_us=statistics.median(f for f, _ in samples) * 1e6,
                                  backward_us=statistics.median(b for _, b in samples) * 1e6,
                                  ratio=statistics.median(ratios), round_ratios=tuple(ratios)))
    by_kind: dict[str, list[float]] = {}
    for c in results:
        by_kind.setdefault(c.kind, []).append(c.ratio)
    kind_ratio = {k: statistics.median(v) for k, v in sorted(by_kind.items())}
    host = host_info(threads)
    source = (f"measured on {host['cpu']} with torch {host['torch']}, {threads} thread(s), "
              f"{datetime.now(timezone.utc).strftime('%Y-%m-%d')}")
    settings = {"repeats": repeats, "warmup": warmup, "rounds": rounds, "seed": seed,
                "load_average_1min": [round(before_load, 2), round(_load_average(), 2)],
                "seconds": round(time.perf_counter() - started, 1), "load_average_at": "start and end of the timing",
                "statistic": "per case: median over rounds of (median backward / median forward); per kind: median "
                             "of its cases; default_ratio: median of the kinds"}
    return CalibrationResult(kind_ratio=kind_ratio, default_ratio=statistics.median(kind_ratio.values()),
                             source=source, host=host, settings=settings, cases=tuple(results))


def load_ratios(path: str | Path | None = None) -> BackwardRatios:
    """A ratio table from ``path``, or the one shipped with hetpart (measured on the CPU its ``source`` names)."""
    return BackwardRatios.load(SHIPPED_RATIOS if path is None else Path(path))
