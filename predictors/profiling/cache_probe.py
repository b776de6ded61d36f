"""Measure how much last-level cache this process really gets, instead of trusting sysfs.

The in-model terms (:mod:`predictors.context`) decide from the last-level cache size whether a model's weights
stay cached between inferences. sysfs reports the hardware cache, which a virtual machine may share with other
guests: the 2-core Intel guest reports a 480 MiB L3, so every zoo model's weights counted as cached and
ResNet-50 was predicted 45% low (its whole-model time is 1.4-1.8x the sum of its isolated kernels there).

The probe reads arrays of growing size (``max`` over float32, best of several passes; single-threaded) and finds
where the read bandwidth falls off: the effective cache is the largest size whose bandwidth, and that of every
smaller size, stays within :data:`BANDWIDTH_DROP` of the small arrays'. Measured on that Intel guest (GB/s):
4 MiB 32.4, 8-48 MiB 28.5-29.2, 64 MiB 23.6, 96-256 MiB 14.9-15.1 -> 48 MiB. The size at the edge is not stable
there: three curves in a row read 64 MiB at 16.1, 27.4 and 19.4 GB/s (48, 64 and 48 MiB; other guests share that
cache), and one curve had stored 64 MiB in a database. So the curve is measured :data:`PROBE_REPEATS` times and
each size's median bandwidth decides.

``hetpart profile`` measures it once per profile database (on the host being profiled) and stores it in the
database's ``hetpart_meta`` with sysfs's figure; ``hetpart fit`` and ``hetpart evaluate`` use the stored values (an
older database without them: measured at fit time if this host has the CPU the database was measured on, else
sysfs). :func:`predictors.context.fit_context_terms` fits which share of a bound a model keeps between inferences
(48 of the 64 MiB probed on the Intel guest).

**The bound: the probe, or sysfs within the shares' reach of it** (:func:`cache_bound_bytes`). On this machine
kind's Zen 4 guest (sysfs: 32 MiB L3) one thread's read bandwidth falls off gradually past 8 MiB (GB/s: 4-8 MiB
72-86, 16 MiB 65-75, 24 MiB 45-52, 32 MiB 42-45), so the probe read 8, 16, 8 and 16 MiB in four profiles of the same
host: the edge sits on the threshold. A probe below the cache the models keep caps every share too low: with the
polynomial's predictions, leave-one-model-out, whole models went from 5.23% / 19.6% worst with the share fitted below
the probe's 8 MiB to 3.06% / 6.8% below sysfs's 32 MiB (Z4-B in docs/predictors_history.md). So sysfs is the
bound whenever the probe lies within the smallest share of it (``probe >= min(CACHE_SHARES) x sysfs``: the fit can
still choose the probe's size); the probe only where sysfs is out of its reach -- the Intel guest's 480 MiB against
a 48 MiB probe.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from predictors.context import CACHE_SHARES, last_level_cache_bytes

logger = logging.getLogger(__name__)

PROBE_SIZES_MIB = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
REFERENCE_MAX_MIB = 16         # sizes up to this set the in-cache bandwidth (median of them)
BANDWIDTH_DROP = 0.15          # a size is cached while its bandwidth is >= (1 - this) x the reference
META_KEY = "effective_cache_bytes"
SYSFS_META_KEY = "sysfs_cache_bytes"
PROBE_REPEATS = 3              # curves measured; each size's median bandwidth decides

BandwidthProbe = Callable[[int], float]     # size in MiB -> read bandwidth (bytes/s)


def read_bandwidth(size_mib: int, passes: int = 5, bytes_per_pass: int = 256 * 2 ** 20) -> float:
    """Best read bandwidth (bytes/s) over ``passes`` passes, each reading a ``size_mib`` array repeatedly."""
    data = np.ones(size_mib * 2 ** 20 // 4, dtype=np.float32)
    data.max()                                            # touch every page before timing
    reps = max(1, bytes_per_pass // data.nbytes)
    best_s = np.inf
    for _ in range(passes):
        start = time.perf_counter()
        for _ in range(reps):
            data.max()
        best_s = min(best_s, (time.perf_counter() - start) / reps)
    return data.nbytes / best_s


def effective_cache_from_curve(bandwidth: Mapping[int, float]) -> int:
    """The effective cache (bytes) from a {size MiB: bytes/s} curve (see the module docstring)."""
    sizes = sorted(bandwidth)
    small = [bandwidth[s] for s in sizes if s <= REFERENCE_MAX_MIB]
    if not small:
        raise ValueError(f"the probe needs sizes <= {REFERENCE_MAX_MIB} MiB for its reference; got {sizes}")
    reference = float(np.median(small))
    cached = sizes[0]
    for size in sizes:
        if bandwidth[size] < (1 - BANDWIDTH_DROP) * reference:
            break
        cached = size
    return cached * 2 ** 20


def measure_effective_cache_bytes(probe: BandwidthProbe = read_bandwidth,
                                  sizes_mib: Sequence[int] | None = None, repeats: int = PROBE_REPEATS) -> int:
    """Probe this host (sizes up to twice the sysfs last-level cache, at most 512 MiB; ``repeats`` curves, the
    median bandwidth of each size) and return the effective last-level cache in bytes; about 2-4 s per curve."""
    if sizes_mib is None:
        limit_mib = max(2 * last_level_cache_bytes() // 2 ** 20, 64)
        sizes_mib = [s for s in PROBE_SIZES_MIB if s <= limit_mib]
    samples: dict[int, list[float]] = {int(s): [] for s in sizes_mib}
    for _ in range(max(1, repeats)):
        for size in samples:
            samples[size].append(float(probe(size)))
    curve = {size: float(np.median(values)) for size, values in samples.items()}
    cache = effective_cache_from_curve(curve)
    logger.info("effective last-level cache: %d MiB (read bandwidth %s; sysfs reports %d MiB)", cache // 2 ** 20,
                ", ".join(f"{s} MiB {bw / 1e9:.1f} GB/s" for s, bw in curve.items()),
                last_level_cache_bytes() // 2 ** 20)
    return cache


def effective_cache_bytes_for_db(db_path: str | Path, db_cpu: str | None,
                                 probe: BandwidthProbe = read_bandwidth) -> int | None:
    """The effective cache stored in the profile database; if it has none and this host has the database's CPU
    (``db_cpu``, TVM's -mcpu; None: do not measure), measure it now and store it. None: neither (callers fall
    back to sysfs)."""
    from predictors.profiling.model_db import ModelDatabase

    with ModelDatabase(db_path) as models:
        stored = models.meta(META_KEY)
        if stored is not None:
            return int(stored)
        from predictors.registry import host_cpu_name

        if db_cpu is None or db_cpu != host_cpu_name():
            logger.info("%s records no effective cache size and this host (%s) is not its CPU (%s): the in-model "
                        "terms use this host's sysfs cache size", db_path, host_cpu_name(), db_cpu)
            return None
        cache = measure_effective_cache_bytes(probe)
        models.put_meta(META_KEY, str(cache))
        models.put_meta(SYSFS_META_KEY, str(last_level_cache_bytes()))
        return cache


def cache_bound_bytes(probed_bytes: int, sysfs_bytes: int | None) -> int:
    """The cache a model can keep at most (module docstring): sysfs's size when the probe lies within the smallest
    fitted share of it, else the probe."""
    if sysfs_bytes is not None and probed_bytes <= sysfs_bytes and probed_bytes >= min(CACHE_SHARES) * sysfs_bytes:
        return int(sysfs_bytes)
    return int(probed_bytes)


@dataclass(frozen=True)
class CacheSizes:
    """A profile database's host caches: ``probed_bytes`` (this module's probe), ``sysfs_bytes`` (what the OS
    reported; None when unknown) and ``bound_bytes`` (:func:`cache_bound_bytes`), in bytes."""

    probed_bytes: int
    sysfs_bytes: int | None
    bound_bytes: int


def cache_report_fields(sizes: CacheSizes | None) -> dict[str, int | None]:
    """The sizes as fit and evaluation reports record them (all None when the database has no probe)."""
    return {"effective_cache_bytes": None if sizes is None else sizes.probed_bytes,
            "sysfs_cache_bytes": None if sizes is None else sizes.sysfs_bytes,
            "cache_bound_bytes": None if sizes is None else sizes.bound_bytes}


def cache_sizes_for_db(db_path: str | Path, db_cpu: str | None,
                       probe: BandwidthProbe = read_bandwidth) -> CacheSizes | None:
    """The probed and sysfs caches of the database's host and the bound the in-model terms fit shares of. A
    database probed before sysfs's size was stored takes this host's when this host has its CPU. None: no probe
    (callers fall back to sysfs)."""
    from predictors.profiling.model_db import ModelDatabase

    probed = effective_cache_bytes_for_db(db_path, db_cpu, probe)
    if probed is None:
        return None
    from predictors.registry import host_cpu_name

    with ModelDatabase(db_path) as models:
        stored = models.meta(SYSFS_META_KEY)
        if stored is None and db_cpu is not None and db_cpu == host_cpu_name():
            stored = str(last_level_cache_bytes())
            models.put_meta(SYSFS_META_KEY, stored)
    sysfs = None if stored is None else int(stored)
    return CacheSizes(probed, sysfs, cache_bound_bytes(probed, sysfs))
