"""How many CPU threads TVM runs with: one policy for every entry point.

TVM sizes its CPU thread pool once, from ``TVM_NUM_THREADS`` when the pool starts, and otherwise uses half the
logical CPUs -- one thread on this 2-core machine kind. Deployments (``hetpart compile``/``run``, the Python API)
use every core unless the user set ``TVM_NUM_THREADS``, so profiles must be measured with the same count: a
profile measured single-threaded (through ``hetpart profile``, which once did not apply this policy) labelled
the zoo's kernels a median 1.9x (5th-95th percentile 1.0-2.15x, at most 8.6x) slower than a two-thread profile
of the same 1887 kernels.

Only ``os`` is imported: this is safe to call before TVM is loaded, which is when it must be called.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "TVM_NUM_THREADS"


def deployment_threads() -> int:
    """Threads a hetpart deployment on this machine runs TVM with: ``TVM_NUM_THREADS`` if it holds a positive
    integer, else every logical CPU."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads >= 1:
            return threads
        logger.warning("%s=%r is not a positive integer; using every core (%d)", ENV_VAR, value, os.cpu_count() or 1)
    return os.cpu_count() or 1


def ensure_tvm_threads() -> int:
    """Set ``TVM_NUM_THREADS`` to :func:`deployment_threads` (a user's own setting is kept) before TVM starts its
    thread pool; returns the count. Calling it after the pool started changes nothing in this process."""
    threads = deployment_threads()
    os.environ[ENV_VAR] = str(threads)
    return threads


def _affinity() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else \
        tuple(range(os.cpu_count() or 1))


# The cores this process may run on, read when hetpart is imported: before TVM runs a kernel. TVM's pool pins the
# calling thread to one core on its first parallel launch when it runs one thread (TVM_NUM_THREADS=1), so the main
# thread's own affinity is not the process's afterwards.
PROCESS_CORES: tuple[int, ...] = _affinity()
