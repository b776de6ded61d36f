"""RequestFeed (``TaskRuntime.run_many``'s admission): at most ``max_in_flight`` requests in flight, the next one
admitted when one ends, requests that fail at admission replaced at once, every latency recorded, and the first
failure raised only after every request ended. A fake runtime ends requests from its own threads."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpart.driver.task_feed import RequestFeed


class FakeRuntime:
    """Admits a request unless its input is "bad"; two worker threads end admitted requests in admission order."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self.admitted: list[int] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def admit(self, inputs, future: Future, on_finish) -> bool:
        ((index, kind),) = inputs
        if kind == "bad":
            future.set_exception(ValueError("bad input"))
            return False
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.admitted.append(index)
        self._queue.put((index, kind, future, on_finish))
        return True

    def _work(self) -> None:
        while True:
            index, kind, future, on_finish = self._queue.get()
            time.sleep(0.0005)          # a request takes a while: the feed must not admit past its limit meanwhile
            with self._lock:
                self.in_flight -= 1
            if kind == "fails":
                future.set_exception(RuntimeError("failed in a worker"))
            else:
                future.set_result([index * 2])
            on_finish()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["ok", "bad", "fails"]), max_size=20), st.integers(1, 6))
def test_every_request_ends_once_within_the_limit(kinds, max_in_flight):
    fake = FakeRuntime()
    inputs = [[(k, kind)] for k, kind in enumerate(kinds)]
    feed = RequestFeed(fake.admit, inputs, max_in_flight)
    failures = [kind for kind in kinds if kind != "ok"]
    if failures:
        expected = ValueError if failures[0] == "bad" else RuntimeError
        with pytest.raises(expected):
            feed.run()
    else:
        outputs, _ = feed.run()
        assert outputs == [[k * 2] for k in range(len(kinds))]
    assert len(feed.latency_us) == len(kinds) and all(t > 0 for t in feed.latency_us)   # in when run() returns
    assert all(future.done() for future in feed.futures)
    assert fake.most_in_flight <= max_in_flight
    assert fake.admitted == [k for k, kind in enumerate(kinds) if kind != "bad"]     # admitted in order, once each


def test_an_empty_list_returns_at_once():
    assert RequestFeed(FakeRuntime().admit, [], 4).run() == ([], [])
