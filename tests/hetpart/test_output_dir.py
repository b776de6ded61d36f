"""Output directories: hetpart never deletes or moves a file it did not write, and an interrupted write leaves the
earlier output intact."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hetpart.errors import OutputDirError
from hetpart.driver.output_dir import INDEX_NAME, check_writable, read_index, write_directory


def _writer(files: dict[str, str]):
    def write(staging: Path) -> None:
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)
    return write


def test_new_directory_is_written_with_an_index_and_the_users_umask(tmp_path):
    out = write_directory(tmp_path / "out", _writer({"a.txt": "1", "sub/b.txt": "2"}))
    assert (out / "a.txt").read_text() == "1" and (out / "sub" / "b.txt").read_text() == "2"
    assert read_index(out) == ["a.txt", "sub/b.txt"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["out"]        # no staging or backup directory left


def test_a_directory_holding_a_users_file_is_refused_and_untouched(tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "model.onnx").write_bytes(b"user bytes")
    for overwrite in (False, True):
        with pytest.raises(OutputDirError, match="not a hetpart output"):
            write_directory(user_dir, _writer({"x": "y"}), overwrite=overwrite)
    assert [p.name for p in user_dir.iterdir()] == ["model.onnx"]
    assert (user_dir / "model.onnx").read_bytes() == b"user bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_an_existing_file_is_never_replaced(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"user bytes")
    with pytest.raises(OutputDirError, match="existing file"):
        write_directory(model, _writer({"x": "y"}), overwrite=True)
    assert model.read_bytes() == b"user bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_an_empty_directory_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    out = write_directory(tmp_path / "empty", _writer({"a": "1"}))
    assert (out / "a").read_text() == "1"


def test_an_earlier_output_needs_force_and_is_replaced_whole(tmp_path):
    out = write_directory(tmp_path / "out", _writer({"old.txt": "old", "keep.txt": "1"}))
    with pytest.raises(OutputDirError, match="--force"):
        write_directory(out, _writer({"keep.txt": "2"}))
    assert (out / "old.txt").exists()
    write_directory(out, _writer({"keep.txt": "2"}), overwrite=True)
    assert (out / "keep.txt").read_text() == "2" and not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_force_refuses_an_earlier_output_holding_a_users_file(tmp_path):
    out = write_directory(tmp_path / "out", _writer({"plan.json": "{}"}))
    (out / "notes.txt").write_text("my notes")
    with pytest.raises(OutputDirError, match="notes.txt"):
        write_directory(out, _writer({"plan.json": "{}"}), overwrite=True)
    assert (out / "notes.txt").read_text() == "my notes"


def test_an_interrupted_write_leaves_the_earlier_output_intact(tmp_path):
    out = write_directory(tmp_path / "out", _writer({"plan.json": "first"}))

    def failing(staging: Path) -> None:
        (staging / "plan.json").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_directory(out, failing, overwrite=True)
    assert (out / "plan.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_forged_or_broken_index_is_not_trusted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.csv").write_text("1,2")
    (out / INDEX_NAME).write_text("not json")
    with pytest.raises(OutputDirError, match="not a hetpart output"):
        check_writable(out, overwrite=True)
    (out / INDEX_NAME).write_text(json.dumps({"kind": "something else", "files": ["data.csv"]}))
    with pytest.raises(OutputDirError, match="not a hetpart output"):
        check_writable(out, overwrite=True)


def test_a_symlink_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OutputDirError, match="symlink"):
        check_writable(tmp_path / "link")
