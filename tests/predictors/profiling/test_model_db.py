"""Model-variant table: a whole-model latency survives a refresh only while the variant's kernels are the same;
older databases gain the pipeline-version column."""
import sqlite3

import numpy as np

from predictors.profiling.model_db import ModelDatabase
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
        reordered = keys[1:] + keys[:1]                                                   # paired differently
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, reordered, "s2")
        (kept,) = models.variants("cpu")
        assert kept.node_keys == reordered and kept.model_median_us == 123.0
        changed = keys[:4] + ("k_new",)                                                   # one kernel recompiled
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, changed, "s3")
        (dropped,) = models.variants("cpu")
        assert dropped.node_keys == changed
        assert (dropped.model_median_us, dropped.model_spread, dropped.canary_us) == (None, None, None)


def test_a_database_from_before_the_pipeline_version_column_is_migrated(tmp_path):
    graph = chain_graph(random_kernels(np.random.default_rng(1), 3, ("conv2d",)), name="m")
    path = tmp_path / "old.sqlite"
    with ModelDatabase(path) as models:
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, ("a", "b", "c"), "s1")
    conn = sqlite3.connect(path)                       # rebuild the table as an older hetpart wrote it
    conn.executescript("ALTER TABLE hetpart_model_variants DROP COLUMN pipeline_version;")
    conn.close()
    with ModelDatabase(path) as models:
        (old,) = models.variants("cpu")
        assert old.pipeline_version == "" and old.node_keys == ("a", "b", "c")     # unknown: re-extracted
        models.put_variant("m", "cpu", TARGET, TVM, "cnn", 0, True, graph, ("a", "b", "c"), "s2", "extract-2")
        (new,) = models.variants("cpu")
        assert new.pipeline_version == "extract-2"
