"""Which kernels to measure under a time budget: the zoo's kernels first, then synthetic variations around them.

Sources of workloads, in tiers (lower tiers are measured first):

* tier 0 -- every distinct fused kernel of every zoo model at batch 1 and its default size (what users deploy);
* tier 1 -- the zoo at other batch sizes / image sizes / sequence lengths (:data:`ZOO_VARIANTS`);
* tier 2 -- synthetic single-kernel Relax modules (conv2d+bias+relu, conv2d+bias+residual+relu, depthwise
  conv+bias+clip, matmul+bias, max-pool, add+relu, ``t`` sigmoid/tanh/erf gates of one input multiplied together
  as in RNN cells and GELU, layer norm, softmax) whose parameters are varied *around* the geometries seen in
  tiers 0 and 1: channels, spatial size, window, stride, groups, batch, rows/columns and chain length
  (:func:`synthetic_specs`), so the fitted models see neighbours of the kernels they will be asked about, not only
  the kernels themselves. Tier-1 seeds
  matter: a batch-4 transformer or RNN puts 4x the rows of any batch-1 kernel into its matmuls.

Synthetic modules (built by :mod:`predictors.profiling.synthetic_modules`) go through exactly the same path as the zoo
models (``predictors.profiling.zoo_profile``): features from ``tvm_passes.extract``'s kernel graph, kernels from the
deployment pipeline. :func:`prioritise` dedupes
candidates by workload key (the lowest tier wins) and orders them by (tier, expected measuring cost), so a budget
that runs out covers as many distinct kernels as possible of the tiers that matter most.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from hetpart.errors import PredictorError
from hetpart.graph import OpNode
from predictors.synthetic_spec import SyntheticSpec

TIER_ZOO_DEFAULT, TIER_ZOO_VARIANT, TIER_SYNTHETIC = 0, 1, 2
# Bump when a synthetic spec builds a different module for the same parameters: `hetpart profile` then builds
# and measures every spec again (2: gates are parallel, not chained).
SYNTHETIC_VERSION = 2

# Expected cost of measuring one kernel: compile + probe + (attempts x repeats) x max(min_repeat, latency).
COMPILE_S = 1.0
TIMED_CALLS = 3 + 2 * 7              # probe runs + two attempts of 7 repeats (typical)
MIN_REPEAT_S = 1e-3
ASSUMED_FLOPS_PER_S = 30e9           # only orders candidates; never used as a prediction
ASSUMED_BYTES_PER_S = 5e9


@dataclass(frozen=True)
class ModelVariant:
    """One zoo model at one batch size and input size (``size``: image side, or sequence length)."""

    model: str
    batch: int
    size: int
    family: str
    tier: int

    @property
    def name(self) -> str:
        return f"{self.model}_b{self.batch}_s{self.size}"


# (model, batch, size) beyond batch 1 at the default size: image size 112 and batch 4 for CNNs, other
# sequence lengths / batches for the language models.
ZOO_VARIANTS: tuple[tuple[str, int, int], ...] = (
    ("resnet18", 1, 112), ("resnet18", 4, 224), ("resnet50", 1, 112), ("mobilenetv2", 4, 224),
    ("mobilenetv2", 1, 112), ("squeezenet1_1", 4, 224), ("googlenet", 1, 112), ("vgg16", 1, 112),
    ("densenet121", 1, 112), ("lstm_lm", 4, 35), ("gru_lm", 1, 70), ("bert_small", 1, 64),
    ("bert_small", 4, 128),
)


def zoo_variants(include_variants: bool = True, models: Sequence[str] | None = None) -> list[ModelVariant]:
    """Every zoo model at batch 1 / default size (tier 0), then :data:`ZOO_VARIANTS` (tier 1)."""
    from models import ZOO

    names = list(ZOO) if models is None else list(models)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise PredictorError(f"unknown zoo model(s) {unknown}; the zoo has {sorted(ZOO)}")
    out = [ModelVariant(n, 1, ZOO[n].default_size, ZOO[n].family, TIER_ZOO_DEFAULT) for n in names]
    if include_variants:
        out += [ModelVariant(m, b, s, ZOO[m].family, TIER_ZOO_VARIANT) for m, b, s in ZOO_VARIANTS if m in names]
    return out


# ---------------------------------------------------------------------------------------------- synthetic
def _near(value: int, factors: Sequence[float], minimum: int = 1) -> list[int]:
    return sorted({max(minimum, int(round(value * f))) for f in factors} - {value})


# Members that seed "gates" variations: activation / math functions, whatever they cost on the current compiler.
# Deliberately not the predictor's costly-op feature: the specs (and the seeded subsample of them) must not change
# when a compiler change makes some of these cheap, or stored synthetic measurements stop being used.
_GATE_SEED_OPS = frozenset({"exp", "log", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "power", "divide", "nn.gelu",
                            "nn.gelu_tanh", "nn.silu", "nn.softplus", "nn.selu", "sin", "cos", "tan", "hard_swish",
                            "nn.softmax", "nn.log_softmax"})


def gate_op_count(node: OpNode) -> int:
    """Members of ``node`` that seed "gates" variations (:data:`_GATE_SEED_OPS`)."""
    from predictors.features import member_ops

    return sum(m in _GATE_SEED_OPS for m in member_ops(node))


# Batch variations of weight-heavy convolutions (:func:`batch_probe_specs`), measured in addition to the capped
# sample. A conv is modelled per batch element with the batch as a feature; the capped sample's batch variations
# (one per seed, a few dozen kept) were almost all small convs, which run up to 2x faster per sample at batch 4.
# The polynomial carried that speed-up to convs whose weights dominate their traffic and which scale at least
# linearly: ResNet-18's 512->512 3x3 conv at 7x7 took 1.5 ms at batch 1 and 6.5-6.7 ms at batch 4, predicted
# 3.0 ms with ResNet-18 at batch 4 held out (I-C in docs/predictors_history.md). Batches 2 and 8 bracket the zoo's
# batch 4 without duplicating a zoo kernel (which would leak held-out kernels into leave-one-model-out training).
BATCH_PROBE_MIN_PARAM_BYTES = 512 * 1024
BATCH_PROBE_BATCHES = (2, 8)
BATCH_PROBE_MAX_FLOPS = 8e9          # per call at the probe batch: keeps each measurement well under a second


def batch_probe_specs(zoo_nodes: Iterable[OpNode]) -> set[SyntheticSpec]:
    """conv2d specs at :data:`BATCH_PROBE_BATCHES` for every batch-1 zoo conv (square window, one group) with at
    least :data:`BATCH_PROBE_MIN_PARAM_BYTES` of weights and at most :data:`BATCH_PROBE_MAX_FLOPS` per call."""
    from predictors.features import feature_vector, kernel_kind

    specs: set[SyntheticSpec] = set()
    for node in zoo_nodes:
        if kernel_kind(node) != "conv2d" or node.param_bytes < BATCH_PROBE_MIN_PARAM_BYTES:
            continue
        f = feature_vector(node)
        if int(f["batch"]) != 1 or f["kernel_h"] != f["kernel_w"] or f["groups"] != 1 or f["in_channels"] < 1:
            continue
        for batch in BATCH_PROBE_BATCHES:
            if batch * float(f["flops_per_sample"]) <= BATCH_PROBE_MAX_FLOPS:
                specs.add(SyntheticSpec.of("conv2d", **{**_conv_base(f), "n": batch}))
    return specs


def _conv_base(f: dict[str, float]) -> dict[str, int]:
    """A conv spec's parameters for a conv-anchored kernel's features (square window, input side from the output)."""
    stride = int(f["stride"])
    return dict(n=int(f["batch"]), ci=int(f["in_channels"]), co=int(f["out_channels"]),
                hw=max(1, int(f["out_height"]) * stride), k=int(f["kernel_h"]), stride=stride)


def _conv_variations(base: dict[str, int]) -> list[dict[str, int]]:
    """One parameter of a conv spec changed at a time: channels in and out, input size, window, stride, batch."""
    out = [{**base, "ci": ci} for ci in _near(base["ci"], (0.5, 0.75, 1.5))]
    out += [{**base, "co": co} for co in _near(base["co"], (0.5, 0.75, 1.25, 1.5))]
    out += [{**base, "hw": hw} for hw in _near(base["hw"], (0.5, 0.75, 1.5), minimum=4)]
    out += [{**base, "k": 3 if base["k"] == 1 else 1}, {**base, "stride": 2 if base["stride"] == 1 else 1},
            {**base, "n": 2 if base["n"] == 1 else 1}]
    return out


def has_residual_add(node: OpNode) -> bool:
    """A conv-anchored kernel whose epilogue adds a second tensor after the bias (ResNet's and MobileNetV2's
    residual connections: members conv2d, add, add[, relu])."""
    from predictors.features import member_ops

    ops = member_ops(node)
    return len(ops) >= 3 and ops[0] == "nn.conv2d" and ops[1] == "add" and ops[2] == "add"


# Variations of the zoo's convs with a residual add in their epilogue (ResNet, MobileNetV2), measured in addition
# to the capped sample (:func:`residual_specs`). The capped sample's convs all end in bias + relu, so the residual's
# bytes were seen only in zoo kernels, and the polynomial priced them like any other traffic: ResNet-50's 1x1 convs
# with a residual add (64->256 at 56 px: 552 µs measured, 3% more than the same conv without it) were predicted 19-33%
# high with ResNet-50 held out, while the conv streams the residual into each register tile as it finishes it.
# With these kernels, leave-one-model-out kernels >= 100 µs went from 4.1-4.4% to 3.7% MAPE on two Zen 4 databases,
# whole models within a quarter point (measurements: docs/predictors_history.md).
def residual_specs(zoo_nodes: Iterable[OpNode]) -> set[SyntheticSpec]:
    """``conv2d_residual`` variations (:func:`_conv_variations`) of every zoo conv with a residual add, except those
    whose geometry is a zoo kernel's own (a held-out model's kernel must not return as synthetic training data)."""
    from predictors.features import feature_vector, kernel_kind

    seeds = [feature_vector(node) for node in zoo_nodes if kernel_kind(node) == "conv2d" and has_residual_add(node)]
    seeds = [f for f in seeds if f["kernel_h"] == f["kernel_w"] and f["groups"] == 1 and f["in_channels"] >= 1]
    own = {tuple(sorted(_conv_base(f).items())) for f in seeds}
    return {SyntheticSpec.of("conv2d_residual", **params) for f in seeds for params in _conv_variations(_conv_base(f))
            if tuple(sorted(params.items())) not in own}


# Softmax variations (:func:`softmax_specs`), beyond the cap like the two above: without them BERT's softmax was
# predicted from layer norms and mean reductions, 14-16% low with its model held out. 13 specs, ~2 s per pass; they
# took leave-one-model-out kernels >= 100 µs about 0.15 points of MAPE lower, whole models within 0.1 points
# (docs/predictors_history.md).
def softmax_specs(zoo_nodes: Iterable[OpNode]) -> set[SyntheticSpec]:
    """``softmax`` variations (rows x 0.25-4, row length x 0.5 and 2) of every zoo softmax kernel, except its own
    shape."""
    seeds = {(max(1, int(np.prod(node.output_shapes[0][:-1]))), int(node.output_shapes[0][-1]))
             for node in zoo_nodes if "nn.softmax" in node.op and node.output_shapes and node.output_shapes[0]}
    out = set()
    for m, n in seeds:
        out |= {SyntheticSpec.of("softmax", m=rows, n=n) for rows in _near(m, (0.25, 0.5, 2.0, 4.0))}
        out |= {SyntheticSpec.of("softmax", m=m, n=cols) for cols in _near(n, (0.5, 2.0))}
    return {spec for spec in out if (spec.params["m"], spec.params["n"]) not in seeds}


def synthetic_specs(zoo_nodes: Iterable[OpNode], max_specs: int = 1200, seed: int = 0) -> list[SyntheticSpec]:
    """Variations around the zoo's conv / matmul / pool kernels, one parameter changed at a time.

    ``zoo_nodes``: kernel-level nodes of the zoo models at every batch and size (their kinds and geometry seed the
    variations). At most ``max_specs`` specs, shared out among the ops by :func:`balanced_subsample` when there
    are more, always deduped; plus the :func:`batch_probe_specs` (sorted by name with them). The probes were added
    without a :data:`SYNTHETIC_VERSION` bump: the capped sample is unchanged, so a database profiled before keeps
    its synthetic rows and ``hetpart profile`` measures only the probes.
    """
    from predictors.features import feature_vector, kernel_kind

    zoo_nodes = list(zoo_nodes)
    specs: set[SyntheticSpec] = set()

    def add(op: str, **params: int) -> None:
        specs.add(SyntheticSpec.of(op, **params))

    for node in zoo_nodes:
        kind, f = kernel_kind(node), feature_vector(node)
        n, hw_out = int(f["batch"]), int(f["out_height"])
        stride = int(f["stride"])
        if kind == "conv2d" and f["in_channels"] >= 1 and f["out_channels"] >= 1 and f["kernel_h"] == f["kernel_w"]:
            for params in _conv_variations(_conv_base(f)):
                add("conv2d", **params)
        elif kind == "depthwise_conv2d" and f["out_channels"] >= 1:
            base = dict(n=n, c=int(f["out_channels"]), hw=max(1, hw_out * stride), k=max(1, int(f["kernel_h"])),
                        stride=stride)
            for c in _near(base["c"], (0.5, 0.75, 1.5)):
                add("depthwise_conv2d", **{**base, "c": c})
            for hw in _near(base["hw"], (0.5, 1.5), minimum=4):
                add("depthwise_conv2d", **{**base, "hw": hw})
            add("depthwise_conv2d", **{**base, "k": 5 if base["k"] == 3 else 3})
            add("depthwise_conv2d", **{**base, "stride": 2 if stride == 1 else 1})
            add("depthwise_conv2d", **{**base, "n": 4 if n == 1 else 1})
        elif kind == "matmul" and f["m"] >= 1 and f["n"] >= 1 and f["k"] >= 1:
            base = dict(m=int(f["m"]), k=int(f["k"]), n=int(f["n"]))
            for axis in ("m", "k", "n"):
                for v in _near(base[axis], (0.5, 1.5, 2.0)):
                    add("matmul", **{**base, axis: v})
        elif kind == "pool" and f["out_channels"] >= 1 and f["kernel_h"] > 1:
            base = dict(n=n, c=int(f["out_channels"]), hw=max(2, hw_out * stride), k=int(f["kernel_h"]), stride=stride)
            for c in _near(base["c"], (0.5, 1.5)):
                add("max_pool2d", **{**base, "c": c})
            add("max_pool2d", **{**base, "hw": max(4, base["hw"] // 2)})
        elif kind == "elementwise" and gate_op_count(node) >= 1 and node.output_shapes:
            out = node.output_shapes[0]
            base = dict(m=max(1, int(np.prod(out[:-1]))), n=int(out[-1]) if out else 1, t=gate_op_count(node))
            for m in _near(base["m"], (0.25, 0.5, 2.0, 4.0)):
                add("gates", **{**base, "m": m})
            for cols in _near(base["n"], (0.5, 1.5)):
                add("gates", **{**base, "n": cols})
            for t in _near(base["t"], (0.5, 2.0)):
                add("gates", **{**base, "t": t})
        elif kind == "reduction" and "nn.layer_norm" in node.op and node.output_shapes:
            out = node.output_shapes[0]
            base = dict(m=max(1, int(np.prod(out[:-1]))), n=int(out[-1]))
            for m in _near(base["m"], (0.25, 0.5, 2.0, 4.0)):
                add("layer_norm", **{**base, "m": m})
            for cols in _near(base["n"], (0.5, 2.0)):
                add("layer_norm", **{**base, "n": cols})
        elif kind == "elementwise" and len(node.output_shapes) == 1 and len(node.output_shapes[0]) == 4:
            n4, c4, h4, _ = node.output_shapes[0]
            for c in _near(int(c4), (0.5, 2.0)):
                add("add_relu", n=int(n4), c=c, hw=int(h4))
    extra = batch_probe_specs(zoo_nodes) | residual_specs(zoo_nodes) | softmax_specs(zoo_nodes)
    return sorted(set(balanced_subsample(specs, max_specs, seed)) | extra, key=lambda spec: spec.name)


def balanced_subsample(specs: Iterable[SyntheticSpec], max_specs: int, seed: int = 0) -> list[SyntheticSpec]:
    """At most ``max_specs`` of ``specs``, sorted by name, shared out equally among their ops (water-filling).

    An op with fewer specs than its share keeps them all and leaves the rest to the others, so the op with the
    most variations (conv2d: thousands) cannot crowd out the few matmul or gate variations, as a uniform sample
    did. Within an op the sample is seeded, so the same specs are chosen on every run.
    """
    if max_specs < 0:
        raise PredictorError(f"max_specs must be >= 0; found {max_specs}")
    by_op: dict[str, list[SyntheticSpec]] = {}
    for spec in sorted(set(specs), key=lambda s: s.name):
        by_op.setdefault(spec.op, []).append(spec)
    quota, left = {}, max_specs
    for k, op in enumerate(sorted(by_op, key=lambda o: (len(by_op[o]), o))):   # smallest first
        quota[op] = min(len(by_op[op]), left // (len(by_op) - k))
        left -= quota[op]
    chosen = [spec for op, group in by_op.items()
              for spec in (group if quota[op] == len(group) else random.Random(f"{seed}:{op}").sample(group, quota[op]))]
    return sorted(chosen, key=lambda s: s.name)


# ---------------------------------------------------------------------------------------------- ordering
def expected_measure_s(flops: float, bytes_total: float) -> float:
    """Rough wall time to compile and time one kernel (orders candidates only; never a latency prediction)."""
    latency_s = max(flops / ASSUMED_FLOPS_PER_S, bytes_total / ASSUMED_BYTES_PER_S)
    return COMPILE_S + TIMED_CALLS * max(MIN_REPEAT_S, latency_s)


@dataclass(frozen=True)
class Candidate:
    """A workload that could be measured, where it comes from and what measuring it is expected to cost."""

    key_hash: str
    tier: int
    expected_s: float
    source: str                  # model variant or synthetic spec name
    workload: Any = None         # predictors.profiling.workloads.KernelWorkload (opaque here)

    @property
    def name(self) -> str:
        return getattr(self.workload, "name", self.key_hash)


def prioritise(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Dedupe by workload key (lowest tier, then cheapest, wins) and order by (tier, expected cost, key)."""
    best: dict[str, Candidate] = {}
    for c in candidates:
        if not (math.isfinite(c.expected_s) and c.expected_s > 0):
            raise PredictorError(f"candidate {c.key_hash} from {c.source}: expected_s must be finite and > 0; "
                                 f"found {c.expected_s}")
        old = best.get(c.key_hash)
        if old is None or (c.tier, c.expected_s) < (old.tier, old.expected_s):
            best[c.key_hash] = c
    return sorted(best.values(), key=lambda c: (c.tier, c.expected_s, c.key_hash))


def fits_budget(ordered: Sequence[Candidate], budget_s: float) -> list[Candidate]:
    """The prefix of ``ordered`` whose summed expected cost stays within ``budget_s`` (a planning estimate)."""
    out, total = [], 0.0
    for c in ordered:
        if total + c.expected_s > budget_s:
            break
        out.append(c)
        total += c.expected_s
    return out
