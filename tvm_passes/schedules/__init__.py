"""hetpart's default CPU schedules: DLight-style rules applied to CPU PrimFuncs, and the CPU Relax pipeline.

Public API (used by tvm_passes.build, tvm_passes.outline and predictors.registry):

- ``cpu_schedule_pass(target)``: module pass scheduling every unscheduled CPU PrimFunc with the rules.
- ``cpu_pipeline(target, database_dir=None)``: relax default CPU pipeline + tuning database + the rules.
- ``default_cpu_target()``: the llvm target hetpart compiles CPU kernels for.
- ``default_rules()``: the rule list, most specific first (flat-position conv, depthwise conv, conv2d, matmul,
  pooling, row reduction, concat, elementwise).
- ``prepack_conv_weights(lanes)``: Relax pass (before LegalizeOps) storing constant conv weights IHWO so the
  conv rule can vectorise over output channels; ``cpu_pipeline`` runs it, other pipelines may add it.
"""

# Bump whenever a rule or layout pass change makes an unchanged operator compile to a different kernel, so
# `hetpart profile` rebuilds stored workloads (new kernels are measured; the old rows go stale, see
# predictors.fitting.dataset.superseded_keys). 2: stride-1 1x1 convs whose rows have no divisor near the vector
# width are prepacked;
# 3: matmul column tiles are 1, 2 or 4 vectors, never 3; 4: concatenations are partitioned per input (concat rule);
# 5: exp, tanh, sigmoid, erf (and gelu, silu, softmax) are legalized to TVM's vectorisable fast versions
# (tvm_passes.legalize), not a scalar libm call per element; 6 (never released): concat chunks are whole vectors;
# 7: concat chunk runs are whole vectors or >= 128 elements; 8: a zero-width pad (TOPI's copy of an unpadded conv's
# input) is inlined into the contraction instead of copied; 9: convs whose column vectors would carry a predicated
# tail (rows of 82, 73, 149...) vectorise over output channels (whole or half registers) instead; 10: batch-1
# convs whose input outweighs their weights run in bands of output rows across the cores (tile_plan.conv_row_bands);
# 11: batch-1 dense convs with prepacked weights, or OIHW weights whose columns would not fill a register, tile
# flattened output positions (conv2d_flat); depthwise convs split rows into whole vectors plus a tail
# (conv2d_depthwise); stacks of 8 or more inputs stay kernels of their own (tvm_passes.fusion); 12: with 8-lane
# vectors (AVX2), stride-1 1x1 convs are prepacked too (tile_plan.conv_prepacks_weights); 13: with 16 vector
# registers (AVX2), the conv rule's channel-vector tiles and the matmul rule's tiles keep at most 12 accumulators
# (tile_plan.ACCUMULATORS_16_REGISTERS): more spilled to the stack; 14: sliding-window pools run planes in
# parallel with the padded input materialised per plane and the window loops outside the output row (pooling).
# (Not a bump: the rules reading a multiply-accumulate's operands through casts (base.product_loads) changed only
# float16 convs and matmuls summing in float32, a form no earlier import made (tvm_passes.half_accumulate); every
# zoo kernel and the int32 ConvInteger kernels compile as before.)
RULES_VERSION = 14

from .base import RULE_ATTR, SCHEDULED_ATTR, CpuRule, vector_lanes
from .layout import prepack_conv_weights
from .pipeline import cpu_pipeline, cpu_schedule_pass, default_cpu_target, default_rules

__all__ = [
    "RULES_VERSION",
    "RULE_ATTR",
    "SCHEDULED_ATTR",
    "CpuRule",
    "cpu_pipeline",
    "cpu_schedule_pass",
    "default_cpu_target",
    "default_rules",
    "prepack_conv_weights",
    "vector_lanes",
]
