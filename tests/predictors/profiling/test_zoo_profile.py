"""Zoo profiling: kernel <-> kernel-graph node alignment, the campaign's resumability and its refine passes; the fake
profile database the fitting tests read (:func:`build_fake_db`)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from hetpart.driver import cli_predictors
from hetpart.errors import HostRegimeError, ProfileDatabaseError
from hetpart.graph import OpNode
from predictors.profiling.model_db import ModelDatabase
from predictors.profiling.profiling_run import profile_workloads
from predictors.profiling.store import Measurement, ProfileStore, key_hash_of
from predictors.profiling.kernel_mapping import align_calls, op_tokens
from tests.predictors.synthetic_kernels import chain_graph, random_kernels, synthetic_latency_us

TARGET, TVM = '{"kind":"llvm"}', "0.27-test"


def test_op_tokens_strip_tvm_suffixes_and_prefixes():
    assert op_tokens("fused_conv2d2_add2_relu1") == ("conv2d", "add", "relu")
    assert op_tokens("fused:nn.conv2d+add+nn.relu") == ("conv2d", "add", "relu")
    assert op_tokens("fused_conv2d_add_tir_clip") == op_tokens("fused:nn.conv2d+add+clip")
    assert op_tokens("max_pool2d1") == op_tokens("relax.nn.max_pool2d") == ("max", "pool2d")


def _calls(graph, order):
    names = {"fused:nn.conv2d+add+nn.relu": "fused_conv2d{}_add{}_relu{}", "fused:matmul+add": "fused_matmul{}_add{}",
             "relax.nn.max_pool2d": "max_pool2d{}", "fused:add+nn.relu+multiply": "fused_add{}_relu{}_multiply{}"}
    out = []
    for j in order:
        node = graph.nodes[j]
        pattern = names.get(node.op, "fused_add{}")
        out.append((pattern.format(*[j] * pattern.count("{}")), tuple(tuple(s) for s in node.output_shapes)))
    return out


def test_align_calls_pairs_by_shape_and_ops_even_when_the_order_differs():
    graph = chain_graph(random_kernels(np.random.default_rng(3), 12))
    order = list(range(12))
    order[4], order[5] = order[5], order[4]
    pairs, why, mismatches = align_calls(_calls(graph, order), graph)
    assert why == "" and pairs == order and mismatches == 0
    calls = _calls(graph, range(12))
    bad = calls[:6] + [(calls[6][0], ((9, 9, 9),))] + calls[7:]
    pairs, why, _ = align_calls(bad, graph)
    assert pairs is None and "position 6" in why
    pairs, why, _ = align_calls(calls[1:], graph)          # node 0 computes but got no kernel: refused
    assert pairs is None and "got no deployment kernel" in why
    shape_of = OpNode(id=0, name="s", op="relax.shape_of", input_shapes=((1, 4),), input_dtypes=("float32",),
                      output_shapes=(), output_dtypes=(), shape_only=True)
    with_shape = chain_graph([shape_of] + list(graph.nodes))
    pairs, why, _ = align_calls(_calls(with_shape, range(1, 13)), with_shape)   # host-side shape op: allowed
    assert why == "" and pairs == list(range(1, 13))
    pairs, why, _ = align_calls(calls + calls[:1], graph)
    assert pairs is None and "13 deployment kernels but only 12" in why


def test_align_calls_tells_equal_output_shapes_apart_by_operand_sizes():
    """Inception branches: a 1x1 and a 3x3 conv both write 1x128x7x7 under the same kernel-name pattern; the
    kernels take prepacked (IHWO) weights and a bias the nodes do not list, yet each finds its own node."""
    def conv(i, cin, k):
        return OpNode(id=i, name=f"c{i}", op="fused:nn.conv2d+add+nn.relu", input_shapes=((1, cin, 7, 7),
                      (128, cin, k, k)), input_dtypes=("float32",) * 2, output_shapes=((1, 128, 7, 7),),
                      output_dtypes=("float32",), flops=2 * 128 * 49 * cin * k * k)
    graph = chain_graph([conv(0, 32, 3), conv(1, 832, 1), conv(2, 48, 3)])
    calls = [("fused_conv2d_add_relu", ((1, 128, 7, 7),), ((1, cin, 7, 7), (cin, k, k, 128), (1, 128, 1, 1)))
             for cin, k in ((832, 1), (48, 3), (32, 3))]                  # run in another order
    pairs, why, mismatches = align_calls(calls, graph)
    assert why == "" and pairs == [1, 2, 0] and mismatches == 0
    assert align_calls([c[:2] for c in calls], graph)[0] == [0, 1, 2]    # shapes alone: by position


def test_align_calls_pairs_a_batch_norm_kernel_that_writes_only_its_first_output():
    """A batch_norm not folded into a conv: the node lists (y, running mean, running var); the deployment kernel
    writes y only. An exact match still wins over such a prefix match."""
    bn = OpNode(id=0, name="bn", op="relax.nn.batch_norm", input_shapes=((1, 256, 512, 1), (256,), (256,)),
                input_dtypes=("float32",) * 3, output_shapes=((1, 256, 512, 1), (256,), (256,)),
                output_dtypes=("float32",) * 3, flops=4 * 256 * 512)
    relu = OpNode(id=1, name="r", op="relax.nn.relu", input_shapes=((1, 256, 512, 1),), input_dtypes=("float32",),
                  output_shapes=((1, 256, 512, 1),), output_dtypes=("float32",), flops=256 * 512)
    graph = chain_graph([bn, relu])
    pairs, why, _ = align_calls([("fused_batch_norm", ((1, 256, 512, 1),)), ("relu", ((1, 256, 512, 1),))], graph)
    assert why == "" and pairs == [0, 1]
    pairs, why, _ = align_calls([("relu", ((1, 256, 512, 1),)), ("fused_batch_norm", ((1, 256, 512, 1),))], graph)
    assert why == "" and pairs == [1, 0]                     # relu's exact match first, then the prefix match
    pairs, why, _ = align_calls([("fused_batch_norm", ((1, 128, 512, 1),))], graph)
    assert pairs is None and "position 0" in why


@pytest.mark.tvm
def test_squeezenet_kernels_map_to_kernel_graph_nodes_with_agreeing_shapes():
    from tvm_passes import sources
    from predictors.profiling.profiler import KernelProfiler
    from predictors.profiling.kernel_mapping import map_kernels

    mod = sources.import_model("squeezenet1_1", size=64).mod
    mk = map_kernels(mod, "squeezenet1_1_b1_s64", KernelProfiler("cpu"))
    assert mk.aligned, mk.mismatch
    assert len(mk.node_keys) == mk.graph.num_ops and all(mk.node_keys)
    by_key = {w.key_hash: w for w in mk.workloads}
    assert set(mk.node_keys) == set(by_key)
    assert sum(w.count for w in mk.workloads) == mk.graph.num_ops
    for node, key in zip(mk.graph.nodes, mk.node_keys):
        w = by_key[key]
        assert tuple(tuple(s) for s in node.output_shapes) == w.output_shapes      # every kernel verified
        assert w.features["tags"]["source"] == "kernel_graph"
        assert tuple(tuple(s) for s in w.features["output_shapes"]) == w.output_shapes
        assert OpNode.from_dict(w.features).op == mk.graph.nodes[mk.node_keys.index(key)].op


# ---------------------------------------------------------------------------------------------- fake DB
@dataclass(frozen=True)
class FakeWorkload:
    name: str
    key_hash: str
    workload_key: str
    features: dict


class FakeProfiler:
    """Labels each workload with the synthetic latency law (no timing); canary fixed per session."""

    device, target, tvm_version = "cpu", TARGET, TVM

    def __init__(self, session_id: str = "s1", canary_us: float = 100.0, scale: float = 1.0):
        self.session_id, self.canary, self.scale = session_id, canary_us, scale

    def measure(self, w: FakeWorkload) -> Measurement:
        t = float(synthetic_latency_us([OpNode.from_dict(w.features)])[0]) * self.scale
        return Measurement(key_hash=w.key_hash, workload_key=w.workload_key, kernel_name=w.name, device="cpu",
                           target=TARGET, tvm_version=TVM, num_threads=2, canary_kernel="matmul_256_float32",
                           canary_us=self.canary, median_us=t, mad_us=0.01 * t, spread=0.01, n_repeats=7, number=1,
                           samples_us=(t,) * 7, features=w.features, status="ok", session_id=self.session_id,
                           timestamp_s=time.time())


def _workload(node: OpNode) -> FakeWorkload:
    key = json.dumps([node.op, node.input_shapes, node.output_shapes, node.flops])
    return FakeWorkload(node.name, key_hash_of(key), key, node.to_dict())


def build_fake_db(path, n_models: int = 6, with_retests: bool = True) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    families = ["cnn_a", "cnn_b", "mlp"]
    with ProfileStore(path) as store, ModelDatabase(path) as models:
        workloads = {}
        for m in range(n_models):
            kinds = ("conv2d", "pool", "elementwise") if m % 3 != 2 else ("matmul", "elementwise")
            graph = chain_graph(random_kernels(rng, 14, kinds), name=f"model{m}")
            ws = [_workload(n) for n in graph.nodes]
            workloads.update({w.key_hash: w for w in ws})
            profile_workloads(store, ws, FakeProfiler(canary_us=100.0 if m < 3 else 104.0,
                                                      scale=1.0 if m < 3 else 1.04), budget_s=60)
            models.put_variant(graph.name, "cpu", TARGET, TVM, families[m % 3], 0, True, graph,
                               tuple(w.key_hash for w in ws), "s1")
            total = float(synthetic_latency_us(list(graph.nodes)).sum()) + 2.0 * graph.num_ops
            models.set_model_latency(graph.name, "cpu", TARGET, TVM, total, 0.01, 100.0, "s1")
        extra = [_workload(n) for n in random_kernels(rng, 30, ("conv2d", "matmul", "pool", "elementwise"))]
        profile_workloads(store, extra, FakeProfiler("s2"), budget_s=60)
        if with_retests:
            for w in list(workloads.values())[:10]:
                m = FakeProfiler("s3", canary_us=100.0).measure(w)
                models.add_retest(w.key_hash, "cpu", TARGET, TVM, m.median_us * 1.02, 0.01, 100.0, "s3")
            for w in list(workloads.values())[:5]:          # a later session disagrees by 4% with s3
                m = FakeProfiler("s4", canary_us=100.0).measure(w)
                models.add_retest(w.key_hash, "cpu", TARGET, TVM, m.median_us * 0.98, 0.01, 100.0, "s4")
    return workloads


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli_predictors.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_model_database_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "foreign.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ProfileDatabaseError, match="not a hetpart profile database"):
        ModelDatabase(path)


def tiny_cnn(variant) -> Any:
    """conv+bias+relu -> max-pool -> conv+bias+relu -> flatten -> matmul+bias, weights as constants."""
    from tvm import relax

    rng = np.random.default_rng(0)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32"), "float32")   # noqa: E731
    n, s = variant.batch, variant.size
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 3, s, s], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(x, const(16, 3, 3, 3), padding=1),
                                                      const(1, 16, 1, 1))))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(y, const(16, 16, 3, 3), padding=1),
                                                      const(1, 16, 1, 1))))
            y = bb.emit(relax.op.reshape(y, [n, 16 * (s // 2) ** 2]))
            y = bb.emit_output(relax.op.add(relax.op.matmul(y, const(16 * (s // 2) ** 2, 10)), const(10)))
        bb.emit_func_output(y)
    return bb.get()


def _counting_profiler():
    """A KernelProfiler class with the real pipeline, target and kernel mapping whose timing is replaced by the
    synthetic law (no kernel compiles); ``measured`` lists every key it timed."""
    from predictors.profiling.profiler import KernelProfiler, TimingStats

    class CountingProfiler(KernelProfiler):
        measured: list[str] = []

        def time_kernel(self, kernel):
            return [TimingStats((50.0, 51.0, 49.0), 1)]

        def measure(self, workload):
            self.measured.append(workload.key_hash)
            t = float(synthetic_latency_us([OpNode.from_dict(workload.features)])[0])
            return Measurement(key_hash=workload.key_hash, workload_key=workload.workload_key,
                               kernel_name=workload.name, device=self.device, target=self.target,
                               tvm_version=self.tvm_version, num_threads=2, canary_kernel=self.canary_kind,
                               canary_us=50.0, median_us=t, mad_us=0.0, spread=0.0, n_repeats=3, number=1,
                               samples_us=(t, t, t), features=workload.features, status="ok",
                               session_id=self.session_id, timestamp_s=time.time())

    return CountingProfiler


@pytest.mark.tvm
def test_batch_variants_seed_synthetic_kernels_that_refine_times_again(tmp_path):
    """A batch-4 variant's kernels (4x the rows of batch 1) get synthetic neighbours of their own, and the refine
    passes find those specs again from the stored variant."""
    from predictors.profiling import sampling
    from predictors.profiling.refine import refine_zoo
    from predictors.profiling.zoo_profile import profile_zoo

    CountingProfiler = _counting_profiler()
    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 4, 16, "tiny", sampling.TIER_ZOO_VARIANT)]
    summary = profile_zoo(db, budget_s=600, profiler=CountingProfiler(), variants=variants, max_synthetic=4,
                          retest_count=0, load_module=tiny_cnn)
    assert summary.synthetic_specs == 4
    specs = sampling.synthetic_specs(ModelDatabase(db).variants()[0].graph.nodes, max_specs=10**6)
    assert any(s.params["n"] == 4 for s in specs if s.op == "conv2d")    # seeded at batch 4, not batch 1
    counts = refine_zoo(db, 600, CountingProfiler(), variants, load_module=tiny_cnn)
    assert counts["synthetic_kernels"] >= 4


@pytest.mark.tvm
def test_profile_campaign_is_resumable_and_records_models_retests_and_synthetic_kernels(tmp_path):
    from predictors.profiling import sampling
    from predictors.fitting.noise import noise_floor_of
    from predictors.fitting.dataset import load_training_data
    from predictors.profiling.refine import refine_zoo
    from predictors.profiling.zoo_profile import profile_zoo

    CountingProfiler = _counting_profiler()
    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 1, 16, "tiny", 0)]
    first = profile_zoo(db, budget_s=600, profiler=CountingProfiler(), variants=variants, max_synthetic=3,
                        retest_count=4, load_module=tiny_cnn)
    assert first.aligned == 1 and first.fallback_tir == 0 and first.models_measured == 1
    assert first.kernels_measured == first.zoo_candidates + first.synthetic_specs > first.zoo_candidates
    assert first.retests == 4
    n_first = len(CountingProfiler.measured)
    assert n_first == len(set(CountingProfiler.measured)) + 4        # each kernel once, plus the 4 retests
    second = profile_zoo(db, budget_s=600, profiler=CountingProfiler(), variants=variants, max_synthetic=3,
                         retest_count=4, load_module=tiny_cnn)
    assert second.kernels_measured == 0 and second.models_measured == 0 and second.retests == 0
    assert second.skipped_extraction == 1 and second.kernels_skipped == 0    # nothing was even rebuilt
    assert len(CountingProfiler.measured) == n_first                  # nothing measured twice
    before = {m.key_hash: m.median_us for m in ProfileStore(db).measurements()}
    faster = CountingProfiler()
    faster.measure = lambda w, p=faster: dataclasses.replace(CountingProfiler.measure(p, w),
                                                             median_us=0.5 * before[w.key_hash])
    counts = refine_zoo(db, 600, faster, variants, load_module=tiny_cnn)
    assert counts["kernels"] == first.zoo_candidates == counts["kernels_lowered"] and counts["models"] == 1
    synthetic_keys = set(before) - (set(ModelDatabase(db).variants()[0].node_keys) - {""})
    assert counts["synthetic_kernels"] == counts["synthetic_lowered"] == len(synthetic_keys) == 3
    after = {m.key_hash: m.median_us for m in ProfileStore(db).measurements()}
    assert after == pytest.approx({k: 0.5 * v for k, v in before.items()})     # lower medians kept, synthetic too
    assert len(CountingProfiler.measured) == n_first + len(before)             # each stored kernel timed once more
    slower = CountingProfiler()
    slower.measure = lambda w, p=slower: dataclasses.replace(CountingProfiler.measure(p, w),
                                                             median_us=10.0 * before[w.key_hash])
    assert refine_zoo(db, 600, slower, variants, load_module=tiny_cnn)["kernels_lowered"] == 0
    from predictors.profiling.profiler import TimingStats
    fast_host = CountingProfiler()                   # the canary runs 20% faster than in the database
    fast_host.time_kernel = lambda kernel: [TimingStats((40.0, 40.5, 39.5), 1)]
    fast_host.measure = faster.measure
    with pytest.raises(HostRegimeError, match=r"took 50.0 us, now it takes 40.0 us .*new database"):
        refine_zoo(db, 600, fast_host, variants, load_module=tiny_cnn)
    assert {m.key_hash: m.median_us for m in ProfileStore(db).measurements()} == after     # nothing touched
    drift = CountingProfiler()                       # 3% faster canary, 2% faster kernels: drift, not better labels
    drift.time_kernel = lambda kernel: [TimingStats((48.5, 48.6, 48.4), 1)]
    drift.measure = lambda w, p=drift: dataclasses.replace(CountingProfiler.measure(p, w), canary_us=48.5,
                                                           median_us=0.98 * after[w.key_hash])
    assert refine_zoo(db, 600, drift, variants, load_module=tiny_cnn)["kernels_lowered"] == 0
    data = load_training_data(db)
    assert len(data.retests) == 4 + 3 * len(before)                       # each refine pass records its timings
    between = noise_floor_of(data)["between_sessions"]                     # the passes: 0.5x, 10x, 0.98x
    assert between["n_kernels"] == len(before) and between["mape"] > 5
    assert list(data.records) == ["tiny_cnn_b1_s16"] and len(data.synthetic()[0]) == 3
    assert data.records["tiny_cnn_b1_s16"].model_latency_us == pytest.approx(50.0)   # canary 50 us everywhere


@pytest.mark.tvm
def test_refine_passes_are_separate_sessions_within_the_budget(tmp_path):
    from predictors.profiling import sampling
    from predictors.profiling.refine import refine_passes
    from predictors.fitting.noise import noise_floor_of
    from predictors.fitting.dataset import load_training_data
    from predictors.profiling.zoo_profile import profile_zoo

    CountingProfiler = _counting_profiler()
    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 1, 16, "tiny", 0)]
    profiler = CountingProfiler(session_id="run1")
    profile_zoo(db, budget_s=600, profiler=profiler, variants=variants, max_synthetic=3, retest_count=0,
                load_module=tiny_cnn)
    n_kernels = len(ProfileStore(db).measurements())
    with sqlite3.connect(db) as conn:         # as if no window of the first pass was clean for the whole model
        conn.execute("UPDATE hetpart_model_variants SET model_median_us = NULL, canary_us = NULL")
    assert refine_passes(db, 0.0, profiler, 2, variants, load_module=tiny_cnn) == []       # no budget: no pass
    passes = refine_passes(db, 600, profiler, 2, variants, load_module=tiny_cnn)
    assert [c["kernels"] + c["synthetic_kernels"] for c in passes] == [n_kernels, n_kernels]
    assert [c["models_first_timed"] for c in passes] == [1, 0]             # the first pass times the model
    assert [c["models_lowered"] for c in passes] == [0, 0]
    assert ModelDatabase(db).variants()[0].model_median_us == pytest.approx(50.0)
    assert profiler.session_id == "run1"                                    # restored after the passes
    data = load_training_data(db)
    assert sorted({session for *_, session in data.retests}) == ["run1.refine1", "run1.refine2"]
    floor = noise_floor_of(data)                                            # identical timings in both passes
    assert floor["between_sessions"]["n_kernels"] == n_kernels and floor["between_sessions"]["mape"] == 0.0

@pytest.mark.tvm
def test_a_new_pipeline_version_refreshes_stored_features_without_measuring_again(tmp_path, monkeypatch):
    """After an extractor or CPU-rule change, a rerun extracts every variant and synthetic spec again, rewrites
    features that changed (keeping their timings) and measures only kernels whose key changed (none here)."""
    from predictors.profiling import sampling, zoo_profile
    from predictors.fitting.dataset import load_training_data

    CountingProfiler, profile_zoo = _counting_profiler(), zoo_profile.profile_zoo
    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 1, 16, "tiny", 0)]
    kwargs = dict(budget_s=600, variants=variants, max_synthetic=3, retest_count=0, load_module=tiny_cnn)
    first = profile_zoo(db, profiler=CountingProfiler(), **kwargs)
    with ProfileStore(db) as store:                    # an older extractor stored a wrong param_bytes
        rows = store.measurements()
        old = next(m for m in rows if m.features["param_bytes"] > 0)
        store.add(dataclasses.replace(old, features={**old.features, "param_bytes": 7}, row_id=None), replace=True)
    n_measured = len(CountingProfiler.measured)
    same = profile_zoo(db, profiler=CountingProfiler(), **kwargs)
    assert same.skipped_extraction == 1 and same.features_repaired == 0    # same version: not even extracted

    monkeypatch.setattr(zoo_profile, "PIPELINE_VERSION", "extract-99.rules-99")
    newer = profile_zoo(db, profiler=CountingProfiler(), **kwargs)
    assert newer.skipped_extraction == 0 and newer.features_repaired == 1
    assert newer.kernels_measured == 0 and newer.models_measured == 0 and newer.synthetic_specs == 3
    assert len(CountingProfiler.measured) == n_measured                 # rebuilt, but nothing timed again
    repaired = {m.key_hash: m for m in ProfileStore(db).measurements()}[old.key_hash]
    assert repaired.features["param_bytes"] == old.features["param_bytes"]
    assert repaired.median_us == old.median_us                          # the timing is kept
    (record,) = ModelDatabase(db).variants()
    assert record.pipeline_version == "extract-99.rules-99" and record.model_median_us is not None
    assert len(load_training_data(db).kernels) == first.kernels_measured


@pytest.mark.tvm
def test_synthetic_rows_no_current_spec_makes_are_left_out_of_training(tmp_path, monkeypatch):
    from predictors.profiling import sampling, zoo_profile
    from predictors.fitting.dataset import load_training_data

    CountingProfiler = _counting_profiler()
    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 1, 16, "tiny", 0)]
    kwargs = dict(budget_s=600, variants=variants, retest_count=0, load_module=tiny_cnn)
    zoo_profile.profile_zoo(db, profiler=CountingProfiler(), max_synthetic=3, **kwargs)
    before = load_training_data(db)
    assert before.excluded_orphan_rows == 0 and len(before.synthetic()[0]) == 3
    monkeypatch.setattr(zoo_profile, "PIPELINE_VERSION", "extract-99.rules-99")   # a new sampling: one spec fewer
    zoo_profile.profile_zoo(db, profiler=CountingProfiler(), max_synthetic=2, **kwargs)
    after = load_training_data(db)
    assert after.excluded_orphan_rows == 1 and len(after.synthetic()[0]) == 2
    assert len(after.kernels) == len(before.kernels) - 1
    # a compiler change not yet profiled: the latest sampling's markers still tell the orphan apart
    monkeypatch.setattr(zoo_profile, "PIPELINE_VERSION", "extract-100.rules-100")
    pending = load_training_data(db)
    assert pending.excluded_orphan_rows == 1 and set(pending.kernels) == set(after.kernels)


@pytest.mark.tvm
def test_synthetic_kernels_rejected_as_noisy_are_measured_again_by_the_next_run(tmp_path):
    from predictors.profiling import sampling, zoo_profile

    CountingProfiler = _counting_profiler()

    class NoisyProfiler(CountingProfiler):
        """Every synthetic kernel comes back too noisy to keep."""

        def measure(self, workload):
            m = super().measure(workload)
            return m if workload.key_hash in zoo_keys else dataclasses.replace(m, status="rejected_noisy", spread=0.2)

    db = tmp_path / "zoo.sqlite"
    variants = [sampling.ModelVariant("tiny_cnn", 1, 16, "tiny", 0)]
    kwargs = dict(budget_s=600, variants=variants, max_synthetic=3, retest_count=0, load_module=tiny_cnn)
    zoo_keys: set = set()
    zoo_profile.profile_zoo(db, profiler=CountingProfiler(), **{**kwargs, "max_synthetic": 0})
    zoo_keys |= set(ModelDatabase(db).variants()[0].node_keys)
    noisy = zoo_profile.profile_zoo(db, profiler=NoisyProfiler(), **kwargs)
    assert noisy.kernels_measured == 3 and noisy.synthetic_specs == 3
    assert {m.status for m in ProfileStore(db).measurements(status=None)} == {"ok", "rejected_noisy"}
    again = zoo_profile.profile_zoo(db, profiler=CountingProfiler(), **kwargs)
    assert again.kernels_measured == 3                                # the noisy ones, measured again
    assert {m.status for m in ProfileStore(db).measurements(status=None)} == {"ok"}
    assert zoo_profile.profile_zoo(db, profiler=CountingProfiler(), **kwargs).kernels_measured == 0


@pytest.mark.tvm
def test_a_standalone_batch_norm_model_aligns():
    """conv1d_audio normalises after pooling, so its batch_norms are kernels of their own that write only y."""
    from predictors.profiling.kernel_mapping import map_kernels
    from predictors.profiling.profiler import KernelProfiler
    from tvm_passes import sources

    mk = map_kernels(sources.import_model("conv1d_audio").mod, "conv1d_audio_b1_s1024", KernelProfiler("cpu"))
    assert mk.aligned, mk.mismatch
    norms = [k for node, k in zip(mk.graph.nodes, mk.node_keys) if node.op == "relax.nn.batch_norm"]
    assert norms and all(norms)
