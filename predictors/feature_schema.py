"""Which features each kernel kind's latency model reads, per feature schema version.

:data:`KIND_FEATURES` are the current schema's lists (:data:`FEATURE_SCHEMA_VERSION`);
:data:`KIND_FEATURES_BY_SCHEMA` keeps the lists of earlier schemas whose feature *definitions* are unchanged, so
predictors fitted with them load and predict with their own lists. The features themselves are defined in
:mod:`predictors.features` (``FEATURE_SCHEMA``); the comments below record why each list is what it is, with the
measurements that decided it. :mod:`predictors.features` re-exports every name here.
"""
from __future__ import annotations

FEATURE_SCHEMA_VERSION = 11

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
    "pool": ("bytes_total", "out_elems", "kernel_area", "stride", "pool_bounds_checked"),
    "elementwise": ("bytes_total", "out_elems", "transcendental_elems", "layout_ops", "concat_chain_elems"),
    "reduction": ("bytes_total", "in_elems", "out_elems", "n_members", "transcendental_elems"),
    "data_movement": ("bytes_total", "out_elems", "layout_ops", "n_inputs"),
    "other": ("flops", "bytes_total", "out_elems"),
}
# Schema 11 adds conv2d's aliased_weight_share (predictors.features): a conv whose output channels span a multiple
# of 4 KiB keeps its weight rows 4 KiB apart, the period of the L1 set index, so its reduction over input channels
# maps them all to one set. Measured on the Zen 4 host (profiles_session18a), 1x1 convs from 256 channels at 7x7,
# batch 1, µs per MFLOP: 256, 512, 768, 1280, 1536 output channels 5.2-5.4; 1024 and 2048 7.1-7.4 (ResNet-50's
# 256->1024 with a residual add: 190 µs, predicted 149 with ResNet-50 held out). At 14x14 the same convs ran
# 5.0-5.1 whether aliased or not: the weights' share of the traffic decides how much the misses cost, hence the
# share, not a flag. Leave-one-model-out (kernels >= 100 µs MAPE / within ±10%, whole models MAPE / worst; cache
# bound 32 MiB): profiles_session18a 3.73 / 88.7% -> 3.14 / 90.7%, 4.69 / 25.2% -> 4.58 / 21.1%; profiles_session17a
# 4.13 / 88.6% -> 3.49 / 90.8%, 3.06 / 6.8% -> 3.03 / 7.1%. A 0/1 flag instead: 3.18 / 91.7% and 3.58 / 90.4%, but
# it put ResNet-50's aliased 1x1 convs at 14x14 18% high on 17a.
# conv2d's last two features describe the register tile hetpart's CPU conv rule picks (tvm_passes.tile_plan): a
# tile of 4 columns x 2 vectors (ResNet-50's 4x4 maps at 112 px) runs at half the FLOP rate of 7 x 2 (its 7x7 maps at
# 224 px), and 14-lane column vectors waste an eighth of every register. Without them the polynomial predicted
# ResNet-50's 1x1 convs -42% at 4x4 and +60% at 7x7. Leave-one-model-out (profiles_session5b): kernels >= 100 µs
# 6.8% -> 5.9% MAPE, 79.8% -> 82.3% within ±10%; kernels 10-100 µs 12.2% -> 11.6%. A third, binary feature
# (weights prepacked or not) helped kernels >= 100 µs a little more (5.7%) but took 10-100 µs convs from 4.5% to
# 9.4% MAPE, so it was left out.
# Kinds modelled per batch element (device_predictor.py divides their latencies by the batch before fitting and
# multiplies predictions by it; their features are those of the same kernel at batch 1). A convolution's schedule
# tiles channels and columns and runs the batch as more parallel work, so its latency is close to linear in the
# batch: ResNet-18's 3x3 convs measured 3.6-3.9x from batch 1 to 4. A polynomial in (FLOPs, bytes, ...) instead
# had to learn the batch from the few batch-4 models, and predicted held-out batch-4 convs up to 48% low.
# Measured on leave-one-model-out (profiles_session4b): kernels >= 100 µs MAPE 11.1% -> 10.0%, within ±10% 60.6%
# -> 66.4%, model MAPE 7.8% -> 7.4%. Depthwise convs (memory-bound, batch 4 in one model only) got worse per
# sample (+140% on MobileNetV2 b4) and keep whole-kernel features.
# (Since schema 7 the batch itself is one of conv2d's features, for what is not linear in it: see below.)
PER_SAMPLE_KINDS = frozenset({"conv2d"})
# Schema 7 adds the batch to conv2d's features: per sample, a conv is not equally fast at every batch. Small
# convs (1x1, 16-32 output channels) ran 1.6-2.1x faster per sample at batch 4 than at batch 1 on the Intel host
# (SqueezeNet's 64->16 at 55x55: 187 µs at batch 1, 355 µs at batch 4), so the per-sample model predicted
# held-out batch-4 models' convs up to 2.1x high and batch-1 ones up to 2x low. Leave-one-model-out on
# profiles_session12a (Intel, the only database at hand): kernels >= 100 µs MAPE 12.4% -> 8.8%, within ±10%
# 70.0% -> 79.0%; kernels 10-100 µs 11.1% -> 8.8%; model MAPE 16.0% -> 14.0%.
# Schema 8 tells a pool whose windows can overhang its input from one whose windows cannot. TVM guards every load
# of an overhanging window (padding, or ceil_mode rounding the output up) and the guarded loop ran 2-4x slower per
# byte on the Intel host: VGG's unpadded 2x2 max-pools 17-23 µs/MB, the synthetic variations around them (padded by
# the sampler, k // 2) 90-105; SqueezeNet's 3x3 ceil-mode pools at 111 and 55 px (no overhang) 41-46 µs/MB,
# GoogLeNet's at 112 px (overhang) 87. Without the feature the polynomial predicted VGG's pools 2.2-2.5x high and
# SqueezeNet's 1.7x high when their model was held out.
# Tried and not adopted (session 14): the elementwise member count (``elementwise_elems``) as an elementwise
# feature. BERT-small's GELU kernel (divide, erf, add, multiply, multiply) took 104 µs for 524K elements and was
# predicted 26 µs with BERT-small at batch 4 held out; with the feature, leave-one-model-out on profiles_session14a
# went from 26.1% to 13.6% elementwise MAPE and from 16.5% to 13.3% over all kernels, but whole models from 7.0% to
# 7.1% MAPE (worst 17.4% -> 20.0%), and leave-one-family-out from 55.3% to 63.0% kernel MAPE (10-100 µs: 51.7% ->
# 65.4%) and 17.7% to 18.4% model MAPE: the member count carried badly to unseen model families.
# Session 16 tried a narrower one, out_elems x the members TVM computes as vectorised polynomials (exp, tanh,
# sigmoid, erf, gelu, silu), with the same outcome: leave-one-model-out MAPE over all kernels 15.1 / 15.8 / 14.4% ->
# 10.3 / 10.9 / 9.5% (profiles_session15c / 15a / 15b), but whole models 7.00 / 6.79 / 6.95% -> 7.18 / 6.99 / 7.22%,
# and leave-one-family-out kernels 10-100 µs 38.6 / 41.0 / 38.7% -> 53.1 / 54.7 / 53.7%.
# Schema 9 gives matmul the register tile hetpart's CPU matmul rule picks (tvm_passes.tile_plan), as conv2d has
# had since schema 5: how many accumulators it keeps (an LSTM step's 1x650 @ 650x2608 product gets 8 column vectors,
# the same product at batch 4 only 4 rows x 1 vector) and how wide its column vector is (a power of two of
# registers, or half / a quarter of one for ragged N). Measured leave-one-model-out (session 15; a/b = the two
# Intel databases profiles_session15a/15b): kernels >= 100 µs 9.4% / 7.2% -> 9.4% / 6.9% MAPE, 67.5% / 71.0% ->
# 67.4% / 81.1% within ±10%; whole models 6.82% / 7.22% -> 6.52% / 7.07%; leave-one-family-out whole models
# 17.6% / 16.1% -> 15.8% / 14.0%, worst 69.0% / 63.6% -> 34.5% / 33.6% (BERT-small, which no other family
# resembles). The tile's tail (rows or N the tile does not divide) as a third feature made kernels >= 100 µs worse
# (10.5% / 8.1%).
# Schema 10 adds a specialist model (SPECIALIST_KINDS, below) for the matmuls hetpart's CPU rule schedules as
# matrix-vector products (an RNN step at batch 1, a classifier at batch 1). They stream their matrix once, so their
# time is set by where it comes from: on the Intel host 150-210 GB/s while the operands fit in the two cores' L2
# (4 MiB), 50-63 GB/s from 6 to 14 MB, 16-20 GB/s beyond the last-level cache. One degree-2 polynomial over all
# matmuls smoothed that cliff: an LSTM step's 1x650 @ 650x2608 product (6.8 MB, 114 µs, 68 instances in its model) was
# predicted 73 µs before the residual correction and 93 µs after it (-18%) with the LSTM held out. The specialist is
# fitted on matrix-vector products only, with one more feature: the bytes beyond the cores' L2
# (DevicePredictor.core_cache_bytes). It predicts that product at 102 µs (-10%). Measured on three Intel databases
# (profiles_session15c / 15a / 15b), leave-one-model-out: kernels >= 100 µs 7.0 / 9.4 / 6.9% -> 6.1 / 8.1 / 6.2% MAPE,
# within ±10% 75.0 / 67.4 / 81.1% -> 85.9 / 78.6 / 81.1%; kernels 10-100 µs unchanged (7.7 / 8.8 / 7.9%); whole models
# 7.04 / 6.52 / 7.07% -> 7.00 / 6.79 / 6.95%. Leave-one-family-out: kernels 10-100 µs 52.0 / 52.3 / 50.5% -> 38.6 /
# 41.0 / 38.7%, whole models 14.6 / 15.7 / 14.0% -> 12.8 / 13.8 / 12.4%, but kernels >= 100 µs within ±10% 59.1 / 53.6
# / 56.2% -> 59.1 / 42.4 / 45.4% (the LSTM's 68 step products, held out with their family, went from -5% to +15% on
# 15a). On five older databases (profiles_session12a-14b, rules v7-v8) kernels >= 100 µs MAPE fell on all five (by
# 0.1-1.2 points), within ±10% rose 11 points on two (14a, 13b) and stayed on three, and whole models moved by -0.12
# to +0.27 points (+0.05 on average over all eight databases). Tried: the same feature on every matmul without a
# specialist (15c 86.1% within ±10%, but 15a / 15b 66.7 / 81.1%, whole models 6.59 / 7.30%); a specialist without it
# (the LSTM step stayed at -18%); a specialist whose kernels leave the matmul model's training (leave-one-family-out
# within ±10% 34.8 / 37.4% on 15a / 15b: the LSTM at batch 4, a 4-row product, lost the support of its batch-1 twins).
# The L2 of one core (2 MiB) as the threshold instead of the two cores' left the LSTM step at -15% on 15c (75.0%
# within ±10%).
_MATMUL_8 = ("flops", "bytes_total", "m", "n_pad8", "k", "n_alignment", "elementwise_elems")
# Specialist kind -> the kernel kind it is a part of. Its kernels train both models; a specialist predicts them when
# it was fitted (enough samples, schema >= 10), else the parent kind's model does, as before schema 10.
SPECIALIST_KINDS: dict[str, str] = {"gemv": "matmul"}
_SCHEMA_10 = {**KIND_FEATURES, "conv2d": tuple(f for f in KIND_FEATURES["conv2d"] if f != "aliased_weight_share")}
_SCHEMA_9 = {kind: names for kind, names in _SCHEMA_10.items() if kind not in SPECIALIST_KINDS}
_WITHOUT_POOL_GUARD = {**_SCHEMA_9, "matmul": _MATMUL_8,
                       "pool": tuple(f for f in KIND_FEATURES["pool"] if f != "pool_bounds_checked")}
# Feature lists of earlier schemas whose feature *definitions* this schema keeps: predictors fitted with them load
# and predict with their own lists (the shipped Zen predictors are schema 6 and their databases are gone).
KIND_FEATURES_BY_SCHEMA: dict[int, dict[str, tuple[str, ...]]] = {
    6: {**_WITHOUT_POOL_GUARD, "conv2d": tuple(f for f in _SCHEMA_10["conv2d"] if f != "batch")},
    7: _WITHOUT_POOL_GUARD,
    8: {**_SCHEMA_9, "matmul": _MATMUL_8},
    9: _SCHEMA_9,
    10: _SCHEMA_10,
    FEATURE_SCHEMA_VERSION: KIND_FEATURES,
}
# Features left out of the distance of a kind's local residual correction (polynomial.py): the batch scales a
# depthwise convolution's FLOPs and bytes but not its schedule (tiles over channels and columns), so a kernel's
# residual carries over across batch sizes. (Per-sample kinds get this from their batch-1 features.)
# The same holds for conv2d's batch (a feature since schema 7): a conv's residual at batch 2 or 8 (the sampler's
# batch probes) is what its batch-1 twin's residual is, but with the batch in the distance the probes sat ~0.9
# standard deviations away from it and lent it little: ResNet-50's 256->256 3x3 stride-2 conv at 28 px, measured
# 1623 µs at batch 1 and 1337 µs per sample at batch 2, was predicted 964 µs with ResNet-50 at 224 px held out.
# Leave-one-model-out, with the finer bandwidth grid of polynomial.py: kernels >= 100 µs 10.7% -> 9.7% MAPE and
# 64.9% -> 67.7% within ±10% (profiles_session14a), 8.6% -> 7.6% and 68.6% -> 70.2% (profiles_session14b); whole
# models 7.00% -> 6.96% and 7.75% -> 7.38%. (Without the batch probes, profiles_session13b: 11.0% -> 10.7%
# on kernels, whole models 7.6% -> 8.2%.)
# The carry-over is not exact at batch 1. There the CPU rule gives each core half the output channels, and at batch 2
# or more it gives each core whole samples (tvm_passes/schedules/contraction.py parallelises the outer loops in
# order). Measured on the Intel host (session 17), batch 1 against batch 2 per sample: 3x3 stride-2 convs 1.23-1.57x
# slower (ResNet-50's 128->128 at 56 px: 1232 vs 799 µs), 64->64 3x3 at 56 px 1.37x slower, most others within 5%.
# That is the largest class of leave-one-model-out misses left on profiles_session15c: ResNet's batch-1 stride-2
# convs were predicted at their batch-2/8 probes' rate, 16-35% low. Tried on 15c (kernels >= 100 µs MAPE / within
# ±10%, whole-model MAPE; baseline 6.1% / 85.9%, 7.00%), none adopted:
# - the batch back in the residual distance, scaled by 0.3 / 0.6 / 1.0: 6.1 / 85.1, 7.06; 6.4 / 82.9, 7.40;
#   6.9 / 81.6, 7.40. The probes are still the best evidence for most batch-1 kernels.
# - a batch < cores indicator as a conv2d feature, out of / in the residual distance: 6.1 / 85.5, 7.12;
#   7.2 / 81.9, 7.05 (ridge learns the step only partly: 1.09x where 1.57x was measured).
# - a batch-1 conv2d specialist like gemv (fitted on batch-1 kernels, the general model on all): 6.6 / 83.7, 7.85;
#   with batch-1 kernels left out of the general model: 7.1 / 81.4, 7.81.
# - a conv's residual-add operand bytes moved out of bytes_per_sample into their own feature: 6.3 / 82.9, 7.44.
#   Dropped altogether: 6.0 / 84.7, 7.25. ResNet-50's 1x1 convs with a residual add are predicted 13-38% high.
# Rules v10 then made the CPU rule split such batch-1 convs into bands of output rows (tile_plan.conv_row_bands).
# The band count as a conv2d feature (mirroring the rule from the operand shapes and the target's cores) did not help
# on the Zen 4 host's profiles_session17a, leave-one-model-out (kernels >= 100 µs MAPE / within ±10%, whole models;
# baseline 4.13% / 88.6%, 5.23%): the count 4.60 / 86.9, 5.37; a banded-or-not indicator 4.79 / 86.9, 5.54; the
# count left out of the residual distance 4.39 / 87.3, 5.32. Not adopted.
RESIDUAL_EXCLUDED: dict[str, tuple[str, ...]] = {"depthwise_conv2d": ("flops", "bytes_total"),
                                                 "conv2d": ("batch",)}
# The per-device fallback model for kinds without a fitted model uses only these, as a power law (degree 1:
# a degree-2 fallback was tried and mispredicted unseen kinds by up to 4x on synthetic leave-one-family-out).
FALLBACK_FEATURES: tuple[str, ...] = ("bytes_total", "flops")
