"""TVM's CPU thread pool per calling thread: restrict it (and pin it to cores) for a CPU device that owns only some
of the host's cores.

TVM configures its pool per calling thread (``runtime.config_threadpool``), never above the ``TVM_NUM_THREADS`` the
pool started with (:mod:`hetpart.threads` sets that before TVM loads). ``docs/thread_pools.md`` has the measurements.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hetpart.threads import PROCESS_CORES, deployment_threads

_RESTRICTED = threading.local()


def pool_threads_wanted() -> int:
    """The TVM thread count the calling thread should run with: :func:`restricted_pool`'s inside one, else
    :func:`deployment_threads`."""
    return getattr(_RESTRICTED, "threads", None) or deployment_threads()


@contextlib.contextmanager
def restricted_pool(threads: int | None, cores: tuple[int, ...] = ()) -> Iterator[None]:
    """Run TVM kernels called from this thread with ``threads`` pool threads (pinned to ``cores`` when given),
    then give the thread its deployment pool back. TVM's pool configuration is per calling thread
    (``runtime.config_threadpool``) and cannot exceed the ``TVM_NUM_THREADS`` the pool started with."""
    if threads is None:
        yield
        return
    import tvm

    configure = tvm.get_global_func("runtime.config_threadpool")
    previous = getattr(_RESTRICTED, "threads", None)
    configure_pool(configure, threads, cores)
    _RESTRICTED.threads = threads
    try:
        yield
    finally:
        _RESTRICTED.threads = previous
        # Back to every core this process may use. Not AFFINITY_BIG: TVM keeps the core list of the last
        # AFFINITY_SHARE_LISTED_CORES call, so "big" mode would leave this thread and its pool pinned to ``cores``.
        configure_pool(configure, previous or deployment_threads(), PROCESS_CORES)


# TVM's threading::ThreadGroup::AffinityMode values (src/runtime/threading_backend.h).
AFFINITY_BIG = 1
AFFINITY_SHARE_LISTED_CORES = -3


def configure_pool(configure: Callable[..., Any], threads: int, cores: tuple[int, ...] = ()) -> None:
    """``runtime.config_threadpool`` for the calling thread: ``threads`` threads, all of them (the calling thread
    included) allowed on ``cores`` only when cores are given."""
    if cores:
        configure(AFFINITY_SHARE_LISTED_CORES, int(threads), [str(c) for c in cores])
    else:
        configure(AFFINITY_BIG, int(threads))
