"""Profile database: schema checks, corrupt/foreign files, resume after SIGKILL, two concurrent profilers."""
from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from hetpart.errors import ProfileDatabaseError
from predictors.profiling.profiling_run import profile_workloads
from predictors.profiling.store import Measurement, ProfileStore, canonical_json, key_hash_of, normalise_latency

DEVICE, TARGET, VERSION = "cpu", '{"kind":"llvm"}', "0.27.0-test"


@dataclass(frozen=True)
class Workload:
    name: str
    workload_key: str
    key_hash: str


def make_workloads(n: int) -> list[Workload]:
    out = []
    for i in range(n):
        key = canonical_json({"kind": "add", "inputs": [[[1, i + 1], "float32"]]})
        out.append(Workload(f"add_{i}", key, key_hash_of(key)))
    return out


class RecordingProfiler:
    """Test double for KernelProfiler: returns a row whose latency is derived from the workload, after a delay.

    It stands in for TVM so that the database logic (resume, claims, concurrency) is tested quickly and
    deterministically; the real profiler is exercised in test_profiler.py.
    """

    def __init__(self, session_id: str, delay_s: float = 0.0, canary_us: float = 100.0,
                 noisy_first: tuple[str, ...] = ()) -> None:
        self.device, self.target, self.tvm_version = DEVICE, TARGET, VERSION
        self.session_id, self.delay_s, self.canary = session_id, delay_s, canary_us
        self.noisy_first = set(noisy_first)      # key hashes whose first measurement is rejected as noisy
        self.measured: list[str] = []

    def measure(self, w: Workload) -> Measurement:
        time.sleep(self.delay_s)
        first = w.key_hash not in self.measured
        self.measured.append(w.key_hash)
        latency = 10.0 + len(w.name)
        if first and w.key_hash in self.noisy_first:
            return replace(self.measure_ok(w, latency), status="rejected_noisy", spread=0.25)
        return self.measure_ok(w, latency)

    def measure_ok(self, w: Workload, latency: float) -> Measurement:
        return Measurement(key_hash=w.key_hash, workload_key=w.workload_key, kernel_name=w.name, device=DEVICE,
                           target=TARGET, tvm_version=VERSION, num_threads=2, canary_kernel="matmul_256_float32",
                           canary_us=self.canary, median_us=latency, mad_us=0.1, spread=0.1 / latency,
                           n_repeats=3, number=1, samples_us=(latency - 0.1, latency, latency + 0.1),
                           features={"op": "add", "flops": 4}, status="ok", session_id=self.session_id,
                           timestamp_s=time.time())


def row(name: str = "k", status: str = "ok", **kw) -> Measurement:
    key = canonical_json({"kind": name})
    data = dict(key_hash=key_hash_of(key), workload_key=key, kernel_name=name, device=DEVICE, target=TARGET,
                tvm_version=VERSION, num_threads=2, canary_kernel="matmul_256_float32", canary_us=100.0,
                median_us=50.0, mad_us=1.0, spread=0.02, n_repeats=3, number=4, samples_us=(49.0, 50.0, 51.0),
                features={"op": "relax.nn.conv2d", "input_shapes": [[1, 3, 8, 8]]}, status=status,
                session_id="s1", timestamp_s=1.0)
    data.update(kw)
    return Measurement(**data)


def test_round_trip_queries_and_wal(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileStore(path) as store:
        store.add(row("a"))
        store.add(row("b", status="rejected_noisy", spread=0.2))
        store.add(row("c", status="failed", median_us=None, error="BuildError: boom", samples_us=()))
        assert store.has(row("a").key_hash, DEVICE, TARGET, VERSION)
        assert not store.has(row("a").key_hash, "gpu", TARGET, VERSION)
        assert not store.has(row("a").key_hash, DEVICE, TARGET, "0.26")
        ok = store.measurements(DEVICE)
        assert [m.kernel_name for m in ok] == ["a"]
        got = ok[0]
        assert got.samples_us == (49.0, 50.0, 51.0) and got.features["input_shapes"] == [[1, 3, 8, 8]]
        assert got.row_id is not None and got.median_us == 50.0 and got.num_threads == 2
        assert [m.status for m in store.measurements(DEVICE, status=None)] == ["ok", "rejected_noisy", "failed"]
        assert store.measurements(DEVICE, status="failed")[0].error == "BuildError: boom"
        assert store.counts() == {"ok": 1, "rejected_noisy": 1, "failed": 1}
        assert store.counts("gpu") == {"ok": 0, "rejected_noisy": 0, "failed": 0}
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_duplicate_rows_are_refused_unless_replaced(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.add(row("a"))
        with pytest.raises(ProfileDatabaseError, match="already measured"):
            store.add(row("a", median_us=70.0))
        store.add(row("a", median_us=70.0), replace=True)
        assert [m.median_us for m in store.measurements()] == [70.0]


def test_one_database_holds_one_thread_count(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.add(row("a"))
        store.add(row("b"))
        with pytest.raises(ProfileDatabaseError, match="measured with 2 TVM thread.*this run measures with 1"):
            store.add(row("c", num_threads=1))
        with pytest.raises(ProfileDatabaseError, match="TVM_NUM_THREADS=2"):
            store.add(row("a", num_threads=1, median_us=20.0), replace=True)   # a refine pass must not mix either
        store.add(row("c", device="cuda", num_threads=1))     # another device keeps its own count
        assert store.thread_counts(DEVICE, TARGET, VERSION) == {2}
        assert sorted(m.kernel_name for m in store.measurements(status=None)) == ["a", "b", "c"]


def test_invalid_measurements_are_refused(tmp_path):
    with ProfileStore(tmp_path / "p.sqlite") as store:
        with pytest.raises(ProfileDatabaseError, match="status"):
            store.add(row("a", status="maybe"))
        with pytest.raises(ProfileDatabaseError, match="error text"):
            store.add(row("a", status="failed", error=""))
        with pytest.raises(ProfileDatabaseError, match="median_us"):
            store.add(row("a", median_us=0.0))
        assert store.counts() == {"ok": 0, "rejected_noisy": 0, "failed": 0}


def test_garbage_file_gives_clear_error(tmp_path):
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(ProfileDatabaseError, match="not a readable SQLite database.*new file"):
        ProfileStore(path)


def test_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ProfileDatabaseError, match=r"not a hetpart profile database.*\['customers'\]"):
        ProfileStore(path)
    assert path.read_bytes() == before
    tables = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert tables == {"customers"}


@pytest.mark.parametrize("version, message", [("99", "newer than this hetpart"), ("0", "no migration"),
                                              ("one", "must be an integer")])
def test_schema_version_mismatch(tmp_path, version, message):
    path = tmp_path / "p.sqlite"
    ProfileStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE hetpart_meta SET value = ? WHERE key = 'schema_version'", (version,))
    conn.commit()
    conn.close()
    with pytest.raises(ProfileDatabaseError, match=message):
        ProfileStore(path)


def test_missing_table_is_detected(tmp_path):
    path = tmp_path / "p.sqlite"
    ProfileStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE claims")
    conn.commit()
    conn.close()
    with pytest.raises(ProfileDatabaseError, match="tables do not match.*claims"):
        ProfileStore(path)


def test_normalise_latency_arithmetic(tmp_path):
    # a kernel timed at 60 us while the canary took 104 us equals 57.7 us in a window where the canary took 100 us
    assert normalise_latency(60.0, 104.0, 100.0) == pytest.approx(60.0 * 100 / 104)
    assert normalise_latency(60.0, 96.0, 100.0) == pytest.approx(60.0 * 100 / 96)
    assert normalise_latency(60.0, 100.0, 100.0) == pytest.approx(60.0)
    # a canary 10% or 45% slow was contended, not a slower machine: that window is not rescaled
    assert normalise_latency(60.0, 110.0, 100.0) == pytest.approx(60.0)
    assert normalise_latency(60.0, 145.0, 100.0) == pytest.approx(60.0)
    with pytest.raises(ValueError, match="canary_us"):
        normalise_latency(60.0, 0.0, 100.0)
    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.add(row("a", session_id="s1", canary_us=102.0, median_us=40.0))
        store.add(row("b", session_id="s1", canary_us=108.0, median_us=40.0))
        store.add(row("c", session_id="s2", canary_us=150.0, median_us=60.0))
        canaries = store.canary_by_session(DEVICE)
        assert canaries == {"s1": pytest.approx(105.0), "s2": pytest.approx(150.0)}
        c = store.measurements(DEVICE)[2]
        assert c.normalised_us(canaries["s1"]) == pytest.approx(60.0)      # 150 vs 105: contended canary
        assert store.measurements(DEVICE)[1].normalised_us(canaries["s1"]) == pytest.approx(40.0 * 105.0 / 108.0)
        assert store.measurements(DEVICE)[0].normalised_us(canaries["s1"]) == pytest.approx(40.0 * 105.0 / 102.0)
        assert store.canary_by_session(DEVICE, canary_kernel="conv_other") == {}


def test_profile_workloads_skips_measured_and_respects_budget(tmp_path):
    workloads = make_workloads(6)
    with ProfileStore(tmp_path / "p.sqlite") as store:
        none = profile_workloads(store, workloads, RecordingProfiler("s0"), budget_s=-1.0)
        assert none.measured == 0 and none.not_started == 6
        first = RecordingProfiler("s1")
        seen = []
        summary = profile_workloads(store, workloads[:4], first, budget_s=60,
                                    progress=lambda done, total, name, status: seen.append((done, total, status)))
        assert summary.measured == 4 and summary.statuses["ok"] == 4
        assert seen == [(i, 4, "ok") for i in range(1, 5)]
        second = RecordingProfiler("s2")
        summary = profile_workloads(store, workloads, second, budget_s=60)
        assert summary.skipped == 4 and summary.measured == 2
        assert second.measured == [w.key_hash for w in workloads[4:]]
        assert sorted(m.key_hash for m in store.measurements()) == sorted(w.key_hash for w in workloads)


def test_retry_replaces_rejected_rows_only_when_asked(tmp_path):
    workloads = make_workloads(3)
    with ProfileStore(tmp_path / "p.sqlite") as store:
        noisy = workloads[1]
        store.add(row("x", key_hash=noisy.key_hash, workload_key=noisy.workload_key, kernel_name=noisy.name,
                      status="rejected_noisy", spread=0.3))
        plain = RecordingProfiler("s1")
        assert profile_workloads(store, workloads, plain, budget_s=60).skipped == 1
        assert noisy.key_hash not in plain.measured
        again = RecordingProfiler("s2")
        summary = profile_workloads(store, workloads, again, budget_s=60, retry=("rejected_noisy",))
        assert again.measured == [noisy.key_hash] and summary.measured == 1
        assert store.counts() == {"ok": 3, "rejected_noisy": 0, "failed": 0}
        with pytest.raises(ValueError, match="retry"):
            profile_workloads(store, workloads, again, budget_s=60, retry=("ok",))


def test_profilers_are_seeded_with_the_canaries_of_stored_ok_rows(tmp_path):
    class SeededProfiler(RecordingProfiler):
        canary_kind = "matmul_256_float32"
        seeded: list[float] = []

        def seed_canary_history(self, values):
            self.seeded = list(values)

    with ProfileStore(tmp_path / "p.sqlite") as store:
        store.add(row("a", canary_us=100.0))
        store.add(row("b", canary_us=120.0))
        store.add(row("c", canary_us=500.0, status="rejected_noisy"))
        store.add(row("d", canary_us=90.0, canary_kernel="conv_other"))
        store.add(row("e", canary_us=80.0, tvm_version="0.26"))
        profiler = SeededProfiler("s2")
        profile_workloads(store, make_workloads(1), profiler, budget_s=60)
    assert profiler.seeded == [100.0, 120.0]


@pytest.mark.parametrize("noisy_passes, final_status", [(1, "ok"), (0, "rejected_noisy")])
def test_noisy_rejections_are_measured_again_at_the_end(tmp_path, noisy_passes, final_status):
    workloads = make_workloads(3)
    profiler = RecordingProfiler("s1", noisy_first=(workloads[0].key_hash,))
    with ProfileStore(tmp_path / "p.sqlite") as store:
        summary = profile_workloads(store, workloads, profiler, budget_s=60, noisy_passes=noisy_passes)
        rows = {m.key_hash: m for m in store.measurements(status=None)}
    expected_order = [w.key_hash for w in workloads] + [workloads[0].key_hash] * noisy_passes
    assert profiler.measured == expected_order
    assert len(rows) == 3 and rows[workloads[0].key_hash].status == final_status
    assert summary.measured == 3 and summary.statuses[final_status] >= 1
    assert sum(summary.statuses.values()) == 3


def test_rows_judged_contended_at_the_end_are_measured_again(tmp_path):
    class LateJudge(RecordingProfiler):
        def contention_of(self, m):      # the first row's window turns out contended once the session is over
            return "contended" if m.kernel_name == "add_0" and self.measured.count(m.key_hash) == 1 else ""

    workloads = make_workloads(3)
    profiler = LateJudge("s1")
    with ProfileStore(tmp_path / "p.sqlite") as store:
        summary = profile_workloads(store, workloads, profiler, budget_s=60)
        rows = store.measurements(status=None)
    assert profiler.measured == [w.key_hash for w in workloads] + [workloads[0].key_hash]
    assert [m.status for m in rows] == ["ok"] * 3 and summary.statuses == {"ok": 3, "rejected_noisy": 0,
                                                                            "failed": 0}


def test_a_run_whose_every_window_is_contended_stops_with_a_warning(tmp_path, caplog):
    class SlowMachine(RecordingProfiler):
        canary_reference_us = 72.0

        def measure(self, w):         # the machine runs 17% slower than the database's reference, all session
            self.measured.append(w.key_hash)
            return replace(self.measure_ok(w, 20.0), canary_us=84.0, status="rejected_noisy",
                           error="contended: canary 84.0/84.0 us around the kernel vs reference 72.0 us")

    workloads = make_workloads(30)
    profiler = SlowMachine("s1")
    with ProfileStore(tmp_path / "p.sqlite") as store, caplog.at_level("WARNING"):
        summary = profile_workloads(store, workloads, profiler, budget_s=600, stop_after_contended=5)
    assert summary.stopped_contended and summary.measured == 5 and summary.not_started == 25
    assert len(profiler.measured) == 5                       # no retry pass on a machine that stays contended
    assert "84.0 us vs the database's reference 72.0 us (+17%)" in caplog.text and "--db NEW" in caplog.text
    quiet = RecordingProfiler("s2")                          # a quiet machine later: the run goes on as usual
    with ProfileStore(tmp_path / "p.sqlite") as store:
        later = profile_workloads(store, workloads, quiet, budget_s=600, stop_after_contended=5,
                                  retry=("rejected_noisy",))
    assert not later.stopped_contended and later.statuses["ok"] == 30


class SlowSpell(RecordingProfiler):
    """A machine slower than the reference for the first ``slow_kernels`` kernels, quiet afterwards unless
    ``ends`` is False; its canary, polled while the run waits, follows ``canary_polls`` (µs)."""

    canary_reference_us = 72.0
    canary_limit_us = 72.0 * 1.08

    def __init__(self, session, slow_kernels: int, canary_polls: list[float]):
        super().__init__(session)
        self.slow_kernels, self.canary_polls, self.polled = slow_kernels, list(canary_polls), []

    def canary_now_us(self):
        value = self.canary_polls.pop(0) if self.canary_polls else 84.0
        self.polled.append(value)
        return value

    def measure(self, w):
        self.measured.append(w.key_hash)
        if len(self.measured) <= self.slow_kernels:
            return replace(self.measure_ok(w, 20.0), canary_us=84.0, status="rejected_noisy",
                           error="contended: canary 84.0/84.0 us around the kernel vs reference 72.0 us")
        return self.measure_ok(w, 20.0)


def test_a_run_told_to_wait_rides_out_a_slow_spell_and_retries_what_it_rejected(tmp_path, monkeypatch):
    from predictors.profiling import profiling_run

    slept = []
    monkeypatch.setattr(profiling_run, "_sleep", slept.append)
    workloads = make_workloads(12)
    profiler = SlowSpell("s1", slow_kernels=5, canary_polls=[90.0, 85.0, 75.0])
    with ProfileStore(tmp_path / "p.sqlite") as store:
        summary = profile_workloads(store, workloads, profiler, budget_s=600, stop_after_contended=5,
                                    wait_when_slow_s=300, poll_s=30)
        rows = store.measurements(status=None)
    assert profiler.polled == [90.0, 85.0, 75.0] and slept == [30, 30]    # 75 us is within 8% of 72 us
    assert not summary.stopped_contended and summary.not_started == 0
    assert [m.status for m in rows] == ["ok"] * 12                         # the five rejections were retried
    assert len(profiler.measured) == 12 + 5


def test_a_run_told_to_wait_still_stops_when_the_spell_outlasts_the_wait(tmp_path, monkeypatch, caplog):
    from predictors.profiling import profiling_run

    clock = [1000.0]
    monkeypatch.setattr(profiling_run.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(profiling_run, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    workloads = make_workloads(12)
    profiler = SlowSpell("s1", slow_kernels=12, canary_polls=[])             # the canary stays at 84 us
    with ProfileStore(tmp_path / "p.sqlite") as store, caplog.at_level("WARNING"):
        summary = profile_workloads(store, workloads, profiler, budget_s=6000, stop_after_contended=5,
                                    wait_when_slow_s=100, poll_s=30)
    assert summary.stopped_contended and summary.measured == 5 and summary.not_started == 7
    assert summary.waited_s == pytest.approx(100) and len(profiler.polled) == 5    # at 0, 30, 60, 90 and 100 s
    assert "--db NEW" in caplog.text



def test_a_run_that_would_wait_but_has_spent_its_budget_ends_on_the_budget(tmp_path, monkeypatch):
    from predictors.profiling import profiling_run

    clock = [1000.0]
    monkeypatch.setattr(profiling_run.time, "monotonic", lambda: clock[0])

    class SlowAndLong(SlowSpell):
        def measure(self, w):             # every kernel takes 10 s of the 45 s budget
            clock[0] += 10.0
            return super().measure(w)

    workloads = make_workloads(12)
    profiler = SlowAndLong("s1", slow_kernels=12, canary_polls=[])
    with ProfileStore(tmp_path / "p.sqlite") as store:
        summary = profile_workloads(store, workloads, profiler, budget_s=45, stop_after_contended=5,
                                    wait_when_slow_s=600, poll_s=30, noisy_passes=0)
    assert not summary.stopped_contended and profiler.polled == []       # neither waited nor called contended
    assert summary.measured == 5 and summary.not_started == 7

CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {test_dir!r})
    from test_store import RecordingProfiler, make_workloads
    from predictors.profiling.profiling_run import profile_workloads
    from predictors.profiling.store import ProfileStore
    store = ProfileStore({db!r})
    profile_workloads(store, make_workloads({n}), RecordingProfiler("killed", delay_s=0.1), budget_s=600)
""")


def test_resume_after_sigkill_loses_nothing_and_measures_nothing_twice(tmp_path):
    n, db = 24, str(tmp_path / "p.sqlite")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(test_dir=str(Path(__file__).resolve().parent), db=db, n=n))
    child = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if Path(db).exists():
                try:
                    done = sqlite3.connect(db).execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                except sqlite3.OperationalError:
                    done = 0
                if done >= n // 2:
                    time.sleep(0.05)     # kill while the next workload is being measured (claimed, not stored)
                    break
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with ProfileStore(db) as store:
        before = {m.key_hash: m for m in store.measurements()}
        claims = [r[0] for r in sqlite3.connect(db).execute("SELECT key_hash FROM claims")]
        assert n // 2 <= len(before) < n, "the child must be killed half-way"
        assert len(claims) == 1 and claims[0] not in before, "the workload in flight stays claimed by the dead child"
        rerun = RecordingProfiler("resumed")
        summary = profile_workloads(store, make_workloads(n), rerun, budget_s=600, stale_after_s=3600)
        after = store.measurements()
    assert summary.skipped == len(before) and summary.claimed_elsewhere == 0
    assert sorted(rerun.measured) == sorted(set(w.key_hash for w in make_workloads(n)) - set(before))
    assert len(after) == n and len({m.key_hash for m in after}) == n
    for m in after:
        if m.key_hash in before:
            assert m == before[m.key_hash] and m.session_id == "killed"
        else:
            assert m.session_id == "resumed"


def _concurrent_worker(db: str, n: int, session: str, barrier, results) -> None:
    try:
        store = ProfileStore(db)
        profiler = RecordingProfiler(session, delay_s=0.02)
        barrier.wait()
        summary = profile_workloads(store, make_workloads(n), profiler, budget_s=600)
        store.close()
        results.put((session, summary.measured, profiler.measured))
    except Exception as exc:  # report to the parent instead of letting it wait for a result
        results.put((session, -1, repr(exc)))


def test_two_concurrent_profilers_split_the_work_without_corruption(tmp_path):
    n, db = 40, str(tmp_path / "p.sqlite")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_worker, args=(db, n, s, barrier, results)) for s in ("p1", "p2")]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(count >= 0 for _, count, _ in got), got
    measured = {session: keys for session, _, keys in got}
    assert set(measured["p1"]).isdisjoint(measured["p2"]), "a workload was measured by both profilers"
    assert len(measured["p1"]) + len(measured["p2"]) == n
    assert measured["p1"] and measured["p2"], "both profilers should have taken part"
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT COUNT(DISTINCT key_hash), COUNT(*) FROM measurements").fetchone() == (n, n)
    assert conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0


def test_re_measuring_stored_noisy_kernels_waits_out_a_slow_spell_too(tmp_path, monkeypatch):
    from predictors.profiling import profiling_run
    from predictors.profiling.zoo_profile import remeasure_noisy

    slept = []
    monkeypatch.setattr(profiling_run, "_sleep", slept.append)
    workloads = make_workloads(16)
    with ProfileStore(tmp_path / "p.sqlite") as store:
        for w in workloads:                      # an earlier run left every kernel rejected as noisy
            store.add(replace(RecordingProfiler("s0").measure_ok(w, 20.0), status="rejected_noisy",
                              error="spread too high"))
        profiler = SlowSpell("s1", slow_kernels=12, canary_polls=[85.0, 75.0])   # 12 in a row: it would stop
        run = remeasure_noisy(store, workloads, profiler, lambda: 600.0, wait_when_slow_s=300)
        rows = store.measurements(status=None)
    assert slept == [30] and profiler.polled == [85.0, 75.0] and not run.stopped_contended
    assert run.measured == 16 and [m.status for m in rows].count("ok") == 4   # the slow twelve stay rejected

