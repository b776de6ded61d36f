"""Workload sampling: zoo variants, synthetic variations, dedupe and budget ordering."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors.profiling import sampling
from predictors.features import kernel_kind
from predictors.profiling.sampling import Candidate
from predictors.synthetic_spec import SyntheticSpec
from predictors.profiling.synthetic_modules import build_synthetic_module
from tests.predictors.synthetic_kernels import conv_node, elementwise_node, matmul_node, pool_node


def test_zoo_variants_put_every_default_model_first_with_unique_names():
    from models import ZOO

    variants = sampling.zoo_variants()
    tiers = [v.tier for v in variants]
    assert tiers == sorted(tiers)
    defaults = [v for v in variants if v.tier == sampling.TIER_ZOO_DEFAULT]
    assert {v.model for v in defaults} == set(ZOO)
    assert all(v.batch == 1 and v.size == ZOO[v.model].default_size for v in defaults)
    assert len({v.name for v in variants}) == len(variants)
    assert any(v.batch > 1 for v in variants) and any(v.size != ZOO[v.model].default_size for v in variants)
    assert sampling.zoo_variants(include_variants=False, models=["resnet18"])[0].name == "resnet18_b1_s224"
    with pytest.raises(PredictorError, match="unknown zoo model"):
        sampling.zoo_variants(models=["alexnet"])


def test_prioritise_dedupes_by_key_keeping_the_lowest_tier_and_orders_by_tier_then_cost():
    cands = [Candidate("a", 2, 5.0, "syn"), Candidate("a", 0, 9.0, "zoo"), Candidate("b", 1, 1.0, "zoo2"),
             Candidate("c", 0, 3.0, "zoo"), Candidate("c", 0, 2.0, "zoo_again"), Candidate("d", 2, 0.5, "syn")]
    ordered = sampling.prioritise(cands)
    assert [c.key_hash for c in ordered] == ["c", "a", "b", "d"]
    assert ordered[0].source == "zoo_again" and ordered[1].tier == 0      # cheapest / lowest tier won
    with pytest.raises(PredictorError, match="expected_s"):
        sampling.prioritise([Candidate("x", 0, float("nan"), "zoo")])


def test_fits_budget_takes_the_prefix_that_fits():
    ordered = sampling.prioritise([Candidate(str(i), 0, float(i + 1), "zoo") for i in range(10)])
    chosen = sampling.fits_budget(ordered, budget_s=10.0)
    assert [c.key_hash for c in chosen] == ["0", "1", "2", "3"]        # 1 + 2 + 3 + 4 = 10
    assert sampling.fits_budget(ordered, budget_s=0.5) == []


def test_expected_cost_grows_with_work_and_never_drops_below_compile_time():
    small = sampling.expected_measure_s(1e3, 1e3)
    big = sampling.expected_measure_s(1e11, 1e8)
    assert sampling.COMPILE_S < small < big
    assert sampling.expected_measure_s(1e3, 1e3) == sampling.expected_measure_s(2e3, 2e3)   # floor: min repeat


def test_synthetic_specs_vary_one_parameter_around_zoo_kernels_and_dedupe():
    seeds = [conv_node(0, 1, 64, 64, 56, 3), conv_node(1, 1, 64, 64, 56, 3),        # duplicate geometry
             conv_node(2, 1, 96, 96, 28, 3, groups=96), matmul_node(3, 128, 256, 512), pool_node(4, 1, 64, 112, 3, 2),
             elementwise_node(5, (1, 64, 56, 56))]
    specs = sampling.synthetic_specs(seeds)
    assert len(specs) == len(set(specs)) == len({s.name for s in specs})
    ops = {s.op for s in specs}
    assert ops == {"conv2d", "depthwise_conv2d", "matmul", "max_pool2d", "add_relu"}
    base = {"ci": 64, "co": 64, "hw": 56, "k": 3, "n": 1, "stride": 1}
    for spec in (s for s in specs if s.op == "conv2d"):
        changed = [k for k, v in spec.params.items() if base[k] != v]
        assert len(changed) == 1, spec                                    # one parameter varied at a time
    assert any(s.params["n"] > 1 for s in specs if s.op == "conv2d")      # batch is varied too
    assert SyntheticSpec.of("conv2d", **base) not in specs                 # the seed itself is not repeated
    few = sampling.synthetic_specs(seeds, max_specs=5, seed=1)
    assert len(few) == 5 and set(few) <= set(specs)
    assert few == sampling.synthetic_specs(seeds, max_specs=5, seed=1)    # seeded


def test_weight_heavy_convs_get_batch_probes_beyond_the_cap():
    heavy = conv_node(0, 1, 512, 512, 7, 3)                   # 9.4 MB of weights at batch 1
    seeds = [heavy, conv_node(1, 1, 64, 64, 56, 3),          # 0.15 MB: no probes
             conv_node(2, 4, 256, 256, 14, 3),                # batch 4 already (a zoo variant): no probes
             conv_node(3, 1, 512, 512, 14, 3, groups=512),    # depthwise: no probes
             conv_node(4, 1, 256, 256, 112, 3)]               # 2.4 MB but 14.8 GFLOP per call at batch 2
    probes = sampling.batch_probe_specs(seeds)
    base = dict(ci=512, co=512, hw=7, k=3, stride=1)
    assert probes == {SyntheticSpec.of("conv2d", n=b, **base) for b in sampling.BATCH_PROBE_BATCHES}
    assert 4 not in sampling.BATCH_PROBE_BATCHES               # never a zoo batch: no held-out kernel leaks
    capped = sampling.synthetic_specs(seeds, max_specs=3)
    assert probes <= set(capped) and 3 <= len(capped) <= 3 + len(probes)       # the cap holds for the rest
    assert capped == sorted(capped, key=lambda s: s.name)


def residual_conv_node(i: int, n: int, ci: int, co: int, hw: int, k: int, stride: int = 1):
    return dataclasses.replace(conv_node(i, n, ci, co, hw, k, stride), op="fused:nn.conv2d+add+add+nn.relu")


def test_convs_with_a_residual_add_get_residual_variations_beyond_the_cap():
    seeds = [residual_conv_node(0, 1, 64, 256, 56, 1),
             residual_conv_node(1, 1, 64, 256, 28, 1),              # the 0.5x size variation of seed 0: a zoo kernel
             conv_node(2, 1, 64, 64, 56, 3),                        # bias + relu only: no residual variations
             dataclasses.replace(conv_node(3, 1, 32, 32, 56, 3), op="fused:nn.conv2d+add+nn.relu+add")]
    assert [sampling.has_residual_add(node) for node in seeds] == [True, True, False, False]
    residual = sampling.residual_specs(seeds)
    assert residual and {s.op for s in residual} == {"conv2d_residual"}
    base = dict(n=1, ci=64, co=256, hw=56, k=1, stride=1)
    assert SyntheticSpec.of("conv2d_residual", **{**base, "co": 128}) in residual      # one parameter varied
    assert SyntheticSpec.of("conv2d_residual", **{**base, "n": 2}) in residual
    for spec in residual:
        assert {spec.params["ci"], spec.params["co"]} & {64, 256}
    # a variation that is another zoo kernel's geometry is left out: held-out kernels never return as training data
    assert SyntheticSpec.of("conv2d_residual", **{**base, "hw": 28}) not in residual
    assert SyntheticSpec.of("conv2d_residual", **base) not in residual
    capped = sampling.synthetic_specs(seeds, max_specs=4)
    assert residual <= set(capped) and len(capped) == 4 + len(residual)          # the cap holds for the rest
    assert sampling.synthetic_specs(seeds, max_specs=4) == capped


def test_softmax_kernels_get_row_and_length_variations_but_never_their_own_shape():
    seeds = [dataclasses.replace(elementwise_node(0, (1, 4, 128, 128)), op="relax.nn.softmax"),
             dataclasses.replace(elementwise_node(1, (4, 4, 128, 128)), op="relax.nn.softmax"),
             elementwise_node(2, (1, 4, 128, 128))]                          # not a softmax: no variations
    specs = sampling.softmax_specs(seeds)
    shapes = {(s.params["m"], s.params["n"]) for s in specs}
    assert {(128, 128), (1024, 128), (512, 64), (512, 256)} <= shapes
    assert (512, 128) not in shapes and (2048, 128) not in shapes          # the zoo's own shapes (512 x 2 = 2048)
    assert specs <= set(sampling.synthetic_specs(seeds, max_specs=0))     # beyond the cap


def test_balanced_subsample_shares_the_budget_equally_among_ops():
    convs = [SyntheticSpec.of("conv2d", n=1, ci=ci, co=64, hw=56, k=3, stride=1) for ci in range(1, 101)]
    matmuls = [SyntheticSpec.of("matmul", m=m, k=64, n=64) for m in range(1, 31)]
    norms = [SyntheticSpec.of("layer_norm", m=m, n=256) for m in range(1, 4)]
    picked = sampling.balanced_subsample(convs + matmuls + norms + convs[:5], max_specs=60, seed=3)
    counts = {op: sum(s.op == op for s in picked) for op in ("conv2d", "matmul", "layer_norm")}
    assert counts == {"layer_norm": 3, "matmul": 28, "conv2d": 29}    # 3 whole, then 57 split between two
    assert picked == sorted(set(picked), key=lambda s: s.name)
    assert picked == sampling.balanced_subsample(list(reversed(convs + matmuls + norms)), max_specs=60, seed=3)
    assert picked != sampling.balanced_subsample(convs + matmuls + norms, max_specs=60, seed=4)
    assert sampling.balanced_subsample(convs + matmuls + norms, max_specs=1000) == sorted(
        convs + matmuls + norms, key=lambda s: s.name)
    with pytest.raises(PredictorError, match="max_specs must be >= 0"):
        sampling.balanced_subsample(convs, max_specs=-1)


def test_rnn_cell_and_layer_norm_kernels_seed_their_own_variations():
    from hetpart.graph import OpNode

    def node(op, shape):
        return OpNode(id=0, name="k", op=op, input_shapes=(shape,), input_dtypes=("float32",),
                      output_shapes=(shape,), output_dtypes=("float32",))

    specs = sampling.synthetic_specs([node("fused:sigmoid+sigmoid+tanh+multiply+multiply+add", (1, 650)),
                                      node("relax.nn.layer_norm", (1, 128, 256))])
    gates = [s.params for s in specs if s.op == "gates"]
    assert {"m": 4, "n": 650, "t": 3} in gates and {"m": 1, "n": 650, "t": 6} in gates
    assert all(sum(g[k] != v for k, v in {"m": 1, "n": 650, "t": 3}.items()) == 1 for g in gates)
    norms = [s.params for s in specs if s.op == "layer_norm"]
    assert {"m": 256, "n": 256} in norms and {"m": 128, "n": 512} in norms


def test_synthetic_spec_rejects_wrong_parameters():
    with pytest.raises(PredictorError, match="needs parameters"):
        SyntheticSpec.of("conv2d", n=1, ci=3)
    with pytest.raises(PredictorError, match=">= 1"):
        SyntheticSpec.of("matmul", m=0, k=4, n=4)


@pytest.mark.tvm
@pytest.mark.parametrize("spec, kind, shape", [
    (SyntheticSpec.of("conv2d", n=2, ci=16, co=32, hw=20, k=3, stride=2), "conv2d", (2, 32, 10, 10)),
    (SyntheticSpec.of("conv2d_residual", n=1, ci=16, co=32, hw=19, k=3, stride=2), "conv2d", (1, 32, 10, 10)),
    (SyntheticSpec.of("depthwise_conv2d", n=1, c=24, hw=16, k=3, stride=1), "depthwise_conv2d", (1, 24, 16, 16)),
    (SyntheticSpec.of("matmul", m=8, k=64, n=40), "matmul", (8, 40)),
    (SyntheticSpec.of("max_pool2d", n=1, c=8, hw=16, k=3, stride=2), "pool", (1, 8, 8, 8)),
    (SyntheticSpec.of("add_relu", n=1, c=8, hw=8), "elementwise", (1, 8, 8, 8)),
    (SyntheticSpec.of("gates", m=4, n=650, t=3), "elementwise", (4, 650)),
    (SyntheticSpec.of("layer_norm", m=128, n=256), "reduction", (128, 256)),
    (SyntheticSpec.of("softmax", m=512, n=64), "reduction", (512, 64)),
])
def test_synthetic_modules_extract_to_one_kernel_of_the_intended_kind(spec, kind, shape):
    from tvm_passes.extract import extract_op_graph

    graph = extract_op_graph(build_synthetic_module(spec), name=spec.name).kernel_graph()
    assert graph.num_ops == 1
    node = graph.nodes[0]
    assert kernel_kind(node) == kind
    assert tuple(node.output_shapes[0]) == shape
    assert node.param_bytes > 0 or spec.op in ("max_pool2d", "gates", "softmax")   # weights are constants
    if spec.op == "gates":                                     # one fused kernel: 3 gates of the same input
        assert sampling.gate_op_count(node) == 3
    assert sampling.has_residual_add(node) == (spec.op == "conv2d_residual")   # the residual is in the epilogue
    assert np.isfinite(node.flops)
