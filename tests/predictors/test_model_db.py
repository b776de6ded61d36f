"""Model-variant table: a whole-model latency survives a refresh only while the variant's kernels are the same."""
import numpy as np

from predictors.model_db import ModelDatabase
from tests.predictors.synthetic_kernels import chain_graph, random_kernels

TARGET, TVM = '{"kind": "llvm"}', "0.27.0.post1"


def test_latency_is_kept_for_the_same_kernels_and_dropped_when_they_change(tmp_path):
    graph = chain_graph(random_kernels(np.random.default_rng(0), 5, ("conv2d",)), name="m")
    keys = tuple(f"k{i}" for i in range(5))
    with ModelDatabase(tmp_path / "p.sqlite") as models:
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, keys, "s1")
        models.set_model_latency("m", "cpu", TARGET, TVM, 123.0, 0.01, 70.0, "s1")
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, keys, "s2")       # same kernels
        (kept,) = models.variants("cpu")
        assert (kept.model_median_us, kept.model_spread, kept.canary_us) == (123.0, 0.01, 70.0)
        changed = keys[:4] + ("k_new",)                                                   # one kernel recompiled
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, changed, "s3")
        (dropped,) = models.variants("cpu")
        assert dropped.node_keys == changed
        assert (dropped.model_median_us, dropped.model_spread, dropped.canary_us) == (None, None, None)
