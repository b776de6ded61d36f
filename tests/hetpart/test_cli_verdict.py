"""The compile summary's one-line verdict on the plan."""
from __future__ import annotations

from hetpart.driver.cli import _partition_verdict


def summary(kernels: dict[str, int]) -> dict:
    return {"per_device": {d: {"kernels": k} for d, k in kernels.items()},
            "baselines_us": {"all_cpu": 300.0, "all_gpu": 200.0}, "makespan_us": 100.0}


def test_a_split_plan_says_what_it_buys_over_the_best_single_device():
    assert "uses both devices" in _partition_verdict(summary({"cpu": 3, "gpu": 5}))
    assert "2.00x as fast as the best single device (all_gpu)" in _partition_verdict(summary({"cpu": 3, "gpu": 5}))


def test_a_plan_on_one_core_group_says_requests_spread_over_the_groups_that_share_work():
    one_group = summary({"cpu0": 8, "cpu1": 0})
    shared = _partition_verdict(one_group, shared_groups=(("cpu0", "cpu1"),))
    assert "keeps every kernel on cpu0" in shared and "spread over cpu0, cpu1" in shared
    assert "copies would cost more" not in shared
    assert "copies would cost more" in _partition_verdict(one_group)        # no segments: no task runtime
    assert "one device offered" in _partition_verdict(summary({"cpu": 8}))


def test_a_plan_made_for_many_requests_calls_its_one_request_figure_what_it_is():
    verdict = _partition_verdict(summary({"cpu": 3, "gpu": 5}), made_for=16)
    assert "made for 16 requests in flight" in verdict and "one request alone is predicted 2.00x as fast" in verdict
    assert "made for" not in _partition_verdict(summary({"cpu": 3, "gpu": 5}))
