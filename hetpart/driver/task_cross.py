"""Cross-device sharing in the task runtime (:mod:`hetpart.cross_sharing` states the rule; the simulator applies
the same one): a free worker with nothing of its own or of its peer core groups takes the first ready segment of a
busy device that it is predicted to end sooner, when the segments were built for every device.

Every method is called with the runtime's lock held. For a given state the rule only turns against taking as time
passes (the taker's predicted end moves, the busy device's does not), so it is checked when the state changes: when
a worker is about to wait (:meth:`CrossSharing.owner_to_take_from`), when a segment is queued for a busy device (a
new request's too, which also raises the requests in flight) and when a device starts a segment with more queued
behind it (:meth:`CrossSharing.offer`).
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from hetpart.cross_sharing import SharingTable, busy_until_us, takes
from hetpart.driver.task_workers import _Worker
from hetpart.errors import UsageError

__all__ = ["CrossSharing"]


def _now_us() -> float:
    return time.perf_counter() * 1e6


class CrossSharing:
    """The table, and which workers may take each other's segments across devices."""

    def __init__(self, table: SharingTable, planned_device: list[str], workers: Mapping[str, _Worker],
                 peers: Mapping[str, set[str]], conds: Mapping[str, Any], requests: Mapping[int, Any]) -> None:
        missing = sorted(set(planned_device) - set(table.devices))
        if missing or table.n_segments != len(planned_device):
            raise UsageError(f"the segments' sharing table covers {table.n_segments} segments on {list(table.devices)},"
                             f" not these {len(planned_device)} segments on devices including {missing}; rebuild the "
                             "segments (hetpart compile --segments)")
        self.table, self.planned_device = table, planned_device
        self.workers, self.peers, self.conds = workers, peers, conds
        self.requests = requests                 # the runtime's requests in flight

    def can_run(self, device: str, segment: int) -> bool:
        """Whether ``device`` may take ``segment`` (the table prices it there; else it was not built for it)."""
        return device in self.table.devices and self.table.duration_us[self.table.index(device)][segment] is not None

    def _others(self, worker: _Worker) -> list[_Worker]:
        """The busy workers of other devices (not its peer core groups) with queued segments, best head first."""
        peers = self.peers.get(worker.device, set())
        found = [w for name, w in self.workers.items() if name != worker.device and name not in peers
                 and name in self.table.devices and w.heap and not w.idle and len(w.heap) > w.woken]
        return sorted(found, key=lambda w: w.heap[0])

    def _takes(self, taker: _Worker, owner: _Worker, now_us: float) -> bool:
        segment = owner.heap[0][1]
        return takes(self.table, now_us, self.table.index(taker.device), self.table.index(owner.device), segment,
                     owner.busy_until_us, len(self.requests))

    def owner_to_take_from(self, worker: _Worker) -> _Worker | None:
        """The busy device whose first ready segment the free ``worker`` takes, or None."""
        if worker.device not in self.table.devices:
            return None
        now_us = _now_us()
        return next((owner for owner in self._others(worker) if self._takes(worker, owner, now_us)), None)

    def started(self, worker: _Worker, segment: int, taken: bool) -> None:
        """Record the predicted end of ``segment``, which ``worker`` starts now (``taken``: across devices, at its
        own device's cost; else at the planned device's, which a peer core group shares)."""
        cost_device = worker.device if taken else self.planned_device[segment]
        worker.busy_until_us = busy_until_us(self.table, _now_us(), self.table.index(cost_device), segment)

    def offer(self, owner: _Worker) -> None:
        """``owner`` is busy with segments queued: wake one idle worker of another device that would take its first."""
        if not owner.heap or owner.idle or owner.device not in self.table.devices:
            return
        peers = self.peers.get(owner.device, set())
        now_us = _now_us()
        for name, worker in self.workers.items():
            if worker.idle and name != owner.device and name not in peers and name in self.table.devices \
                    and self._takes(worker, owner, now_us):
                worker.idle = False
                worker.woken += 1
                self.conds[name].notify()
                return
