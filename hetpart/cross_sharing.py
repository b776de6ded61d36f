"""Cross-device sharing: a free device's worker runs a segment planned for another, busy device when it is
predicted to end it sooner.

The task runtime's workers run their own device's segments; with work sharing, equal CPU core groups also take
each other's. Cross-device sharing goes further: when every segment is built for every device, a worker with no
ready segment of its own (or of its peers) takes the ready segment with the lowest (request, segment id) of a busy
device ``d`` if

    now + copy_in_us[w][s] + duration_us[w][s]  <  max(now, busy_until_d) + copy_in_us[d][s] + duration_us[d][s]

where ``busy_until_d`` is the predicted end of the segment ``d``'s worker is running (its start plus that segment's
predicted copies and duration), ``duration_us[x][s]`` the segment's predicted time on ``x`` (the runtime's overhead
per segment plus its ops' latencies; None where ``x`` cannot run one of its ops or one is pinned) and
``copy_in_us[x][s]`` the predicted copies of what it reads onto ``x`` with every producer on its planned device. The
segment's outputs then stay on the taker's device; its readers copy them from there.

One guard: a device with segments of its own in the plan (``load_us``, its planned segments' predicted time per
request, above 0) takes only while more requests are in flight than there are devices. With fewer, every device
has a request of its own to work on and a pipeline stage that took its neighbour's segment, because that one was
briefly busy, made the next request's segment on its own device wait: with two requests in flight the plain rule
lost up to a fifth of a pipeline's throughput in the simulated RNN sweep. Two stricter guards were tried there and
dropped: letting only the device with the lighter planned load take, and taking only a segment that ends before
the taker's own next segment is due (backfilling); with 16 and 64 requests in flight they gave back much of the
gain over request-level balancing.

With a plan that puts a whole request on one device this is request-level load balancing by earliest predicted
finish; with a pipeline cut it balances the tail of a batch and the stages' mismatch. ``hetpart.simulate_requests``
simulates the rule (``RuntimeModel.cross_device_sharing``) and the task runtime applies it with the same table
(:class:`SharingTable`, written next to the segments at compile time). Imports nothing outside the core.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hetpart.errors import SchemaError
from hetpart.graph import SCHEMA_VERSION, check_schema_version

__all__ = ["SharingTable", "takes", "busy_until_us", "planned_load_us", "REL_TOL"]

REL_TOL = 1e-9      # a worker takes a segment only when it is predicted to end it sooner by more than this share


@dataclass(frozen=True)
class SharingTable:
    """Per device and segment: the predicted time of the segment there, and of copying its inputs there."""

    devices: tuple[str, ...]
    duration_us: tuple[tuple[float | None, ...], ...]     # [device][segment]; None: the device cannot run it
    copy_in_us: tuple[tuple[float, ...], ...]             # [device][segment]
    load_us: tuple[float, ...]                            # [device]: its planned segments' time per request
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
        object.__setattr__(self, "duration_us", tuple(tuple(None if v is None else float(v) for v in row)
                                                      for row in self.duration_us))
        object.__setattr__(self, "copy_in_us", tuple(tuple(float(v) for v in row) for row in self.copy_in_us))
        object.__setattr__(self, "load_us", tuple(float(v) for v in self.load_us))

    @property
    def n_segments(self) -> int:
        return len(self.duration_us[0]) if self.duration_us else 0

    def index(self, device: str) -> int:
        return self.devices.index(device)

    def validate(self, n_segments: int | None = None) -> "SharingTable":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"SharingTable schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        k = self.n_segments if n_segments is None else n_segments
        if len(self.duration_us) != len(self.devices) or len(self.copy_in_us) != len(self.devices) or any(
                len(row) != k for row in (*self.duration_us, *self.copy_in_us)) or \
                len(self.load_us) != len(self.devices):
            raise SchemaError(f"a sharing table needs one row of {k} segments per device {list(self.devices)} in "
                              "duration_us and copy_in_us, and one load_us per device; rebuild the segments")
        values = [v for row in (*self.duration_us, *self.copy_in_us, self.load_us) for v in row if v is not None]
        if any(not (math.isfinite(v) and v >= 0) for v in values):
            raise SchemaError("sharing table times must be finite and >= 0 us; rebuild the segments")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "devices": list(self.devices),
                "duration_us": [list(row) for row in self.duration_us],
                "copy_in_us": [list(row) for row in self.copy_in_us], "load_us": list(self.load_us)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SharingTable":
        check_schema_version(data, "SharingTable")
        try:
            table = cls(tuple(data["devices"]), tuple(tuple(r) for r in data["duration_us"]),
                        tuple(tuple(r) for r in data["copy_in_us"]), tuple(data["load_us"]), data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"SharingTable JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return table.validate()


def planned_load_us(duration_us: Sequence[Sequence[float | None]], copy_in_us: Sequence[Sequence[float]],
                    planned: Sequence[int]) -> tuple[float, ...]:
    """Per device, the predicted time of one request's segments planned there (``planned[s]``: segment ``s``'s
    device index), copies in included."""
    load = [0.0] * len(duration_us)
    for s, d in enumerate(planned):
        load[d] += (duration_us[d][s] or 0.0) + copy_in_us[d][s]
    return tuple(load)


def busy_until_us(table: SharingTable, start_us: float, cost_device: int, segment: int) -> float:
    """The predicted end of ``segment`` started at ``start_us`` at the cost of device ``cost_device`` (the taker's
    for a taken segment, else its planned device's, which a peer core group shares)."""
    return start_us + table.copy_in_us[cost_device][segment] + (table.duration_us[cost_device][segment] or 0.0)


def takes(table: SharingTable, now_us: float, taker: int, owner: int, segment: int, owner_busy_until_us: float,
          in_flight: int) -> bool:
    """Whether the free worker of device ``taker`` takes ``segment``, queued for the busy device ``owner``, with
    ``in_flight`` requests admitted and not completed (module docstring)."""
    mine = table.duration_us[taker][segment]
    theirs = table.duration_us[owner][segment]
    if mine is None or theirs is None:
        return False
    if table.load_us[taker] > 0 and in_flight <= len(table.devices):
        return False
    finish_mine = now_us + table.copy_in_us[taker][segment] + mine
    finish_theirs = max(now_us, owner_busy_until_us) + table.copy_in_us[owner][segment] + theirs
    return finish_mine < finish_theirs * (1 - REL_TOL)
