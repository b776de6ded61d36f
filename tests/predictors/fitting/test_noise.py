"""Which prediction misses the measurements' own noise cannot explain."""
from __future__ import annotations

from predictors.profiling.model_db import ModelDatabase
from tests.predictors.profiling.test_zoo_profile import TARGET, TVM, build_fake_db


def test_miss_analysis_tells_predictor_errors_from_unstable_labels(tmp_path):
    """A held-out kernel predicted >10% off is a predictor error when every quiet re-measurement of it agrees with
    its label, and possibly label noise when one does not."""
    db = tmp_path / "p.sqlite"
    build_fake_db(db)                                 # model0's kernels re-measured at +2% (s3) and -2% (s4)
    from predictors.fitting.noise import miss_analysis
    from predictors.fitting.dataset import load_training_data

    name = "model0"
    keys = load_training_data(db).model_keys[name]
    with ModelDatabase(db) as models:                 # one kernel measured 30% slower in another quiet session
        models.add_retest(keys[0], "cpu", TARGET, TVM, load_training_data(db).raw[keys[0]].median_us * 1.3, 0.01,
                          100.0, "s5")
    data = load_training_data(db)
    measured = list(data.records[name].kernel_latencies_us)
    predicted = [y * (1.5 if i < 3 else 1.05) for i, y in enumerate(measured)]
    out = miss_analysis(data, measured, predicted, [(name, i) for i in range(len(measured))], min_us=0.0)
    assert (out["misses"], out["label_stable"], out["label_noisy"]) == (3, 2, 1)
    assert out["per_model"] == {name: 3} and out["n_kernels_ge_min"] == len(measured)
    assert miss_analysis(data, measured, predicted, [(name, i) for i in range(len(measured))],
                         min_us=max(measured) + 1)["misses"] == 0
