"""Whole-model records next to the kernel measurements, in the same SQLite profile database file.

:class:`predictors.profiling.store.ProfileStore` holds one row per *kernel* workload. Evaluating a predictor on whole
models (leave-one-model-out) and fitting its per-kernel overhead also need, per zoo model variant:

* its kernel-level OpGraph (the nodes a CostTable is built on) and, for each node, the key hash of the measured
  kernel behind it (``node_keys``; empty when the kernel <-> node alignment failed for that model);
* its measured whole-model latency (median, spread) and the canary of that timing window.

Also stored: *retests* -- kernels measured a second time in a later window, for the test-retest noise floor.

the synthetic specs whose kernels are all stored, with their key hashes (``hetpart_synthetic_done``, so a rerun
does not rebuild them and training can tell the current specs' kernels from orphans of older samplings),
and one row per profiling run (budget, wall time, summary) in ``hetpart_profile_runs``.

These live in extra tables (``hetpart_model_variants``, ``hetpart_retests``, ``hetpart_synthetic_done``,
``hetpart_profile_runs``), created on
first use; the
profile store accepts extra tables, so one ``--db`` file carries everything ``hetpart fit`` / ``evaluate`` need.
Every write is committed at once (WAL mode is set by the store), so a killed run keeps what it finished.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import ProfileDatabaseError
from hetpart.graph import OpGraph
from predictors.profiling.store import ProfileStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS hetpart_model_variants (
    name TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL, tvm_version TEXT NOT NULL,
    family TEXT NOT NULL, tier INTEGER NOT NULL, aligned INTEGER NOT NULL, graph TEXT NOT NULL,
    node_keys TEXT NOT NULL, model_median_us REAL, model_spread REAL, canary_us REAL,
    session_id TEXT NOT NULL, timestamp_s REAL NOT NULL, pipeline_version TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (name, device, target, tvm_version));
CREATE TABLE IF NOT EXISTS hetpart_retests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key_hash TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL,
    tvm_version TEXT NOT NULL, median_us REAL NOT NULL, spread REAL NOT NULL, canary_us REAL NOT NULL,
    session_id TEXT NOT NULL, timestamp_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS hetpart_synthetic_done (
    spec TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL, tvm_version TEXT NOT NULL,
    keys TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (spec, device, target, tvm_version));
CREATE TABLE IF NOT EXISTS hetpart_profile_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, device TEXT NOT NULL, budget_s REAL NOT NULL,
    elapsed_s REAL NOT NULL, summary TEXT NOT NULL, timestamp_s REAL NOT NULL);
"""


@dataclass(frozen=True)
class ModelVariantRecord:
    name: str
    device: str
    target: str
    tvm_version: str
    family: str
    tier: int
    aligned: bool
    graph: OpGraph                   # kernel level
    node_keys: tuple[str, ...]       # key hash of the measured kernel behind each node ("" when unaligned)
    model_median_us: float | None
    model_spread: float | None
    canary_us: float | None
    pipeline_version: str = ""       # extractor + CPU rules that made ``graph`` and its kernels (zoo_profile)


@dataclass(frozen=True)
class Retest:
    key_hash: str
    median_us: float
    spread: float
    canary_us: float
    session_id: str


class ModelDatabase:
    """The model-variant and retest tables of a profile database (validated through :class:`ProfileStore`)."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0) -> None:
        ProfileStore(path, busy_timeout_s).close()        # refuses corrupt / foreign files, sets WAL
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        try:
            self._conn.executescript(_SCHEMA)
            columns = {r[1] for r in self._conn.execute("PRAGMA table_info(hetpart_model_variants)")}
            if "pipeline_version" not in columns:      # a database written before the column existed
                self._conn.execute("ALTER TABLE hetpart_model_variants ADD COLUMN pipeline_version TEXT "
                                   "NOT NULL DEFAULT ''")
            if "keys" not in {r[1] for r in self._conn.execute("PRAGMA table_info(hetpart_synthetic_done)")}:
                self._conn.execute("ALTER TABLE hetpart_synthetic_done ADD COLUMN keys TEXT NOT NULL DEFAULT '[]'")
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise ProfileDatabaseError(f"cannot create the model tables in {self.path!r}: {exc}. Fix: profile "
                                       "into a new file.") from exc

    def close(self) -> None:
        self._conn.close()

    def meta(self, key: str) -> str | None:
        """A fact recorded about the database's host (``hetpart_meta``; e.g. its effective cache size)."""
        row = self._conn.execute("SELECT value FROM hetpart_meta WHERE key = ?", (f"host.{key}",)).fetchone()
        return None if row is None else str(row[0])

    def put_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO hetpart_meta VALUES (?, ?)", (f"host.{key}", value))

    def __enter__(self) -> "ModelDatabase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_variant(self, name: str, device: str, target: str, tvm_version: str, family: str, tier: int,
                    aligned: bool, graph: OpGraph, node_keys: tuple[str, ...], session_id: str,
                    pipeline_version: str = "") -> None:
        """Insert or refresh a variant's graph and node keys. A latency already measured is kept while the variant
        runs the same kernels (node keys equal as a multiset); when they change (the compiler now makes different
        kernels) it is dropped, since it timed the old kernels. ``pipeline_version`` records what made the graph and
        keys (``predictors.versions.PIPELINE_VERSION``)."""
        if graph.level != "kernel":
            raise ProfileDatabaseError(f"model variant {name}: store its kernel-level graph, not {graph.level!r}")
        if aligned and len(node_keys) != graph.num_ops:
            raise ProfileDatabaseError(f"model variant {name}: {len(node_keys)} node keys for {graph.num_ops} "
                                       "kernels; they must pair up")
        self._conn.execute("BEGIN IMMEDIATE")        # read and write as one step against a concurrent profiler
        try:
            self._put_variant(name, device, target, tvm_version, family, tier, aligned, graph, node_keys, session_id,
                              pipeline_version)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _put_variant(self, name: str, device: str, target: str, tvm_version: str, family: str, tier: int,
                     aligned: bool, graph: OpGraph, node_keys: tuple[str, ...], session_id: str,
                     pipeline_version: str) -> None:
        previous = self._conn.execute(
            "SELECT node_keys FROM hetpart_model_variants WHERE name = ? AND device = ? AND target = ? AND "
            "tvm_version = ?", (name, device, target, tvm_version)).fetchone()
        # the same kernels paired with nodes in another order still time the same model
        same_kernels = previous is not None and sorted(json.loads(previous[0])) == sorted(node_keys)
        self._conn.execute(
            "INSERT INTO hetpart_model_variants (name, device, target, tvm_version, family, tier, aligned, graph, "
            "node_keys, session_id, timestamp_s, pipeline_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (name, device, target, tvm_version) DO UPDATE SET family = excluded.family, "
            "tier = excluded.tier, aligned = excluded.aligned, graph = excluded.graph, "
            "pipeline_version = excluded.pipeline_version, node_keys = excluded.node_keys, "
            "model_median_us = CASE WHEN ? THEN model_median_us END, "
            "model_spread = CASE WHEN ? THEN model_spread END, "
            "canary_us = CASE WHEN ? THEN canary_us END",
            (name, device, target, tvm_version, family, int(tier), int(aligned), json.dumps(graph.to_dict()),
             json.dumps(list(node_keys)), session_id, time.time(), str(pipeline_version),
             int(same_kernels), int(same_kernels), int(same_kernels)))

    def set_model_latency(self, name: str, device: str, target: str, tvm_version: str, median_us: float,
                          spread: float, canary_us: float, session_id: str) -> None:
        cur = self._conn.execute(
            "UPDATE hetpart_model_variants SET model_median_us = ?, model_spread = ?, canary_us = ?, "
            "session_id = ?, timestamp_s = ? WHERE name = ? AND device = ? AND target = ? AND tvm_version = ?",
            (float(median_us), float(spread), float(canary_us), session_id, time.time(), name, device, target,
             tvm_version))
        if cur.rowcount != 1:
            raise ProfileDatabaseError(f"model variant {name} is not in {self.path!r}; put_variant() it first")

    def variants(self, device: str | None = None, target: str | None = None,
                 tvm_version: str | None = None) -> list[ModelVariantRecord]:
        where, args = _where(device=device, target=target, tvm_version=tvm_version)
        rows = self._conn.execute(
            "SELECT name, device, target, tvm_version, family, tier, aligned, graph, node_keys, model_median_us, "
            f"model_spread, canary_us, pipeline_version FROM hetpart_model_variants{where} ORDER BY tier, name",
            args).fetchall()
        out = []
        for r in rows:
            out.append(ModelVariantRecord(
                name=r[0], device=r[1], target=r[2], tvm_version=r[3], family=r[4], tier=int(r[5]),
                aligned=bool(r[6]), graph=OpGraph.from_dict(json.loads(r[7])), node_keys=tuple(json.loads(r[8])),
                model_median_us=r[9], model_spread=r[10], canary_us=r[11], pipeline_version=r[12]))
        return out

    def add_retest(self, key_hash: str, device: str, target: str, tvm_version: str, median_us: float,
                   spread: float, canary_us: float, session_id: str) -> None:
        self._conn.execute(
            "INSERT INTO hetpart_retests (key_hash, device, target, tvm_version, median_us, spread, canary_us, "
            "session_id, timestamp_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key_hash, device, target, tvm_version, float(median_us), float(spread), float(canary_us), session_id,
             time.time()))

    def retests(self, device: str | None = None, target: str | None = None,
                tvm_version: str | None = None) -> list[Retest]:
        where, args = _where(device=device, target=target, tvm_version=tvm_version)
        rows = self._conn.execute(f"SELECT key_hash, median_us, spread, canary_us, session_id FROM hetpart_retests"
                                  f"{where} ORDER BY id", args).fetchall()
        return [Retest(r[0], float(r[1]), float(r[2]), float(r[3]), r[4]) for r in rows]

    def mark_synthetic_done(self, keys_of_spec: Mapping[str, Sequence[str]], device: str, target: str,
                            tvm_version: str) -> None:
        """Record specs whose kernels are all stored, with the key hashes of those kernels."""
        self._conn.executemany("INSERT OR REPLACE INTO hetpart_synthetic_done VALUES (?, ?, ?, ?, ?)",
                               [(spec, device, target, tvm_version, json.dumps(sorted(keys)))
                                for spec, keys in keys_of_spec.items()])

    def synthetic_done(self, device: str, target: str, tvm_version: str) -> dict[str, set[str]]:
        """Spec marker -> key hashes of its kernels, oldest marker first. Markers written before keys were recorded
        are left out, so those specs are built once more (their kernels, already stored, are not measured again)."""
        rows = self._conn.execute("SELECT spec, keys FROM hetpart_synthetic_done WHERE device = ? AND target = ? "
                                  "AND tvm_version = ? ORDER BY rowid", (device, target, tvm_version))
        return {spec: set(json.loads(keys)) for spec, keys in rows if keys != "[]"}

    def record_run(self, session_id: str, device: str, budget_s: float, elapsed_s: float,
                   summary: dict[str, Any]) -> None:
        """Log one profiling run (what ``hetpart evaluate`` reports as the time spent profiling)."""
        self._conn.execute("INSERT INTO hetpart_profile_runs (session_id, device, budget_s, elapsed_s, summary, "
                           "timestamp_s) VALUES (?, ?, ?, ?, ?, ?)",
                           (session_id, device, float(budget_s), float(elapsed_s), json.dumps(summary), time.time()))

    def profile_runs(self, device: str | None = None) -> list[dict[str, Any]]:
        where, args = _where(device=device)
        rows = self._conn.execute(f"SELECT session_id, device, budget_s, elapsed_s, summary, timestamp_s FROM "
                                  f"hetpart_profile_runs{where} ORDER BY id", args).fetchall()
        return [{"session_id": r[0], "device": r[1], "budget_s": r[2], "elapsed_s": r[3], "summary": json.loads(r[4]),
                 "timestamp_s": r[5]} for r in rows]


def _where(**filters: Any) -> tuple[str, list[Any]]:
    parts, args = [], []
    for column, value in filters.items():
        if value is not None:
            parts.append(f"{column} = ?")
            args.append(value)
    return (" WHERE " + " AND ".join(parts) if parts else ""), args
