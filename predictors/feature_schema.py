"""Which features each kernel kind's latency model reads, per feature schema version.

:data:`KIND_FEATURES` are the current schema's lists (:data:`FEATURE_SCHEMA_VERSION`);
:data:`KIND_FEATURES_BY_SCHEMA` keeps the lists of earlier schemas whose feature *definitions* are unchanged, so
predictors fitted with them load and predict with their own lists. The features themselves are defined in
:mod:`predictors.features` (``FEATURE_SCHEMA``); the comments below say why each list is what it is (the
measurements that decided it: docs/predictors_history.md). :mod:`predictors.features` re-exports every name here.
"""
from __future__ import annotations

FEATURE_SCHEMA_VERSION = 12

# Raw (positive) features each per-kind polynomial model uses; the model takes log(1 + x) itself. The first
# feature is the kernel's "work": beyond its training maximum, latency is extrapolated linearly in it.
KIND_FEATURES: dict[str, tuple[str, ...]] = {
    "conv2d": ("flops_per_sample", "bytes_per_sample", "out_spatial", "out_channels_pad8", "reduction_size",
               "stride", "kernel_area", "conv_tile_accumulators", "conv_lane_fill", "batch", "aliased_weight_share"),
    "depthwise_conv2d": ("flops", "bytes_total", "out_spatial", "out_channels_pad8", "kernel_area", "stride"),
    "matmul": ("flops", "bytes_total", "m", "n_pad8", "k", "n_alignment", "elementwise_elems",
               "matmul_tile_accumulators", "matmul_vector_width"),
    "gemv": ("flops", "bytes_total", "m", "n_pad8", "k", "n_alignment", "elementwise_elems",
             "matmul_tile_accumulators", "matmul_vector_width", "bytes_beyond_core_cache"),
    "pool": ("flops", "bytes_total", "out_elems", "kernel_area", "stride", "pool_bounds_checked"),
    "elementwise": ("bytes_total", "out_elems", "transcendental_elems", "layout_ops", "concat_chain_elems"),
    "reduction": ("bytes_total", "in_elems", "out_elems", "n_members", "transcendental_elems"),
    "data_movement": ("bytes_total", "out_elems", "layout_ops", "n_inputs"),
    "other": ("flops", "bytes_total", "out_elems"),
}
# Why each list is what it is, schema by schema, and the alternatives measured and not adopted: "Feature schema" in
# docs/predictors_history.md. In short:
# - conv2d's conv_tile_accumulators and conv_lane_fill (schema 5) describe the register tile hetpart's CPU conv rule
#   picks (tvm_passes.tile_plan): a 4-column x 2-vector tile runs at half the FLOP rate of a 7 x 2 one, and 14-lane
#   column vectors waste an eighth of every register.
# - conv2d's batch (schema 7): per sample, small convs run up to 2x faster at batch 4 than at batch 1.
# - pool_bounds_checked (schema 8): TVM guards every load of a window that can overhang its input, 2-4x slower per
#   byte than an unguarded pool.
# - matmul's tile features (schema 9), as conv2d's: how many accumulators the CPU matmul rule keeps and how wide its
#   column vector is.
# - the gemv specialist (schema 10, SPECIALIST_KINDS below).
# - pool's FLOPs first (schema 12): a pool's work is its window reads (FLOPs: output elements x window area), not its
#   bytes, which a 13x13 stride-1 pool (a YOLO detector's spatial pyramid) shares with a 3x3 one. Beyond the training
#   windows latency is scaled by the first feature, so with bytes first such a pool was predicted at 10 µs (measured
#   667 µs); with FLOPs first, 145 µs (TVM guards every load of a window that overhangs its input, slower per read).
# - conv2d's aliased_weight_share (schema 11): a conv whose output channels span a multiple of 4 KiB keeps its weight
#   rows 4 KiB apart, the period of the L1 set index, so its reduction over input channels maps them all to one set
#   (1x1 convs to 1024 or 2048 channels at 7x7 ran ~1.4x the µs per MFLOP of their neighbours). How much the misses
#   cost depends on the weights' share of the traffic, hence a share, not a flag.
#
# Kinds modelled per batch element (device_predictor.py divides their latencies by the batch before fitting and
# multiplies predictions by it; their features are those of the same kernel at batch 1). A convolution's schedule
# tiles channels and columns and runs the batch as more parallel work, so its latency is close to linear in the
# batch (ResNet-18's 3x3 convs: 3.6-3.9x from batch 1 to 4); a polynomial in (FLOPs, bytes, ...) had to learn the
# batch from the few batch-4 models instead. Depthwise convs (memory-bound) got worse per sample and keep
# whole-kernel features. (Since schema 7 the batch itself is one of conv2d's features, for what is not linear in it.)
PER_SAMPLE_KINDS = frozenset({"conv2d"})
# Schema 10's specialist: the matmuls hetpart's CPU rule schedules as matrix-vector products (an RNN step or a
# classifier at batch 1) stream their matrix once, so their time is set by where it comes from (on the Intel host
# 150-210 GB/s within the cores' L2, 50-63 GB/s from 6 to 14 MB, 16-20 GB/s beyond the last-level cache). One
# degree-2 polynomial over all matmuls smooths that cliff; the specialist is fitted on matrix-vector products only,
# with one more feature, the bytes beyond the cores' L2 (DevicePredictor.core_cache_bytes).
_MATMUL_8 = ("flops", "bytes_total", "m", "n_pad8", "k", "n_alignment", "elementwise_elems")
# Specialist kind -> the kernel kind it is a part of. Its kernels train both models; a specialist predicts them when
# it was fitted (enough samples, schema >= 10), else the parent kind's model does, as before schema 10.
SPECIALIST_KINDS: dict[str, str] = {"gemv": "matmul"}
_SCHEMA_11 = {**KIND_FEATURES, "pool": tuple(f for f in KIND_FEATURES["pool"] if f != "flops")}
_SCHEMA_10 = {**_SCHEMA_11, "conv2d": tuple(f for f in KIND_FEATURES["conv2d"] if f != "aliased_weight_share")}
_SCHEMA_9 = {kind: names for kind, names in _SCHEMA_10.items() if kind not in SPECIALIST_KINDS}
_WITHOUT_POOL_GUARD = {**_SCHEMA_9, "matmul": _MATMUL_8,
                       "pool": tuple(f for f in _SCHEMA_11["pool"] if f != "pool_bounds_checked")}
# Feature lists of earlier schemas whose feature *definitions* this schema keeps: predictors fitted with them load
# and predict with their own lists (the shipped Zen predictors are schema 6 and their databases are gone).
KIND_FEATURES_BY_SCHEMA: dict[int, dict[str, tuple[str, ...]]] = {
    6: {**_WITHOUT_POOL_GUARD, "conv2d": tuple(f for f in _SCHEMA_10["conv2d"] if f != "batch")},
    7: _WITHOUT_POOL_GUARD,
    8: {**_SCHEMA_9, "matmul": _MATMUL_8},
    9: _SCHEMA_9,
    10: _SCHEMA_10,
    11: _SCHEMA_11,
    FEATURE_SCHEMA_VERSION: KIND_FEATURES,
}
# Features left out of the distance of a kind's local residual correction (polynomial.py): the batch scales a
# depthwise convolution's FLOPs and bytes but not its schedule (tiles over channels and columns), so a kernel's
# residual carries over across batch sizes. (Per-sample kinds get this from their batch-1 features.) The same holds
# for conv2d's batch: a conv's residual at batch 2 or 8 (the sampler's batch probes) is its batch-1 twin's, but with
# the batch in the distance the probes sat ~0.9 standard deviations away and lent it little. The carry-over is not
# exact at batch 1, where the CPU rule splits output channels (since rules v10, for some convs, bands of output rows)
# across the cores instead of whole samples; the variants measured for that are in docs/predictors_history.md.
RESIDUAL_EXCLUDED: dict[str, tuple[str, ...]] = {"depthwise_conv2d": ("flops", "bytes_total"),
                                                 "conv2d": ("batch",)}
# The per-device fallback model for kinds without a fitted model uses only these, as a power law (degree 1:
# a degree-2 fallback was tried and mispredicted unseen kinds by up to 4x on synthetic leave-one-family-out).
FALLBACK_FEATURES: tuple[str, ...] = ("bytes_total", "flops")
