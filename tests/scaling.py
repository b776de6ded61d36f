"""How an algorithm's running time grows with its input, measured as a ratio within one run.

Tests use this instead of an absolute time bound: a shared, busy or slower host changes absolute times (a
collection of a large heap left by earlier tests once made a 45 ms step take 600 ms), but not how the time
of one algorithm grows from a small input to a large one measured moments apart.
"""
from __future__ import annotations

import gc
import time
from typing import Callable


def best_cpu_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    """The smallest of ``repeats`` measurements of this thread's CPU time for ``run()``, garbage collection off."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.thread_time()    # this thread's CPU time: neither other processes nor TVM's
            run()                           # spinning pool threads left by earlier tests count
            best = min(best, time.thread_time() - started)
        finally:
            gc.enable()
    return best


def cpu_time_growth(run_at_size: Callable[[int], Callable[[], object]], small: int, large: int,
                    repeats: int = 3) -> float:
    """Ratio of the best CPU time at size ``large`` to the best at ``small``.

    ``run_at_size(n)`` prepares an input of size ``n`` (not timed) and returns the call to time. For
    ``large = 4 * small`` a linear algorithm gives about 4, an n log n one about 5, a quadratic one 16.
    """
    small_run, large_run = run_at_size(small), run_at_size(large)
    small_s = max(best_cpu_seconds(small_run, repeats), 1e-6)
    return best_cpu_seconds(large_run, repeats) / small_s
