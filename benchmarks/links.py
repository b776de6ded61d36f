"""Host<->device copy timing and the link model ``latency_us + bytes / bandwidth`` fitted to it.

Experiment code, not used by hetpart: a compile takes its copy links from the DeviceSet (datasheet presets,
``hetpart.devices.preset_links``). On this CPU-only machine the code path is exercised with cpu(0) -> cpu(1)
copies (real memcpys); on a CUDA machine the same functions time PCIe copies and return a
``hetpart.devices.Link`` with ``source="measured"`` (tests/benchmarks/test_links.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import tvm

from hetpart.devices import Link
from hetpart.errors import PredictorError

logger = logging.getLogger(__name__)

DEFAULT_LINK_SIZES = tuple(4096 * 4 ** k for k in range(8))     # 4 KiB .. 64 MiB


@dataclass(frozen=True)
class LinkFit:
    link: Link
    sizes_bytes: tuple[int, ...]
    median_us: tuple[float, ...]
    max_relative_residual: float = 0.0


def fit_link(sizes_bytes: Sequence[int], times_us: Sequence[float], src: str, dst: str) -> LinkFit:
    """Least squares of ``t = latency_us + bytes / bandwidth`` in relative error (each size weighs the same)."""
    x = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    if len(x) < 2 or len(set(x)) < 2 or np.any(t <= 0):
        raise PredictorError(f"a link fit needs >= 2 distinct sizes and positive times; found {len(x)} sizes")
    design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (latency_us, us_per_byte), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if us_per_byte <= 0:
        raise PredictorError(f"copies {src}->{dst} did not get slower with size (slope {us_per_byte:.3g} "
                             "us/byte): the timings are noise; measure larger sizes or more repeats")
    latency_us = max(0.0, float(latency_us))
    link = Link(src, dst, bandwidth_bytes_per_s=1e6 / float(us_per_byte), latency_us=latency_us,
                source="measured").validate()
    residual = max(abs(link.transfer_us(int(s)) - ti) / ti for s, ti in zip(x, t))
    return LinkFit(link, tuple(int(s) for s in x), tuple(float(v) for v in t), float(residual))


def measure_link(src_dev: tvm.runtime.Device, dst_dev: tvm.runtime.Device, src: str, dst: str,
                 sizes_bytes: Sequence[int] = DEFAULT_LINK_SIZES, repeat: int = 7) -> LinkFit:
    """Time ``src_dev -> dst_dev`` copies (median of ``repeat`` per size, after one warm-up) and fit a Link."""
    medians = []
    for size in sizes_bytes:
        host = np.random.default_rng(0).integers(0, 255, size=int(size), dtype=np.uint8)
        a = tvm.runtime.tensor(host, src_dev)
        b = tvm.runtime.empty((int(size),), "uint8", dst_dev)
        a.copyto(b)
        dst_dev.sync()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            a.copyto(b)
            dst_dev.sync()
            times.append((time.perf_counter() - start) * 1e6)
        medians.append(float(np.median(times)))
    fit = fit_link(sizes_bytes, medians, src, dst)
    if fit.max_relative_residual > 0.5:
        logger.warning("link %s->%s: latency + bytes/bandwidth misses some sizes by up to %.0f%% (cache effects "
                       "of host memcpy?); medians per size: %s", src, dst, 100 * fit.max_relative_residual,
                       dict(zip(fit.sizes_bytes, (round(m, 1) for m in fit.median_us))))
    logger.info("link %s->%s: %.2f GB/s, %.1f us latency (max residual %.0f%%)", src, dst,
                fit.link.bandwidth_bytes_per_s / 1e9, fit.link.latency_us, 100 * fit.max_relative_residual)
    return fit
