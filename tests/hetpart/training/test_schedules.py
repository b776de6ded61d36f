"""The schedule simulator on hand-checked cases, and the repetend search."""
from __future__ import annotations

import pytest

from hetpart.errors import ScheduleError
from hetpart.training.schedule_search import TesselConfig, search, unroll
from hetpart.training.schedules import inflight_limit, simulate
from hetpart.training.stage_plan import Stage, StagePlan

from .helpers import IDEAL_LINK, TEST_LINK, make_cluster

CLUSTER = make_cluster("gpu=t4x8", link=IDEAL_LINK)


def stages(times, devices=None, act=10, weights=0, send=0):
    devices = devices or [(f"gpu{k}",) for k in range(len(times))]
    return [Stage(k, (k,), devices[k], f, b, act, weights, weights, send) for k, (f, b) in enumerate(times)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (3, 5), (1, 3)])
def test_equal_stages_take_m_plus_p_minus_1_slots(schedule, p, m):
    r = simulate(stages([(1.0, 2.0)] * p), CLUSTER, m, schedule)
    assert r.iteration_us == pytest.approx((m + p - 1) * 3.0)
    assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_memory_gpipe_stashes_everything_1f1b_stage_depth():
    g = simulate(stages([(1.0, 2.0)] * 4, act=10, weights=100), CLUSTER, 8, "gpipe")
    o = simulate(stages([(1.0, 2.0)] * 4, act=10, weights=100), CLUSTER, 8, "1f1b")
    assert g.peak_memory_bytes == {f"gpu{k}": 100 + 8 * 10 for k in range(4)}
    assert o.peak_memory_bytes == {f"gpu{k}": 100 + (4 - k) * 10 for k in range(4)}


def test_zero_bubble_beats_1f1b_at_the_same_memory():
    s = stages([(1.0, 2.0)] * 4)
    zb, one = simulate(s, CLUSTER, 8, "zero_bubble"), simulate(s, CLUSTER, 8, "1f1b")
    assert zb.iteration_us == pytest.approx(30.0) and one.iteration_us == pytest.approx(33.0)
    assert zb.peak_memory_bytes == one.peak_memory_bytes


def test_interleaved_matches_megatron_formula():
    # 4 devices x 2 virtual stages: (m + (p - 1) / v) * (f + b) per device work of both chunks
    s = stages([(0.5, 1.0)] * 8, devices=[(f"gpu{k % 4}",) for k in range(8)])
    r = simulate(s, CLUSTER, 8, "interleaved_1f1b")
    assert r.iteration_us == pytest.approx((8 + 3 / 2) * 3.0)
    with pytest.raises(ScheduleError, match="multiple"):
        simulate(s, CLUSTER, 6, "interleaved_1f1b")


def test_link_time_adds_to_each_hop():
    # 2 stages, f = 1, b = 2, messages of 10 B over 1 B/us + 1 us: one micro-batch = 1 + 11 + 1 + 2 + 11 + 2
    cluster = make_cluster("gpu=t4x2", link=TEST_LINK)
    r = simulate(stages([(1.0, 2.0)] * 2, send=10), cluster, 1, "1f1b")
    assert r.iteration_us == pytest.approx(28.0)


def test_replicated_stage_and_allreduce():
    # stage 1 on two replicas takes micro-batches alternately; its 1e6 B of gradients are all-reduced at the end
    cluster = make_cluster("gpu=t4x3", link=TEST_LINK)
    s = [Stage(0, (0,), ("gpu0",), 1.0, 2.0, 0, 0, 0, 0),
         Stage(1, (1,), ("gpu1", "gpu2"), 2.0, 4.0, 0, 1000, 1000, 0, cluster.allreduce_us(1000, ["gpu1", "gpu2"]))]
    r = simulate(s, cluster, 4, "gpipe", keep_events=True)
    assert {e.device for e in r.events if e.task.stage == 1 and e.task.microbatch % 2} == {"gpu2"}
    assert cluster.allreduce_us(1000, ["gpu1", "gpu2"]) == pytest.approx(1000 + 2)   # 2(r-1)/r S/B + 2(r-1)a
    assert r.allreduce_end_us == pytest.approx(r.iteration_us)
    assert r.allreduce_end_us > max(e.end_us for e in r.events)
    assert inflight_limit([1, 2], 0) == 3 and inflight_limit([1, 2], 1) == 1


def test_tessel_finds_1f1b_and_beats_it_on_unbalanced_stages():
    def plan(times):
        return StagePlan("m", "x", 8, "1f1b", tuple(stages(times)), CLUSTER, 0.0, 0.0, 0.0, {})
    balanced = search(plan([(1.0, 2.0)] * 4))
    assert balanced.repetend.period_us == pytest.approx(3.0)
    assert balanced.result.iteration_us == pytest.approx(33.0)
    unbalanced = plan([(1.0, 2.0), (2.0, 4.0), (1.0, 2.0), (1.0, 2.0)])
    found = search(unbalanced)
    assert found.repetend.period_us == pytest.approx(6.0)             # the busiest device's work: no bubbles
    assert found.result.iteration_us < simulate(unbalanced.stages, CLUSTER, 8, "1f1b").iteration_us
    least_memory = search(unbalanced, TesselConfig(stop_at_zero_bubbles=True))
    assert least_memory.repetend.microbatches_held <= found.repetend.microbatches_held
    orders = unroll(found.repetend, 8)
    assert sum(len(o) for o in orders.values()) == 2 * 4 * 8
