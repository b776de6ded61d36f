"""benchmarks/partition.py on tiny cases: every ratio is >= 1 (the reference is an optimum or a lower bound)."""
from __future__ import annotations

import pytest

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("partition")


def test_run_benchmark_on_tiny_graphs(bench, tmp_path):
    cases = bench.synthetic_cases([6], shapes=("branchy", "layered"), speedup_scales=(0.1,))
    rows = bench.run_benchmark(cases, milp_max_ops=10, milp_time_limit_s=20)
    assert [r["case"] for r in rows] == ["branchy-6-gpu_x0.1", "layered-6-gpu_x0.1"]
    for row in rows:
        assert row["reference"] == "optimum"
        for method, result in row["methods"].items():
            assert result["ratio"] >= 1 - 1e-9, (row["case"], method)
        assert row["methods"]["milp"]["ratio"] == pytest.approx(1.0)
    for row in rows:
        assert set(row["methods"]) == {"all_cpu", "all_gpu", "greedy", "heft", "cp_greedy", "portfolio", "milp"}
    summary = bench.summary(rows)
    assert summary["portfolio_never_worse_than_baselines"] is True
    assert summary["milp_proofs"] == 2 and summary["milp_proof_sizes_ops"] == [6]
    assert summary["milp_proofs_nontrivial"] + summary["milp_proofs_matched_by_all_cpu_or_all_gpu"] == 2
    assert sum(summary["cp_greedy_vs_best_baseline"][k] for k in ("better", "equal", "worse")) == 2
    table = bench.markdown(rows, summary, "cmd", bench.ZOO_COSTS.format(predictor="cpu.json"), "a reduced set")
    assert "| branchy-6-gpu_x0.1 | 6 | optimum |" in table
    assert "proved the optimum in 2 (graphs of 6 ops)" in table and "a reduced set" in table
    assert "synthetic" not in table.lower()


def test_lower_bound_is_used_for_graphs_too_large_for_milp(bench):
    rows = bench.run_benchmark(bench.synthetic_cases([30], shapes=("layered",), speedup_scales=(1.0,)),
                               milp_max_ops=10)
    assert bench.summary(rows)["milp_run"] == 0
    assert rows[0]["reference"] == "lower bound" and "milp" not in rows[0]["methods"]
    assert all(r["ratio"] >= 1 - 1e-9 for r in rows[0]["methods"].values())
