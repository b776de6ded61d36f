"""The effective-cache probe: where read bandwidth falls off, stored once per profile database."""
import json

import numpy as np
import pytest

from predictors.profiling import cache_probe
from predictors.profiling.cache_probe import (cache_bound_bytes, cache_sizes_for_db, effective_cache_bytes_for_db,
                                              effective_cache_from_curve, measure_effective_cache_bytes,
                                              read_bandwidth)
from predictors.profiling.model_db import ModelDatabase

MIB = 2 ** 20


def test_the_effective_cache_is_the_last_size_before_bandwidth_falls_off():
    # the Intel guest's measured curve (GB/s): cached up to 48 MiB although sysfs reports 480 MiB
    intel = {4: 32.4, 8: 28.5, 16: 28.7, 24: 29.2, 32: 28.9, 48: 28.9, 64: 23.6, 96: 15.1, 128: 14.9, 256: 14.9}
    assert effective_cache_from_curve(intel) == 48 * MIB
    assert effective_cache_from_curve({s: 20.0 for s in (4, 8, 16, 64, 512)}) == 512 * MIB    # never falls off
    assert effective_cache_from_curve({4: 20.0, 8: 20.0, 16: 9.0, 32: 20.0}) == 8 * MIB        # the first fall counts
    with pytest.raises(ValueError, match="reference"):
        effective_cache_from_curve({64: 10.0, 128: 5.0})


def test_measuring_uses_the_probe_and_a_real_read_is_a_plausible_bandwidth():
    calls = []

    def probe(size_mib):
        calls.append(size_mib)
        return 30e9 if size_mib <= 32 else 12e9

    assert measure_effective_cache_bytes(probe, (4, 8, 16, 32, 64, 128), repeats=1) == 32 * MIB
    assert calls == [4, 8, 16, 32, 64, 128]


def test_a_size_at_the_edge_is_decided_by_its_median_over_repeated_curves():
    """On the Intel guest a 64 MiB array read at 16, 27 and 19 GB/s in three curves in a row."""
    edge = iter([16e9, 27e9, 19e9])

    def probe(size_mib):
        return 28e9 if size_mib <= 48 else next(edge) if size_mib == 64 else 14e9

    assert measure_effective_cache_bytes(probe, (4, 8, 16, 48, 64, 128)) == 48 * MIB
    flipping = iter([27e9, 16e9, 27.5e9])
    assert measure_effective_cache_bytes(
        lambda s: 28e9 if s <= 48 else next(flipping) if s == 64 else 14e9, (4, 8, 16, 48, 64, 128)) == 64 * MIB
    assert 1e8 < read_bandwidth(4, passes=2, bytes_per_pass=16 * MIB) < 1e13    # 0.1 GB/s .. 10 TB/s


def test_the_database_keeps_the_probe_of_its_own_host(tmp_path, monkeypatch):
    from predictors import registry
    from tests.predictors.profiling.test_zoo_profile import TARGET, build_fake_db

    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=3, with_retests=False)
    db_cpu = json.loads(TARGET).get("mcpu", "fakecpu")
    probes = []
    fake = lambda size_mib: probes.append(size_mib) or (30e9 if size_mib <= 16 else 10e9)   # noqa: E731
    monkeypatch.setattr(cache_probe, "last_level_cache_bytes", lambda: 32 * MIB)
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "othercpu")
    assert effective_cache_bytes_for_db(db, db_cpu, probe=fake) is None and not probes   # another CPU: no probe
    monkeypatch.setattr(registry, "host_cpu_name", lambda: db_cpu)
    assert effective_cache_bytes_for_db(db, db_cpu, probe=fake) == 16 * MIB
    assert probes and max(probes) == 64                    # up to twice sysfs' 32 MiB
    probes.clear()
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "othercpu")
    assert effective_cache_bytes_for_db(db, db_cpu, probe=fake) == 16 * MIB and not probes   # stored, any host
    with ModelDatabase(db) as models:
        assert models.meta("effective_cache_bytes") == str(16 * MIB)
        assert models.meta("sysfs_cache_bytes") == str(32 * MIB)     # stored with the probe, from its host


def test_the_bound_is_sysfs_when_the_probe_lies_within_the_smallest_share_of_it():
    # Zen 4 guest: the probe read 8 or 16 MiB of a real 32 MiB L3 -> 32 (the fit can still pick 8 or 16)
    assert cache_bound_bytes(8 * MIB, 32 * MIB) == cache_bound_bytes(16 * MIB, 32 * MIB) == 32 * MIB
    # Intel guest: sysfs reports the host's 480 MiB, the probe 48 MiB -> the probe
    assert cache_bound_bytes(48 * MIB, 480 * MIB) == 48 * MIB
    # just outside the smallest share (0.25), a probe above sysfs, an unknown sysfs: the probe
    assert cache_bound_bytes(7 * MIB, 32 * MIB) == 7 * MIB
    assert cache_bound_bytes(64 * MIB, 32 * MIB) == 64 * MIB
    assert cache_bound_bytes(16 * MIB, None) == 16 * MIB


def test_a_database_probed_without_sysfs_takes_this_hosts_only_when_it_has_the_databases_cpu(tmp_path, monkeypatch):
    from predictors import registry
    from tests.predictors.profiling.test_zoo_profile import TARGET, build_fake_db

    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=3, with_retests=False)
    db_cpu = json.loads(TARGET).get("mcpu", "fakecpu")
    with ModelDatabase(db) as models:            # probed before sysfs's size was stored with it
        models.put_meta("effective_cache_bytes", str(8 * MIB))
    monkeypatch.setattr(cache_probe, "last_level_cache_bytes", lambda: 32 * MIB)
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "othercpu")
    assert cache_sizes_for_db(db, db_cpu) == cache_probe.CacheSizes(8 * MIB, None, 8 * MIB)
    monkeypatch.setattr(registry, "host_cpu_name", lambda: db_cpu)
    assert cache_sizes_for_db(db, db_cpu) == cache_probe.CacheSizes(8 * MIB, 32 * MIB, 32 * MIB)
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "othercpu")        # now stored: any host
    assert cache_sizes_for_db(db, db_cpu).bound_bytes == 32 * MIB


def test_fit_uses_the_stored_effective_cache(tmp_path):
    from predictors.fitting.training import fit_from_db
    from tests.predictors.profiling.test_zoo_profile import build_fake_db

    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=4, with_retests=False)
    with ModelDatabase(db) as models:
        models.put_meta("effective_cache_bytes", str(24 * MIB))
    predictor, info = fit_from_db(db)
    assert predictor.context.cache_bytes == 24 * MIB and info["effective_cache_bytes"] == 24 * MIB
    assert info["cache_bound_bytes"] == 24 * MIB             # no sysfs size stored for the fake host
    assert np.isfinite(predictor.context.cold_param_us_per_mb)


def test_fit_takes_the_l2_of_the_threads_the_kernels_ran_with_not_of_this_process(tmp_path, monkeypatch):
    from predictors import context
    from predictors.fitting.dataset import load_training_data
    from predictors.fitting.training import fit_from_db
    from tests.predictors.profiling.test_zoo_profile import build_fake_db

    db = tmp_path / "p.sqlite"
    build_fake_db(db, n_models=4, with_retests=False)
    threads = load_training_data(db).num_threads
    monkeypatch.setattr(context, "_cpu_caches", lambda: [(2, MIB, str(cpu)) for cpu in range(8)])
    fitted = []
    for env_threads in ("1", "8"):
        monkeypatch.setenv("TVM_NUM_THREADS", env_threads)
        fitted.append(fit_from_db(db)[0].context.core_cache_bytes)
    assert fitted == [threads * MIB, threads * MIB]
