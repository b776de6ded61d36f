"""benchmarks/cpu_kernels.py: variants timed in blocks, every variant in turn, and the protocol the table states."""
from __future__ import annotations

import pytest

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def cpu_kernels():
    return load_benchmark("cpu_kernels")


def test_blocks_take_turns_and_keep_each_blocks_median(cpu_kernels, monkeypatch):
    calls: list[str] = []
    durations = {"a": iter([1.0, 2.0, 30.0] * 3), "b": iter([70.0, 5.0, 6.0] * 3)}
    # _time_once times one call: the fake calls the runner and hands back that runner's next duration
    monkeypatch.setattr(cpu_kernels, "_time_once", lambda fn, reps=1: (fn(), next(durations[calls[-1]]))[1])
    monkeypatch.setattr(cpu_kernels.time, "sleep", lambda s: None)
    runners = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    times = cpu_kernels._block_times(runners, rounds=3, calls=3, pause_s=0.0)
    assert times == {"a": [2.0, 2.0, 2.0], "b": [6.0, 6.0, 6.0]}      # each block's median, one per round
    # every block is one untimed call and three timed ones of one runner; the order rotates: a b | b a | a b
    assert all(len(set(calls[i:i + 4])) == 1 for i in range(0, len(calls), 4))
    assert [calls[i] for i in range(0, len(calls), 4)] == ["a", "b", "b", "a", "a", "b"]


def test_max_rounds_caps_a_slow_variant(cpu_kernels, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_time_once", lambda fn, reps=1: (fn(), 1.0)[1])
    monkeypatch.setattr(cpu_kernels.time, "sleep", lambda s: None)
    counts = {"fast": 0, "slow": 0}

    def runner(name):
        return lambda: counts.__setitem__(name, counts[name] + 1)

    times = cpu_kernels._block_times({"fast": runner("fast"), "slow": runner("slow")}, rounds=4, calls=2,
                                     max_rounds={"slow": 1}, pause_s=0.0)
    assert len(times["fast"]) == 4 and len(times["slow"]) == 1
    assert counts == {"fast": 4 * 3, "slow": 1 * 2}          # a capped runner times one call per block


def _row() -> dict:
    return {"model": "m", "onnxruntime_ms": 2.0, "rules_ms": 3.0, "rules_ratio_to_ort": 1.5,
            "rules_max_abs_diff": 1e-6, "rules_max_rel_diff": 1e-7}


def test_the_table_states_how_it_was_timed(cpu_kernels):
    meta = {"date": "now", "cpu": "x86_64", "threads": 2, "target": "llvm", "rounds": 7, "default_rounds": 2}
    old = cpu_kernels._markdown([_row()], meta)
    assert "one call each per round" in old and "timed after the others" in old
    new = cpu_kernels._markdown([_row()], {**meta, "calls_per_block": 5})
    assert "then 5 back to back" in new and "median of 7 rounds" in new and "spinning (its default) and not" in new
    assert "| m | 2.0 | 3.0 | 1.50 |" in new


def test_summary_by_median_and_by_fastest_round(cpu_kernels):
    rows = [{**_row(), "model": "a", "rules_ratio_to_ort": 1.1,
             "samples_ms": {"onnxruntime": [4.0, 9.0], "onnxruntime_spinning": [5.0, 2.0], "rules": [3.0, 8.0]}},
            {**_row(), "model": "b", "rules_ratio_to_ort": 2.5,
             "samples_ms": {"onnxruntime": [1.0], "onnxruntime_spinning": [2.0], "rules": [1.2]}},
            {**_row(), "model": "c", "rules_ratio_to_ort": 0.9,
             "samples_ms": {"onnxruntime": [1.0], "onnxruntime_spinning": [1.0], "rules": [0.8]}}]
    assert cpu_kernels._fastest_round_ratio(rows[0]) == pytest.approx(1.5)      # 3.0 / min(4, 9, 5, 2)
    (_, line) = cpu_kernels._summary_lines(rows)
    assert "median of rounds: median 1.10x, worst 2.50x (b)" in line
    assert "Fastest round of each side" in line and "median 1.20x, worst 1.50x (a)" in line
    assert cpu_kernels._summary_lines([{"model": "x", "skipped": "import failed"}]) == []


def test_each_timing_of_a_block_may_average_back_to_back_calls(cpu_kernels, monkeypatch):
    seen_reps = []
    monkeypatch.setattr(cpu_kernels, "_time_once", lambda fn, reps=1: (seen_reps.append(reps), 1.0)[1])
    monkeypatch.setattr(cpu_kernels.time, "sleep", lambda s: None)
    cpu_kernels._block_times({"a": lambda: None}, rounds=2, calls=3, pause_s=0.0, reps=7)
    assert seen_reps == [7] * 6


def test_the_convolution_table_states_how_it_was_timed(monkeypatch):
    from tests.scripts import BENCHMARKS

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    conv_shapes = load_benchmark("cpu_conv_shapes")
    meta = {"date": "now", "cpu": "x86_64", "threads": 2, "target": "llvm", "load_average": "0", "rounds": 11,
            "command": "cmd"}
    row = {"shape": "s", "conv": "1->2", "gflop": 0.1, "onnxruntime_ms": 2.0, "rules_ms": 3.0,
           "rules_ratio_to_ort": 1.5, "rules_max_rel_diff": 1e-7, "rules_applied": "conv2d_flat"}
    assert "onnxruntime thread spinning off" in conv_shapes.conv_markdown([row], meta)
    text = conv_shapes.conv_markdown([row], {**meta, "calls_per_block": 5, "pause_s": 0.3})
    assert "waits 0.3 s" in text and "then 5 samples" in text and "better of the two" in text
    assert "| s | 1->2 | 0.100 | 2.000 | 3.000 | 1.50 |" in text
