"""The training data of a profile database: canary-normalised labels, model records, what is left out and why."""
from __future__ import annotations

import dataclasses
import json
import sqlite3

import numpy as np
import pytest

from hetpart.errors import PredictorError
from predictors.profiling.store import ProfileStore, key_hash_of
from tests.predictors.profiling.test_zoo_profile import build_fake_db
from tests.predictors.synthetic_kernels import synthetic_latency_us


def test_fitted_predictor_records_its_thread_count_and_a_mixed_database_is_refused(tmp_path):
    from predictors.fitting.dataset import load_training_data
    from predictors.fitting.training import fit_from_db

    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=2, with_retests=False)
    threads = load_training_data(db).num_threads
    assert threads >= 1 and fit_from_db(db)[0].provenance()["num_threads"] == threads
    with sqlite3.connect(db) as conn:   # a database written before the store refused mixed thread counts
        conn.execute("UPDATE measurements SET num_threads = ? WHERE id = (SELECT MIN(id) FROM measurements)",
                     (threads + 1,))
    with pytest.raises(PredictorError, match="mixes cpu rows measured with"):
        load_training_data(db)


def test_canary_normalisation_and_exclusions_in_training_data(tmp_path):
    db = tmp_path / "p.sqlite"
    workloads = build_fake_db(db, n_models=4, with_retests=False)
    from predictors.fitting.dataset import load_training_data

    data = load_training_data(db)
    assert set(data.records) == {f"model{m}" for m in range(4)}
    rec3 = data.records["model3"]                 # measured 4% slower with a 4% slower canary: labels = the law
    law = synthetic_latency_us(list(rec3.nodes))
    ref = data.reference_canary_us
    np.testing.assert_allclose(rec3.kernel_latencies_us, law * 1.04 * ref / 104.0)
    syn_nodes, syn_labels = data.synthetic()
    assert 25 <= len(syn_nodes) <= 30 and len(syn_labels) == len(syn_nodes)     # 30 drawn, a few equal zoo ones
    assert not {key_hash_of(json.dumps([n.op, n.input_shapes, n.output_shapes, n.flops])) for n in syn_nodes} \
        & data.zoo_keys
    with sqlite3.connect(db) as conn:             # a failed kernel removes its model from the records
        key = next(iter(workloads))
        conn.execute("UPDATE measurements SET status = 'failed', error = 'x' WHERE key_hash = ?", (key,))
    data = load_training_data(db)
    assert len(data.records) == 3 and any("lack an ok label" in why for why in data.excluded_models.values())


def test_rows_of_an_operator_measured_again_as_a_new_kernel_are_superseded(tmp_path):
    """After a compiler change the same operator (equal features) runs as a different kernel (another key):
    training keeps only the newest row, except rows a stored model variant still lists."""
    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=3, with_retests=False)
    from predictors.fitting.dataset import load_training_data

    before = load_training_data(db)
    synthetic_key = sorted(set(before.kernels) - before.zoo_keys)[0]
    zoo_key = sorted(before.zoo_keys)[0]
    with ProfileStore(db) as store:
        rows = {m.key_hash: m for m in store.measurements()}
        for key in (synthetic_key, zoo_key):
            old = rows[key]
            store.add(dataclasses.replace(old, key_hash=key_hash_of(old.workload_key + "-new kernel"),
                                          workload_key=old.workload_key + "-new kernel", median_us=old.median_us / 5,
                                          timestamp_s=old.timestamp_s + 60, row_id=None))
    after = load_training_data(db)
    assert synthetic_key not in after.kernels and zoo_key in after.kernels
    assert len(after.kernels) == len(before.kernels) + 1               # two new rows, one old row superseded
    assert set(after.records) == set(before.records)
    with ProfileStore(db) as store:                  # a newer kernel not yet measured ok retires the old row too
        old = rows[sorted(set(before.kernels) - before.zoo_keys)[1]]
        store.add(dataclasses.replace(old, key_hash=key_hash_of(old.workload_key + "-v3"), median_us=None,
                                      workload_key=old.workload_key + "-v3", status="rejected_noisy",
                                      timestamp_s=old.timestamp_s + 60, row_id=None))
    assert old.key_hash not in load_training_data(db).kernels
