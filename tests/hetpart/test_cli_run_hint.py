"""``hetpart run`` and ``hetpart compile`` tell the user when a plan made for many requests on the task runtime is
not run by it (``hetpart.driver.cli_run.task_runtime_hint``)."""
from __future__ import annotations

import pytest

from hetpart.driver.cli_run import made_for_task_runtime, task_runtime_hint
from hetpart.plan import Plan


def _plan(**kwargs) -> Plan:
    return Plan(("cpu", "gpu"), (0, 1), ("cpu", "gpu"), "timeslice", **kwargs)


@pytest.mark.parametrize("stats, config, expected", [
    ({}, {}, 0),                                             # one request at a time
    ({"requests": 1}, {}, 0),
    ({"requests": 16}, {}, 16),
    ({"requests": 1}, {"cross_device_sharing": True}, 2),   # sharing needs requests in flight to pay
    ({"requests": 64}, {"cross_device_sharing": True}, 64),
])
def test_requests_a_plan_was_made_for(stats, config, expected):
    assert made_for_task_runtime(_plan(stats=stats, config=config)) == expected


def test_the_hint_names_what_is_missing(tmp_path):
    assert task_runtime_hint(tmp_path, "sequential") is None                 # not a compiled directory
    _plan(stats={"requests": 1}).save(tmp_path / "plan.json")
    assert task_runtime_hint(tmp_path, "sequential") is None                 # made for one request
    _plan(stats={"requests": 16}).save(tmp_path / "plan.json")
    assert "recompile with --segments" in task_runtime_hint(tmp_path, "sequential")
    (tmp_path / "segments.json").write_text("{}")
    assert "add --mode tasks" in task_runtime_hint(tmp_path, "sequential")
    assert task_runtime_hint(tmp_path, "tasks") is None                       # it is run by the task runtime


def test_run_picks_the_task_runtime_for_a_plan_made_for_it(tmp_path):
    from hetpart.driver.cli_run import default_mode

    assert default_mode(tmp_path) == "sequential"                              # nothing compiled here
    _plan(stats={"requests": 16}).save(tmp_path / "plan.json")
    assert default_mode(tmp_path) == "sequential"                              # no segments built
    (tmp_path / "segments.json").write_text("{}")
    assert default_mode(tmp_path) == "tasks"
    _plan(stats={"requests": 1}).save(tmp_path / "plan.json")
    assert default_mode(tmp_path) == "sequential"                              # segments of a one-request plan


def test_compile_segments_flag_is_tri_state():
    from hetpart.driver.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["compile", "lstm_lm"]).segments is None         # decided by the plan's purpose
    assert parser.parse_args(["compile", "lstm_lm", "--segments"]).segments is True
    assert parser.parse_args(["compile", "lstm_lm", "--no-segments"]).segments is False
