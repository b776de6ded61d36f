"""tvm_passes.tuning_db: validated reading, atomic commits, setting unreadable files aside, the workload key."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
import tvm_ffi  # noqa: E402
from tvm import relax, tirx  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tvm_passes import tuning_db  # noqa: E402
from tvm_passes.schedules import default_cpu_target  # noqa: E402

pytestmark = pytest.mark.tvm

REPO = Path(__file__).resolve().parents[2]


def _dense_kernel(m: int, k: int, n: int) -> tirx.PrimFunc:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(np.ones((k, n), "float32"))))
        bb.emit_func_output(out)
    target = default_cpu_target()
    with target:
        lowered = tvm.transform.Sequential(tuning_db.kernel_lowering_passes(target))(bb.get())
    (func,) = [f for _, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def _record(func: tirx.PrimFunc, split_factor: int = 4) -> tuple[tvm.ir.IRModule, ms.database.TuningRecord]:
    """The workload of ``func`` and a record whose trace splits its first loop by ``split_factor``."""
    workload_mod = tuning_db.workload_module(func)
    sch = tvm.s_tir.Schedule(workload_mod)
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root")) if "matmul" in sch.get(b).name_hint)
    sch.split(sch.get_loops(block)[0], factors=[None, split_factor])
    scratch = ms.database.MemoryDatabase()
    record = ms.database.TuningRecord(sch.trace, scratch.commit_workload(workload_mod), [1e-3], default_cpu_target(),
                                      ms.arg_info.ArgInfo.from_prim_func(workload_mod["main"]))
    return workload_mod, record


@pytest.fixture(scope="module")
def dense():
    return _dense_kernel(16, 64, 48)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def test_a_directory_without_files_has_no_database(tmp_path):
    assert not tuning_db.has_database(tmp_path / "absent")
    assert tuning_db.read_database(tmp_path / "absent") is None
    assert tuning_db.read_database(tmp_path) is None


def test_committed_records_read_back_and_share_workload_lines(tmp_path, dense):
    workload_path, record_path = tuning_db.database_files(tmp_path)
    workload_mod, record = _record(dense, 4)
    tuning_db.commit_record(tmp_path, workload_mod, record, default_cpu_target())
    tuning_db.commit_record(tmp_path, workload_mod, _record(dense, 8)[1], default_cpu_target())
    other_mod, other_record = _record(_dense_kernel(8, 32, 16))
    tuning_db.commit_record(tmp_path, other_mod, other_record, default_cpu_target())

    assert len(_lines(workload_path)) == 2  # the first workload's line is reused by its second record
    assert [json.loads(line)[0] for line in _lines(record_path)] == [0, 0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([workload_path.name, record_path.name])
    database = tuning_db.read_database(tmp_path)
    assert len(database.get_all_tuning_records()) == 3
    assert database.has_workload(tuning_db.workload_module(dense))
    # MetaSchedule's own reader agrees with ours.
    stored = ms.database.JSONDatabase(str(workload_path), str(record_path), allow_missing=False)
    assert len(stored.get_all_tuning_records()) == 3


def _write(directory: Path, workload_text: str | None, record_text: str | None) -> None:
    workload_path, record_path = tuning_db.database_files(directory)
    for path, text in ((workload_path, workload_text), (record_path, record_text)):
        if text is not None:
            path.write_text(text)


@pytest.fixture(scope="module")
def valid_texts(tmp_path_factory, dense):
    directory = tmp_path_factory.mktemp("valid")
    tuning_db.commit_record(directory, *_record(dense), default_cpu_target())
    return tuple(path.read_text() for path in tuning_db.database_files(directory))


CORRUPTIONS = {
    "both files empty": lambda w, r: ("", ""),
    "record file empty": lambda w, r: (w, ""),
    "record file missing": lambda w, r: (w, None),
    "garbage json": lambda w, r: ("{not json\n", "[[[garbage\n"),
    "truncated workload": lambda w, r: (w[: len(w) // 2], r),
    "truncated record": lambda w, r: (w, r[: len(r) // 2]),
    "wrong shape": lambda w, r: ("{}\n", "{}\n"),
    "record index out of range": lambda w, r: (w, "[5" + r[2:]),
    "unknown trace instruction": lambda w, r: (w, r.replace('"Split"', '"NoSuchInstruction"')),
    "module that does not decode": lambda w, r: (w.replace('","', '","!!!!', 1), r),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_unreadable_databases_raise_an_error_naming_the_directory_and_the_fix(tmp_path, valid_texts, corruption):
    _write(tmp_path, *CORRUPTIONS[corruption](*valid_texts))
    with pytest.raises(tuning_db.TuningDatabaseError) as caught:
        tuning_db.read_database(tmp_path)
    message = str(caught.value)
    assert str(tmp_path) in message and "hetpart tune" in message and f"delete {tmp_path}" in message


def test_an_interrupted_commit_keeps_the_previous_records_and_leaves_no_temporary_files(tmp_path, dense, monkeypatch):
    target = default_cpu_target()
    tuning_db.commit_record(tmp_path, *_record(dense), target)
    _, record_path = tuning_db.database_files(tmp_path)
    before = record_path.read_text()
    real_replace = tuning_db.os.replace

    def interrupted_replace(src, dst):
        if Path(dst) == record_path:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(tuning_db.os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        tuning_db.commit_record(tmp_path, *_record(_dense_kernel(8, 32, 16)), target)
    monkeypatch.undo()
    assert record_path.read_text() == before
    assert len(tuning_db.read_database(tmp_path).get_all_tuning_records()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in tuning_db.database_files(tmp_path))


def test_set_aside_deletes_empty_files_and_renames_the_others(tmp_path):
    workload_path, record_path = tuning_db.database_files(tmp_path)
    workload_path.write_text("{not json\n")
    record_path.write_text("")
    moved = tuning_db.set_aside_unreadable(tmp_path)
    assert moved == [tmp_path / (workload_path.name + tuning_db.UNREADABLE_SUFFIX)]
    assert moved[0].read_text() == "{not json\n"
    assert not tuning_db.has_database(tmp_path) and not list(tmp_path.glob("*.json"))


def test_the_workload_key_ignores_where_a_kernel_runs(dense):
    bound = dense.with_attr("target", default_cpu_target())
    assert tvm_ffi.structural_equal(tuning_db.workload_module(bound), tuning_db.workload_module(dense))
    assert not tvm_ffi.structural_equal(tuning_db.workload_module(bound), tuning_db.workload_module(
        _dense_kernel(8, 32, 16)))


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.update({base} | {f"{base}.{alias.name}".replace("..", ".") for alias in node.names})
    return names


def test_tune_and_the_cpu_pipeline_share_tuning_db_and_do_not_import_each_other():
    tune_imports = _imported_modules(REPO / "tvm_passes" / "tune.py")
    pipeline_imports = _imported_modules(REPO / "tvm_passes" / "schedules" / "pipeline.py")
    assert not any(name.endswith("pipeline") and "schedules" in name for name in tune_imports)
    assert not any(name.endswith("tune") for name in pipeline_imports)
    assert any(name.endswith("tuning_db") for name in tune_imports)
    assert any(name.endswith("tuning_db") for name in pipeline_imports)
