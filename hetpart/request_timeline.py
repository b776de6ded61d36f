"""What the task runtime costs and what it is predicted to do: the data types of ``hetpart.simulate_requests``.

:class:`RuntimeModel` holds the runtime's parameters (overhead per segment and device, how workers pick segments,
where copies run); :class:`RequestsTimeline` is a simulated run of N requests, with its events, per-request
latencies, makespan and steady-state period. Both are frozen, validated and round-trip through JSON.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hetpart.errors import InvalidPlanError, SchemaError, UsageError
from hetpart.graph import SCHEMA_VERSION, check_schema_version

__all__ = ["COPY_PLACEMENTS", "EVENT_KINDS", "WORKER_POLICIES", "RequestEvent", "RequestsTimeline", "RuntimeModel",
           "steady_state_period_us"]

WORKER_POLICIES = ("priority", "fixed_order")
COPY_PLACEMENTS = ("links", "consumer")
EVENT_KINDS = ("segment", "copy")


@dataclass(frozen=True)
class RuntimeModel:
    """What the task runtime costs on top of the kernels, per device, how its workers pick segments and where its
    copies run."""

    dispatch_overhead_us_by_device: Mapping[str, float] = field(default_factory=dict)   # per segment; absent: 0
    worker_policy: str = "priority"          # "priority": best ready segment; "fixed_order": strict sequence
    # "consumer" (what the task runtime does): the worker of the segment that first needs a tensor on its device
    # copies it before running the segment, and the worker that ends a request copies the outputs made off the
    # host back; "links": copies run on the links, overlapping the workers, as hetpart.simulate assumes
    copies: str = "consumer"
    # Per request (µs): from its admission until its first segments may start (the caller checks and converts the
    # inputs and wakes a worker), and from its last segment's end until its result is available (the outputs read
    # back, the future resolved). Neither occupies a worker in the model; both add to every request's latency, and
    # a completion admits the next waiting request only once the result is out (``max_in_flight``).
    admission_us: float = 0.0
    completion_us: float = 0.0
    # With copies="consumer" and the "priority" policy: a worker that ends a segment and then has no ready segment
    # of its own device runs the first newly ready segment of an interchangeable device itself (CPU core groups of
    # one host with as many cores each, DeviceSet.interchangeable_groups), as the task runtime does
    continuation: bool = True
    # Work sharing (same conditions): a free worker with no ready segment of its own device takes the ready segment
    # of an interchangeable device with the lowest (request, segment id) (whose own worker is then busy)
    sharing: bool = True
    # Cross-device sharing (with sharing): a free worker with nothing of its own or of its peers takes the ready
    # segment of another, busy device when it is predicted to end it sooner than that device would (its start when
    # that worker frees, copies in, the segment's cost on each device); the segment's outputs stay on its device.
    # Every segment must then be built for every device (the task runtime's ``cross_device_sharing``)
    cross_device_sharing: bool = False
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        try:
            overheads = {str(k): float(v) for k, v in dict(self.dispatch_overhead_us_by_device).items()}
        except (TypeError, ValueError) as exc:
            raise UsageError(f"dispatch_overhead_us_by_device must map device names to microseconds; found "
                             f"{self.dispatch_overhead_us_by_device!r}") from exc
        object.__setattr__(self, "dispatch_overhead_us_by_device", overheads)
        for key in ("continuation", "sharing", "cross_device_sharing"):
            if not isinstance(getattr(self, key), bool):
                raise UsageError(f"{key} must be True or False; found {getattr(self, key)!r}")
        for key in ("admission_us", "completion_us"):
            try:
                object.__setattr__(self, key, float(getattr(self, key)))
            except (TypeError, ValueError) as exc:
                raise UsageError(f"{key} must be a number of microseconds; found {getattr(self, key)!r}") from exc

    def overhead_us(self, device: str) -> float:
        return self.dispatch_overhead_us_by_device.get(device, 0.0)

    def validate(self, device_names: Sequence[str] | None = None) -> "RuntimeModel":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"RuntimeModel schema_version must be {SCHEMA_VERSION}; found {self.schema_version}")
        if self.worker_policy not in WORKER_POLICIES:
            raise UsageError(f"worker_policy must be one of {WORKER_POLICIES}; found {self.worker_policy!r}")
        if self.copies not in COPY_PLACEMENTS:
            raise UsageError(f"copies must be one of {COPY_PLACEMENTS}; found {self.copies!r}")
        bad = {d: v for d, v in self.dispatch_overhead_us_by_device.items() if not (math.isfinite(v) and v >= 0)}
        if bad:
            raise UsageError(f"dispatch overheads must be finite and >= 0 us; found {bad}")
        for key in ("admission_us", "completion_us"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0):
                raise UsageError(f"{key} must be finite and >= 0 us; found {getattr(self, key)}")
        if device_names is not None:
            unknown = sorted(set(self.dispatch_overhead_us_by_device) - set(device_names))
            if unknown:
                raise UsageError(f"dispatch overheads name devices {unknown} that are not among {list(device_names)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "worker_policy": self.worker_policy, "copies": self.copies,
                "dispatch_overhead_us_by_device": dict(self.dispatch_overhead_us_by_device),
                "admission_us": self.admission_us, "completion_us": self.completion_us,
                "continuation": self.continuation, "sharing": self.sharing,
                "cross_device_sharing": self.cross_device_sharing}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RuntimeModel":
        check_schema_version(data, "RuntimeModel")
        try:
            model = cls(dispatch_overhead_us_by_device=data.get("dispatch_overhead_us_by_device", {}),
                        worker_policy=str(data.get("worker_policy", "priority")),
                        copies=str(data.get("copies", "links")),     # written before copies were modelled
                        admission_us=data.get("admission_us", 0.0),   # written before they were modelled: 0
                        completion_us=data.get("completion_us", 0.0),
                        continuation=data.get("continuation", False),   # written before it was modelled: off
                        sharing=data.get("sharing", False),
                        cross_device_sharing=data.get("cross_device_sharing", False),
                        schema_version=data["schema_version"])
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"RuntimeModel JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return model.validate()


@dataclass(frozen=True)
class RequestEvent:
    """One segment run or one copy of one request."""

    kind: str            # "segment" or "copy"
    request: int
    resource: str        # device name for segments, "src->dst" for copies
    start_us: float
    end_us: float
    segment_id: int      # the segment run; for a copy the segment that produced the tensor (-1: a model input)
    op_id: int = -1      # copies: the producer op, or -1-k for model input k; segments: -1
    size_bytes: int = 0  # copies only

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "request": self.request, "resource": self.resource, "start_us": self.start_us,
                "end_us": self.end_us, "segment_id": self.segment_id, "op_id": self.op_id,
                "size_bytes": self.size_bytes}


def steady_state_period_us(completed_us: Sequence[float]) -> float:
    """Mean interval between consecutive completions over the second half of the requests.

    With completions sorted as c_0 <= ... <= c_{N-1} and a = max(1, N // 2), the period is
    (c_{N-1} - c_{a-1}) / (N - a): the mean of the intervals c_i - c_{i-1} for i = a .. N-1. For N = 1 it is
    c_0 (one request admitted at 0 completes every c_0 us). Its inverse is the sustained throughput.
    """
    c = sorted(completed_us)
    if not c:
        return 0.0
    if len(c) == 1:
        return c[0]
    a = max(1, len(c) // 2)
    return (c[-1] - c[a - 1]) / (len(c) - a)


@dataclass(frozen=True)
class RequestsTimeline:
    """What the task runtime is predicted to do with N requests (see the module docstring)."""

    events: tuple[RequestEvent, ...]
    admitted_us: tuple[float, ...]       # per request
    completed_us: tuple[float, ...]      # per request
    latency_us: tuple[float, ...]        # per request: completed - admitted
    makespan_us: float                   # the last completion
    period_us: float                     # steady_state_period_us(completed_us)
    max_in_flight: int
    serial_links: bool = True
    runtime: RuntimeModel = field(default_factory=RuntimeModel)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        for key in ("admitted_us", "completed_us", "latency_us"):
            object.__setattr__(self, key, tuple(float(v) for v in getattr(self, key)))

    @property
    def n_requests(self) -> int:
        return len(self.completed_us)

    def events_of(self, request: int, kind: str | None = None) -> list[RequestEvent]:
        return [e for e in self.events if e.request == request and (kind is None or e.kind == kind)]

    def validate(self) -> "RequestsTimeline":
        if self.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"RequestsTimeline schema_version must be {SCHEMA_VERSION}; found "
                              f"{self.schema_version}")
        n, tol = self.n_requests, 1e-6
        if not (len(self.admitted_us) == len(self.latency_us) == n) or not 1 <= self.max_in_flight <= max(n, 1):
            raise InvalidPlanError(f"a timeline of {n} requests needs {n} admissions, completions and latencies "
                                   f"and 1 <= max_in_flight <= {n}")
        for r in range(n):
            if abs(self.completed_us[r] - self.admitted_us[r] - self.latency_us[r]) > tol:
                raise InvalidPlanError(f"request {r}: latency {self.latency_us[r]} is not completion minus "
                                       "admission")
        if n and abs(self.makespan_us - max(self.completed_us)) > tol:
            raise InvalidPlanError(f"makespan {self.makespan_us} is not the last completion {max(self.completed_us)}")
        if abs(self.period_us - steady_state_period_us(self.completed_us)) > tol:
            raise InvalidPlanError(f"period {self.period_us} does not follow from the completions")
        busy: dict[str, list[RequestEvent]] = {}
        for e in self.events:
            if e.kind not in EVENT_KINDS or not 0 <= e.request < n:
                raise InvalidPlanError(f"event {e} has an unknown kind or request")
            if e.end_us < e.start_us - tol or e.start_us < self.admitted_us[e.request] - tol \
                    or e.end_us > self.completed_us[e.request] + tol:
                raise InvalidPlanError(f"event {e} ends before it starts or lies outside its request's lifetime")
            if e.kind == "segment" or (self.serial_links and self.runtime.copies == "links"):  # else on workers
                busy.setdefault(e.resource, []).append(e)
        for resource, events in busy.items():
            events.sort(key=lambda e: (e.start_us, e.end_us))
            for a, b in zip(events, events[1:]):
                if b.start_us < a.end_us - tol:
                    raise InvalidPlanError(f"{resource} runs two things at once: {a} and {b}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "makespan_us": self.makespan_us,
                "period_us": self.period_us, "max_in_flight": self.max_in_flight, "serial_links": self.serial_links,
                "runtime": self.runtime.to_dict(), "admitted_us": list(self.admitted_us),
                "completed_us": list(self.completed_us), "latency_us": list(self.latency_us),
                "events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RequestsTimeline":
        check_schema_version(data, "RequestsTimeline")
        try:
            timeline = cls(
                events=tuple(RequestEvent(**e) for e in data["events"]), admitted_us=data["admitted_us"],
                completed_us=data["completed_us"], latency_us=data["latency_us"],
                makespan_us=float(data["makespan_us"]), period_us=float(data["period_us"]),
                max_in_flight=int(data["max_in_flight"]), serial_links=bool(data.get("serial_links", True)),
                runtime=RuntimeModel.from_dict(data["runtime"]), schema_version=data["schema_version"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"RequestsTimeline JSON is malformed ({type(exc).__name__}: {exc})") from exc
        return timeline.validate()
