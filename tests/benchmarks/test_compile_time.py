"""benchmarks/compile_time.py: the table's medians per tree, the goal judged only for unrolled RNNs, checkouts
checked."""
from __future__ import annotations

import pytest

from tests.scripts import load_benchmark


@pytest.fixture(scope="module")
def compile_time():
    return load_benchmark("compile_time")


def _record(model: str, tree: str, ops: int, wall_s: float, build_s: float) -> dict:
    seconds = {"import": 1.0, "analyze": 2.0, "costs": 0.5, "plan": 0.5, "build": build_s, "save": 3.0}
    return {"model": model, "tree": tree, "ops": ops, "kernels": ops // 5, "wall_s": wall_s, "seconds": seconds}


def test_table_gives_each_tree_its_medians_and_judges_the_goal_for_large_models_only(compile_time):
    records = [_record("gru:600", "this", 18000, wall, build) for wall, build in ((55.0, 20.0), (63.0, 30.0),
                                                                                   (70.0, 40.0))]
    records += [_record("gru:600", "against", 18000, 66.0, 33.0), _record("resnet", "this", 177, 90.0, 5.0)]
    meta = {"cpu": "znver3", "threads": "2", "command": "python benchmarks/compile_time.py", "date": "today",
            "rounds": 3}
    rows = {line.split(" | ")[0] + "|" + line.split(" | ")[1]: line
            for line in compile_time.render(records, meta).splitlines() if line.startswith("| gru") or
            line.startswith("| resnet")}
    this = rows["| gru:600|this"]
    assert "| 30.0 |" in this and "| 63.0 | 55.0, 63.0, 70.0 | missed |" in this        # medians, every round
    assert rows["| gru:600|against"].endswith("| 66.0 | 66.0 | missed |")
    assert rows["| resnet|this"].endswith("| 90.0 | 90.0 |  |")                       # not an unrolled RNN
    assert compile_time.GOAL_SECONDS == 60.0


def test_against_must_be_a_hetpart_checkout(compile_time, tmp_path):
    with pytest.raises(SystemExit, match="must be a hetpart checkout"):
        compile_time.main(["--models", "resnet18", "--against", str(tmp_path)])
