"""hetpart fit and hetpart evaluate on a fake profile database: the fitted predictor, its provenance, the report."""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from predictors.device_predictor import DevicePredictor
from predictors.features import FEATURE_SCHEMA_VERSION
from tests.predictors.profiling.test_zoo_profile import _run, build_fake_db
from tvm_passes.schedules import RULES_VERSION


def test_fit_save_load_round_trip_through_the_cli(tmp_path):
    from predictors.fitting.dataset import load_training_data

    db = tmp_path / "p.sqlite"
    build_fake_db(db)
    out = tmp_path / "cpu.json"
    assert _run(["fit", "--db", str(db), "-o", str(out)]) == 0
    loaded = DevicePredictor.load(out)
    data = json.loads(out.read_text())
    training = data["provenance"]["training"]
    assert training["n_model_records"] == 6 and training["n_kernels"] > 80
    # every kernel instance of the 6 models (14 each) plus, once, the 30 extra kernels no model calls
    n_extra = len(load_training_data(db).synthetic()[0])
    assert training["n_training_rows"] == 6 * 14 + n_extra and 25 <= n_extra <= 30
    assert data["provenance"]["training_ranges"]
    from predictors.fitting.training import fit_from_db

    fitted, _ = fit_from_db(db)
    nodes = [n for n, _ in load_training_data(db).kernels.values()]
    np.testing.assert_allclose(loaded.predict(nodes), fitted.predict(nodes), rtol=1e-9)
    assert loaded.context.per_kernel_overhead_us == pytest.approx(fitted.context.per_kernel_overhead_us)
    assert loaded.context.cold_param_us_per_mb == pytest.approx(fitted.context.cold_param_us_per_mb)


def test_a_fitted_predictor_records_its_database_by_name_and_content_and_the_code_that_fitted_it(tmp_path):
    from predictors import versions
    from predictors.fitting.training import code_commit, fit_from_db

    db = tmp_path / "profiles_of_this_host.sqlite"
    build_fake_db(db)
    with sqlite3.connect(db) as conn:      # as `hetpart profile` records it: what extracted and compiled the kernels
        conn.execute("UPDATE hetpart_model_variants SET pipeline_version = ?", (versions.PIPELINE_VERSION,))
    conn.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    out = tmp_path / "cpu.json"
    fit_from_db(db, output=out)
    data = json.loads(out.read_text())
    training = data["provenance"]["training"]
    assert training["profile_db"] == "profiles_of_this_host.sqlite"           # a name, not a path of this machine
    assert str(tmp_path) not in out.read_text()
    assert training["profile_db_sha256"] == digest == hashlib.sha256(db.read_bytes()).hexdigest()  # not modified
    assert training["code_commit"] == code_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", training["code_commit"]) or training["code_commit"] == "unknown"
    assert data["provenance"]["feature_schema_version"] == FEATURE_SCHEMA_VERSION
    assert training["pipeline_versions"] == [versions.PIPELINE_VERSION]       # names the CPU rules' version
    assert f"rules-{RULES_VERSION}" in training["pipeline_versions"][0]


def test_the_code_commit_is_this_checkouts_head_or_unknown(monkeypatch):
    from predictors.fitting import training

    head = subprocess.run(["git", "-C", str(Path(training.__file__).resolve().parents[2]), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    expected = head.stdout.strip() if head.returncode == 0 else "unknown"
    assert training.code_commit() == expected

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(training.subprocess, "run", no_git)
    assert training.code_commit() == "unknown"


def test_evaluate_cli_writes_json_and_png(tmp_path):
    db = tmp_path / "p.sqlite"
    build_fake_db(db)
    out = tmp_path / "results"
    assert _run(["evaluate", "--db", str(db), "--out", str(out)]) == 0
    report = json.loads((out / "predictors.json").read_text())
    png = out / "predictors_scatter.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["n_model_records"] == 6 and set(report["families"]) == {"cnn_a", "cnn_b", "mlp"}
    lomo, lofo = report["splits"]["leave_one_model_out"], report["splits"]["leave_one_family_out"]
    for split in (lomo, lofo):
        assert {"polynomial", "flops_constant", "calibrated_roofline", "random_forest", "lookup"} <= set(split)
        assert len(split["polynomial"]["model"]["per_model"]) == 6
    assert set(report["goals_polynomial_lomo"]) >= {"kernel_ge_100us_mape", "model_mape"}
    floor = report["noise_floor"]["retest_normalised"]
    assert floor["n_kernels"] == 15 and 0.015 < floor["mape"] < 0.025     # retests were 2% off the labels
    between = report["noise_floor"]["between_sessions"]
    assert between["n_kernels"] == 5 and between["mape"] == pytest.approx((0.04 / 0.98 + 0.04 / 1.02) / 2)
    assert 25 <= report["n_synthetic_kernels"] <= 30
    assert report["misses_ge_100us"]["label_stable"] + report["misses_ge_100us"]["label_noisy"] \
        == report["misses_ge_100us"]["misses"]
