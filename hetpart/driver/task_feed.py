"""Admitting a list of requests to a task runtime, at most ``max_in_flight`` at a time (``TaskRuntime.run_many``).

The worker that ends a request admits the next one itself, and the calling thread sleeps until the last request
has ended. Waking the calling thread at every completion instead (a semaphore released from a future's callback)
made the calling thread compete with both workers for the interpreter lock at every request: on a 2-core host it
cost a two-layer GRU of hidden 256 (1 ms a request) about 15% of its throughput with 64 requests in flight.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["RequestFeed"]

# admit(inputs, future, on_finish) -> True once admitted; False when it failed at once (its future holds why)
Admit = Callable[[Sequence[Any], Future, Callable[[], None]], bool]


class RequestFeed:
    """Runs ``inputs_list`` through ``admit``: the first ``max_in_flight`` requests at once, then one more each time
    one ends. :meth:`run` returns the outputs in request order and each request's latency in µs (completion minus
    admission), raising the first failed request's exception after every request has ended."""

    def __init__(self, admit: Admit, inputs_list: Sequence[Sequence[Any]], max_in_flight: int):
        assert max_in_flight >= 1
        self._admit = admit
        self._inputs = list(inputs_list)
        self._max_in_flight = max_in_flight
        count = len(self._inputs)
        self.futures: list[Future] = [Future() for _ in range(count)]
        self.latency_us = [0.0] * count
        self._admitted_s = [0.0] * count
        self._next = 0
        self._left = count
        self._lock = threading.Lock()
        self._all_ended = threading.Event()
        if not count:
            self._all_ended.set()

    def run(self) -> tuple[list[list[np.ndarray]], list[float]]:
        for _ in range(min(self._max_in_flight, len(self._inputs))):
            self._admit_next()
            time.sleep(0)         # let a worker just woken take the interpreter lock now, not after the whole wave
        self._all_ended.wait()
        return [future.result() for future in self.futures], self.latency_us

    def _admit_next(self) -> None:
        """Admit the next request; one that fails at admission (bad inputs, runtime closed) ends at once and the
        next one takes its place."""
        while True:
            with self._lock:
                if self._next >= len(self._inputs):
                    return
                k = self._next
                self._next += 1
            self._admitted_s[k] = time.perf_counter()
            if self._admit(self._inputs[k], self.futures[k], lambda k=k: self._ended(k)):
                return
            self._count_ended(k)

    def _ended(self, k: int) -> None:
        self._count_ended(k)
        self._admit_next()

    def _count_ended(self, k: int) -> None:
        self.latency_us[k] = (time.perf_counter() - self._admitted_s[k]) * 1e6
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._all_ended.set()
