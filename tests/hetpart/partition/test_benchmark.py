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
    summary = bench.summary(rows)
    assert summary["cp_greedy_never_worse_than_baselines"] is True
    table = bench.markdown(rows, summary, "cmd")
    assert "| branchy-6-gpu_x0.1 | 6 | optimum |" in table


def test_lower_bound_is_used_for_graphs_too_large_for_milp(bench):
    rows = bench.run_benchmark(bench.synthetic_cases([30], shapes=("layered",), speedup_scales=(1.0,)),
                               milp_max_ops=10)
    assert rows[0]["reference"] == "lower bound" and "milp" not in rows[0]["methods"]
    assert all(r["ratio"] >= 1 - 1e-9 for r in rows[0]["methods"].values())
