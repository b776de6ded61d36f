"""SQLite profile database: one row per kernel measurement, safe to resume and to share between processes.

Layout (schema version :data:`SCHEMA_VERSION`):

* ``hetpart_meta(key, value)`` -- ``application = hetpart-profile-db`` and ``schema_version``; a file without it
  is refused (:class:`~hetpart.errors.ProfileDatabaseError`), so a foreign or newer database is never modified.
* ``measurements`` -- one row per (workload key hash, device, target, TVM version), enforced by a UNIQUE
  constraint: median/MAD/spread/all samples, the canary latency of the same timing window, thread count,
  features JSON, status (``ok`` / ``rejected_noisy`` / ``failed``), session id and timestamp.
* ``claims`` -- which session is measuring which workload right now, so two profilers on one database split the
  work instead of measuring the same workload twice. A claim whose process is dead (same host) or that is older
  than ``stale_after_s`` is taken over, so a killed run never blocks a rerun.

The database runs in WAL mode with a busy timeout; every measurement is committed as soon as it is stored, so a
run killed half-way loses at most the measurement in flight. :mod:`predictors.profiling.profiling_run` drives a
budgeted, resumable run over a store. This module does not import TVM.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
import sqlite3
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import ProfileDatabaseError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
APPLICATION = "hetpart-profile-db"
STATUSES = ("ok", "rejected_noisy", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS hetpart_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key_hash TEXT NOT NULL, workload_key TEXT NOT NULL, kernel_name TEXT NOT NULL,
    device TEXT NOT NULL, target TEXT NOT NULL, tvm_version TEXT NOT NULL, num_threads INTEGER NOT NULL,
    canary_kernel TEXT NOT NULL, canary_us REAL,
    median_us REAL, mad_us REAL, spread REAL, n_repeats INTEGER NOT NULL, number INTEGER NOT NULL,
    samples_us TEXT NOT NULL, features TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'rejected_noisy', 'failed')), error TEXT NOT NULL,
    session_id TEXT NOT NULL, timestamp_s REAL NOT NULL,
    UNIQUE (key_hash, device, target, tvm_version));
CREATE INDEX IF NOT EXISTS measurements_by_device ON measurements (device, status);
CREATE TABLE IF NOT EXISTS claims (
    key_hash TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL, tvm_version TEXT NOT NULL,
    session_id TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, claimed_at_s REAL NOT NULL,
    PRIMARY KEY (key_hash, device, target, tvm_version));
"""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal workloads give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def feature_identity(features: Mapping[str, Any]) -> str:
    """What a stored feature dict says about the *operator* (op, shapes, attributes, counts), as a string.

    Leaves out names, ids and provenance tags (which model the kernel came from, its TIR hash): two rows with
    equal identities measure the same operator, possibly as different kernels (an older compiler's).
    """
    return canonical_json({k: v for k, v in features.items()
                           if k not in ("tags", "id", "name", "inputs", "graph_inputs", "kernel_group")})


def key_hash_of(workload_key: str) -> str:
    """Short stable hash (sha256, 20 hex digits) of a canonical workload key."""
    return hashlib.sha256(workload_key.encode()).hexdigest()[:20]


CANARY_TRUST = 0.05       # canaries within ±5% of the reference are drift; beyond, contention (see below)


def normalise_latency(median_us: float, canary_us: float, reference_canary_us: float) -> float:
    """Rescale a latency measured while the canary took ``canary_us`` to a window where it took the reference.

    Between sessions the machine's speed drifts; the canary measured in the same window tracks that drift, so
    ``median_us * reference / canary`` puts measurements from different sessions on one scale. A canary more than
    :data:`CANARY_TRUST` away from the reference is not drift but contention while the canary ran: in a quiet
    campaign the 1,266 kernel canaries had p5-p95 70.7-76.1 µs around a 73.1 µs median (±4%), while whole-model
    windows showed canaries of 78-108 µs next to normal model timings. Such a window is not rescaled: dividing by
    an inflated canary made MobileNetV2 (112 px) look 8% and a GRU 13% faster than they ran.
    """
    for label, value in (("median_us", median_us), ("canary_us", canary_us),
                         ("reference_canary_us", reference_canary_us)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"normalise_latency needs finite {label} > 0; found {value}")
    ratio = reference_canary_us / canary_us
    return median_us * ratio if abs(math.log(ratio)) <= math.log1p(CANARY_TRUST) else median_us


@dataclass(frozen=True)
class Measurement:
    """One timed kernel (or a failed / rejected attempt) as stored in the database."""

    key_hash: str
    workload_key: str              # canonical JSON: kind + shapes + dtypes + attrs (+ TIR hash)
    kernel_name: str
    device: str                    # hetpart device name, e.g. "cpu", "gpu"
    target: str                    # TVM target as canonical JSON
    tvm_version: str
    num_threads: int
    canary_kernel: str             # which canary (e.g. "matmul_256_float32"); normalise only like with like
    canary_us: float | None        # canary median in the same timing window
    median_us: float | None        # the label
    mad_us: float | None
    spread: float | None           # mad_us / median_us
    n_repeats: int
    number: int                    # kernel calls averaged inside one repeat
    samples_us: tuple[float, ...]  # one value per repeat (per-call average)
    features: Mapping[str, Any]
    status: str                    # ok | rejected_noisy | failed
    error: str = ""
    session_id: str = ""
    timestamp_s: float = 0.0
    row_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples_us", tuple(float(s) for s in self.samples_us))
        object.__setattr__(self, "features", dict(self.features))

    def validate(self) -> "Measurement":
        if self.status not in STATUSES:
            raise ProfileDatabaseError(f"measurement status must be one of {STATUSES}; found {self.status!r}")
        if self.status == "failed" and not self.error:
            raise ProfileDatabaseError(f"failed measurement of {self.kernel_name!r} must carry its error text")
        if self.status == "ok":
            if self.median_us is None or not (math.isfinite(self.median_us) and self.median_us > 0):
                raise ProfileDatabaseError(
                    f"ok measurement of {self.kernel_name!r} needs a finite median_us > 0; found {self.median_us}")
            if not self.samples_us:
                raise ProfileDatabaseError(f"ok measurement of {self.kernel_name!r} has no samples")
        if self.num_threads < 1:
            raise ProfileDatabaseError(f"num_threads must be >= 1; found {self.num_threads}")
        return self

    def normalised_us(self, reference_canary_us: float) -> float:
        """The median rescaled to a window where the canary took ``reference_canary_us``."""
        if self.median_us is None or self.canary_us is None:
            raise ProfileDatabaseError(
                f"{self.kernel_name!r} ({self.status}) has no median or canary to normalise")
        return normalise_latency(self.median_us, self.canary_us, reference_canary_us)


_COLUMNS = tuple(f.name for f in fields(Measurement) if f.name != "row_id")


class ProfileStore:
    """A profile database file. Open one per process (connections are not shared across processes)."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0) -> None:
        self.path = str(path)
        self._thread_count_checked: set[tuple[str, str, str, int]] = set()
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise ProfileDatabaseError(
                f"cannot open profile database {self.path!r}: {exc}. Fix: check the path and its permissions."
            ) from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._open_or_initialise()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise ProfileDatabaseError(
                f"{self.path!r} is not a readable SQLite database (SQLite says: {exc}). It may be corrupt or "
                "another kind of file. Fix: move it away and profile into a new file (e.g. --db profiles.sqlite)."
            ) from exc

    # ------------------------------------------------------------------ opening
    def _tables(self) -> set[str]:
        return {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _open_or_initialise(self) -> None:
        if not self._tables():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if not self._tables():       # another process may have initialised it meanwhile
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                    self._conn.executemany("INSERT OR IGNORE INTO hetpart_meta VALUES (?, ?)",
                                           [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))])
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            logger.info("initialised profile database %s (schema version %d)", self.path, SCHEMA_VERSION)
        self._check_schema()
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() not in ("wal", "memory"):
            logger.warning("profile database %s runs in journal mode %r, not WAL", self.path, mode)
        check = self._conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise ProfileDatabaseError(
                f"profile database {self.path!r} fails SQLite's integrity check ({check}). Fix: move it away and "
                "re-profile into a new file.")

    def _check_schema(self) -> None:
        tables = self._tables()
        if "hetpart_meta" not in tables:
            raise ProfileDatabaseError(
                f"{self.path!r} is an SQLite database but not a hetpart profile database: it must have a "
                f"'hetpart_meta' table; found tables {sorted(tables)}. Fix: pass another file; hetpart does not "
                "write into foreign databases.")
        meta = dict(self._conn.execute("SELECT key, value FROM hetpart_meta"))
        if meta.get("application") != APPLICATION:
            raise ProfileDatabaseError(
                f"{self.path!r}: hetpart_meta.application must be {APPLICATION!r}; found "
                f"{meta.get('application')!r}. Fix: pass a hetpart profile database.")
        try:
            version = int(meta.get("schema_version", ""))
        except ValueError:
            raise ProfileDatabaseError(
                f"{self.path!r}: schema_version must be an integer; found {meta.get('schema_version')!r}. "
                "Fix: the file is damaged; re-profile into a new file.") from None
        if version > SCHEMA_VERSION:
            raise ProfileDatabaseError(
                f"{self.path!r} has schema version {version}, newer than this hetpart supports "
                f"({SCHEMA_VERSION}). Fix: upgrade hetpart, or profile into a new file.")
        if version < SCHEMA_VERSION:
            raise ProfileDatabaseError(
                f"{self.path!r} has schema version {version}; this hetpart needs {SCHEMA_VERSION} and has no "
                "migration for it. Fix: re-profile into a new file.")
        missing = {"measurements", "claims"} - tables
        columns = {r[1] for r in self._conn.execute("PRAGMA table_info(measurements)")}
        if missing or not set(_COLUMNS) <= columns:
            raise ProfileDatabaseError(
                f"{self.path!r} says schema version {version} but its tables do not match: missing tables "
                f"{sorted(missing)}, missing columns {sorted(set(_COLUMNS) - columns)}. Fix: re-profile into a "
                "new file.")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ProfileStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def add(self, m: Measurement, replace: bool = False) -> int:
        """Store one measurement and commit it; returns its row id.

        A row for the same (key, device, target, TVM version) raises ProfileDatabaseError unless ``replace``.
        """
        m.validate()
        self.check_thread_count(m.device, m.target, m.tvm_version, m.num_threads)
        values = [getattr(m, c) for c in _COLUMNS]
        values[_COLUMNS.index("samples_us")] = json.dumps(list(m.samples_us))
        values[_COLUMNS.index("features")] = canonical_json(m.features)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        try:
            cur = self._conn.execute(
                f"{verb} INTO measurements ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                values)
        except sqlite3.IntegrityError as exc:
            raise ProfileDatabaseError(
                f"{m.kernel_name!r} (key {m.key_hash}) is already measured on {m.device} / {m.target} / TVM "
                f"{m.tvm_version} ({exc}). Fix: skip it (has()) or pass replace=True.") from exc
        return int(cur.lastrowid)

    def thread_counts(self, device: str, target: str, tvm_version: str) -> set[int]:
        """TVM thread counts the rows of this device, target and TVM version were measured with."""
        return {int(r[0]) for r in self._conn.execute(
            "SELECT DISTINCT num_threads FROM measurements WHERE device = ? AND target = ? AND tvm_version = ?",
            (device, target, tvm_version))}

    def check_thread_count(self, device: str, target: str, tvm_version: str, num_threads: int) -> None:
        """Raise unless every stored row of this device, target and TVM version was measured with ``num_threads``
        TVM threads: labels (kept as the lowest of several sessions) must not mix thread counts."""
        ident = (device, target, tvm_version, int(num_threads))
        if ident in self._thread_count_checked:
            return
        other = sorted(self.thread_counts(device, target, tvm_version) - {int(num_threads)})
        if other:
            raise ProfileDatabaseError(
                f"{self.path!r} holds {device} rows measured with {', '.join(map(str, other))} TVM thread(s); this "
                f"run measures with {num_threads}. One database must hold one thread count (its labels are "
                f"compared and replaced across sessions). Fix: set TVM_NUM_THREADS={other[0]} to extend it, or "
                "profile into a new file with --db.")
        self._thread_count_checked.add(ident)

    def mark_rejected(self, key_hash: str, device: str, target: str, tvm_version: str, reason: str) -> None:
        """Turn an ``ok`` row into ``rejected_noisy`` (e.g. its timing window turned out to be contended)."""
        self._conn.execute("UPDATE measurements SET status = 'rejected_noisy', error = ? WHERE key_hash = ? AND "
                           "device = ? AND target = ? AND tvm_version = ? AND status = 'ok'",
                           (reason, key_hash, device, target, tvm_version))

    def try_claim(self, key_hash: str, device: str, target: str, tvm_version: str, session_id: str,
                  stale_after_s: float = 3600.0, done_statuses: Sequence[str] = STATUSES) -> bool:
        """Claim a workload for this session; False if it has a row whose status is in ``done_statuses`` or
        is claimed by a live session."""
        host, pid, now = socket.gethostname(), os.getpid(), time.time()
        ident = (key_hash, device, target, tvm_version)
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            if self._status_of(ident) in done_statuses:
                self._conn.execute("COMMIT")
                return False
            row = self._conn.execute("SELECT session_id, host, pid, claimed_at_s FROM claims WHERE key_hash = ? "
                                     "AND device = ? AND target = ? AND tvm_version = ?", ident).fetchone()
            if row is not None and row[0] != session_id and not _claim_is_stale(row, host, now, stale_after_s):
                self._conn.execute("COMMIT")
                return False
            if row is not None and row[0] != session_id:
                logger.info("taking over stale claim of %s by session %s (pid %s on %s)", key_hash, *row[:3])
            self._conn.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (*ident, session_id, host, pid, now))
            self._conn.execute("COMMIT")
            return True
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def release_claim(self, key_hash: str, device: str, target: str, tvm_version: str, session_id: str) -> None:
        self._conn.execute("DELETE FROM claims WHERE key_hash = ? AND device = ? AND target = ? AND "
                           "tvm_version = ? AND session_id = ?", (key_hash, device, target, tvm_version, session_id))

    # ------------------------------------------------------------------ reading
    def _status_of(self, ident: tuple[str, str, str, str]) -> str | None:
        row = self._conn.execute("SELECT status FROM measurements WHERE key_hash = ? AND device = ? AND "
                                 "target = ? AND tvm_version = ?", ident).fetchone()
        return None if row is None else row[0]

    def has(self, key_hash: str, device: str, target: str, tvm_version: str,
            statuses: Sequence[str] = STATUSES) -> bool:
        """True if this workload has a row for this device, target and TVM version, with one of ``statuses``."""
        return self._status_of((key_hash, device, target, tvm_version)) in statuses

    def measurements(self, device: str | None = None, status: str | None = "ok",
                     target: str | None = None, tvm_version: str | None = None) -> list[Measurement]:
        """Rows in insertion order, filtered by device / status / target / TVM version (None: any)."""
        where, args = [], []
        for column, value in (("device", device), ("status", status), ("target", target),
                              ("tvm_version", tvm_version)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"SELECT id, {', '.join(_COLUMNS)} FROM measurements"
        if where:
            sql += " WHERE " + " AND ".join(where)
        out = []
        for row in self._conn.execute(sql + " ORDER BY id", args):
            data = dict(zip(("row_id",) + _COLUMNS, row))
            data["samples_us"] = tuple(json.loads(data["samples_us"]))
            data["features"] = json.loads(data["features"])
            out.append(Measurement(**data))
        return out

    def canary_by_session(self, device: str | None = None, canary_kernel: str | None = None) -> dict[str, float]:
        """Median canary latency (µs) of each session's rows: the drift reference per session."""
        per_session: dict[str, list[float]] = {}
        for m in self.measurements(device=device, status=None):
            if m.canary_us is not None and (canary_kernel is None or m.canary_kernel == canary_kernel):
                per_session.setdefault(m.session_id, []).append(m.canary_us)
        return {s: _median(v) for s, v in per_session.items()}

    def canary_history(self, device: str, target: str, tvm_version: str, canary_kernel: str) -> list[float]:
        """Canary latencies (µs) stored with the ``ok`` rows of this device, target, TVM version and canary."""
        return [float(r[0]) for r in self._conn.execute(
            "SELECT canary_us FROM measurements WHERE device = ? AND target = ? AND tvm_version = ? AND "
            "canary_kernel = ? AND status = 'ok' AND canary_us IS NOT NULL ORDER BY id",
            (device, target, tvm_version, canary_kernel))]

    def counts(self, device: str | None = None) -> dict[str, int]:
        """Number of rows per status (every status present, zero if none)."""
        sql, args = "SELECT status, COUNT(*) FROM measurements", []
        if device is not None:
            sql, args = sql + " WHERE device = ?", [device]
        found = dict(self._conn.execute(sql + " GROUP BY status", args))
        return {s: int(found.get(s, 0)) for s in STATUSES}


def _claim_is_stale(row: Sequence[Any], host: str, now: float, stale_after_s: float) -> bool:
    _, claim_host, claim_pid, claimed_at = row
    if now - claimed_at > stale_after_s:
        return True
    if claim_host == host:
        if claim_pid == os.getpid():
            return True              # an earlier session of this very process (it did not release)
        try:
            os.kill(int(claim_pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
