"""hetpart's persistent MetaSchedule tuning database: file names, reading with validation, atomic commits.

The database is a directory holding MetaSchedule's two JSON-lines files (WORKLOAD_FILE, RECORD_FILE), so
MetaSchedule's own ``JSONDatabase`` can read it too.  hetpart writes it only through :func:`commit_record`:
the new lines are produced by MetaSchedule in a private staging directory, merged with what is already
committed, written to temporary files next to the database and moved into place with ``os.replace``
(workloads first, then records).  A reader therefore sees either the previous or the new database, never an
empty or half-written file, and an interrupted tune keeps everything committed before the interrupt.

:func:`read_database` validates a database (both files present and non-empty, every line JSON of the right
shape, record indices in range, every workload and record loadable by MetaSchedule) and returns it as an
in-memory database, so the compile path never writes to the directory.  Records are keyed by
:func:`workload_module` of a kernel as :func:`kernel_lowering_passes` produce it; ``tvm_passes.tune`` commits
under that key and ``tvm_passes.schedules.pipeline`` looks kernels up under the same key.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm.target import Target

from hetpart.errors import HetpartError

logger = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
UNREADABLE_SUFFIX = ".unreadable"
# Function attributes that say where a kernel runs, not what it computes: dropped from the workload key, so a
# kernel bound to a device by tvm_passes.build matches the record tuned for the unbound kernel.
PLACEMENT_ATTRS = ("target",)


class TuningDatabaseError(HetpartError, ValueError):
    """A tuning database directory cannot be read (empty, truncated or malformed files, unloadable records)."""


def database_files(database_dir: Path | str) -> tuple[Path, Path]:
    """The workload and tuning-record files of the database in ``database_dir``."""
    directory = Path(database_dir)
    return directory / WORKLOAD_FILE, directory / RECORD_FILE


def has_database(database_dir: Path | str) -> bool:
    """Whether ``database_dir`` holds any database file (readable or not)."""
    return any(path.exists() for path in database_files(database_dir))


def kernel_lowering_passes(target: Target) -> list[tvm.transform.Pass]:
    """The passes up to FuseTIR that turn a Relax model into the CPU kernels the database is keyed on.

    ``cpu_pipeline`` runs exactly these before it applies the database and the rules, and ``tune_model``
    lowers with them before extracting tasks, so a tuned workload is structurally equal to the kernel a
    later compile looks up.
    """
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    from .fusion import with_stacks_unfused
    from .legalize import with_hetpart_legalization
    from .schedules.base import vector_lanes
    from .schedules.layout import prepack_conv_weights

    return (
        [prepack_conv_weights(vector_lanes(target))]
        + cpu_generic.library_dispatch_passes(target)
        + with_stacks_unfused(with_hetpart_legalization(cpu_generic.legalize_passes(target)))
    )


def workload_module(func: tirx.PrimFunc) -> tvm.ir.IRModule:
    """The database key of a kernel: MetaSchedule's normalised module of ``func`` without placement attributes."""
    for name in PLACEMENT_ATTRS:
        if func.attrs is not None and name in func.attrs:
            func = func.without_attr(name)
    return _normalize_mod(func)


def _fix_hint(directory: Path) -> str:
    return f"delete {directory} or run `hetpart tune` again (it sets unreadable files aside)"


def _json_lines(path: Path, shape_ok, what: str) -> list[str]:
    """The non-blank lines of ``path``, each checked to be JSON accepted by ``shape_ok``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TuningDatabaseError(f"{path} must be a readable UTF-8 file; reading it failed: {exc}") from exc
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TuningDatabaseError(f"{path} must hold at least one {what} line; it is empty ({len(text)} bytes)")
    for number, line in enumerate(lines, start=1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TuningDatabaseError(f"line {number} of {path} must be JSON; it is not ({exc.msg})") from exc
        if not shape_ok(value):
            raise TuningDatabaseError(f"line {number} of {path} must be a {what}; found {line[:80]!r}")
    return lines


def _is_workload_line(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _is_record_line(value) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and len(value[1]) == 4)


def _checked_lines(directory: Path) -> tuple[list[str], list[str]]:
    """The workload and record lines of a database whose files are valid JSON lines of the right shape."""
    workload_path, record_path = database_files(directory)
    missing = [path.name for path in (workload_path, record_path) if not path.exists()]
    if missing:
        raise TuningDatabaseError(f"a tuning database needs both {WORKLOAD_FILE} and {RECORD_FILE}; "
                                  f"{directory} lacks {', '.join(missing)}")
    workloads = _json_lines(workload_path, _is_workload_line, "workload ([hash, module])")
    records = _json_lines(record_path, _is_record_line, "tuning record ([workload index, record])")
    for number, line in enumerate(records, start=1):
        index = json.loads(line)[0]
        if not 0 <= index < len(workloads):
            raise TuningDatabaseError(f"record {number} of {record_path} must refer to one of the "
                                      f"{len(workloads)} workloads; it refers to workload {index}")
    return workloads, records


def read_database(database_dir: Path | str) -> ms.database.Database | None:
    """The validated database in ``database_dir`` as an in-memory copy; None when there is no database file.

    Raises :class:`TuningDatabaseError` (with the fix in its message) when the files are not a readable
    database: one file missing, an empty file, a line that is not JSON of the right shape, a record index out
    of range, or a workload or record MetaSchedule cannot load.
    """
    directory = Path(database_dir)
    if not has_database(directory):
        return None
    try:
        _, records = _checked_lines(directory)
        workload_path, record_path = database_files(directory)
        try:
            stored = ms.database.JSONDatabase(path_workload=str(workload_path), path_tuning_record=str(record_path),
                                              allow_missing=False)
            loaded = list(stored.get_all_tuning_records())
        except Exception as exc:  # noqa: BLE001 (MetaSchedule raises RuntimeError, InternalError, ValueError...)
            message = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
            raise TuningDatabaseError(f"MetaSchedule must be able to load every workload and record in "
                                      f"{directory}; loading failed: {message}") from exc
        if len(loaded) != len(records):
            raise TuningDatabaseError(f"{record_path} holds {len(records)} records but only {len(loaded)} load")
    except TuningDatabaseError as exc:
        raise TuningDatabaseError(f"unreadable tuning database in {directory}: {exc}. Fix: {_fix_hint(directory)}") from exc
    memory = ms.database.MemoryDatabase()
    for record in loaded:
        workload = memory.commit_workload(record.workload.mod)
        memory.commit_tuning_record(
            ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target, record.args_info)
        )
    return memory


def set_aside_unreadable(database_dir: Path | str) -> list[Path]:
    """Move the database files out of the way: 0-byte files are deleted, others renamed ``*.unreadable``.

    Returns the paths the non-empty files were moved to (an earlier ``*.unreadable`` copy is replaced).
    """
    moved = []
    for path in database_files(database_dir):
        if not path.exists():
            continue
        if path.stat().st_size == 0:
            path.unlink()
            continue
        destination = path.with_name(path.name + UNREADABLE_SUFFIX)
        os.replace(path, destination)
        moved.append(destination)
    return moved


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, flush it to disk and move it onto ``path``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _serialised_lines(workload_mod: tvm.ir.IRModule, record: ms.database.TuningRecord, target: Target) -> tuple[str, str]:
    """MetaSchedule's own JSON lines for one workload and one record on it (written in a staging directory)."""
    with tempfile.TemporaryDirectory(prefix="hetpart-tuning-staging-") as staging:
        database = ms.database.JSONDatabase(work_dir=staging, allow_missing=True)
        workload = database.commit_workload(workload_mod)
        database.commit_tuning_record(
            ms.database.TuningRecord(record.trace, workload, record.run_secs, target, record.args_info)
        )
        workload_path, record_path = database_files(staging)
        (workload_line,) = [line for line in workload_path.read_text().splitlines() if line.strip()]
        (record_line,) = [line for line in record_path.read_text().splitlines() if line.strip()]
    return workload_line, record_line


def commit_record(database_dir: Path | str, workload_mod: tvm.ir.IRModule, record: ms.database.TuningRecord,
                  target: Target) -> None:
    """Add ``record`` (trace, run_secs, args_info of a tuning result) for ``workload_mod`` to the database.

    The database must be readable or absent (``tune_model`` sets unreadable files aside before tuning).
    Both files are replaced atomically, workloads first: a crash in between leaves an unused workload line,
    which is valid.
    """
    directory = Path(database_dir)
    directory.mkdir(parents=True, exist_ok=True)
    workload_line, record_line = _serialised_lines(workload_mod, record, target)
    workloads, records = _checked_lines(directory) if has_database(directory) else ([], [])
    prefix = "[0,"
    if not record_line.startswith(prefix):
        raise TuningDatabaseError(f"MetaSchedule's record line must start with {prefix!r}; found {record_line[:40]!r}. "
                                  "This TVM version writes another format: update tvm_passes.tuning_db")
    if workload_line in workloads:
        index = workloads.index(workload_line)
    else:
        index = len(workloads)
        workloads.append(workload_line)
    records.append(f"[{index}," + record_line[len(prefix):])
    workload_path, record_path = database_files(directory)
    _write_atomically(workload_path, "\n".join(workloads) + "\n")
    _write_atomically(record_path, "\n".join(records) + "\n")
    logger.debug("committed a tuning record for workload %d to %s", index, directory)


def default_database_dir() -> Path:
    """The persistent MetaSchedule database ``hetpart tune`` writes and compiles read: ``<cache root>/tuning``."""
    from hetpart.paths import cache_root

    return cache_root() / "tuning"
