"""The task runtime's bookkeeping (:mod:`hetpart.driver.task_runtime`): a segment run of its trace, a request in
flight, a device worker, and the helpers that move a segment's tensors."""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from tvm_passes.thread_pool import configure_pool
from tvm_passes.virtual_machine import new_virtual_machine

__all__ = ["SegmentRun"]

log = logging.getLogger(__name__)


class SegmentRun(NamedTuple):
    """One segment run in ``TaskRuntime.trace`` (``time.perf_counter()`` seconds)."""

    request: int
    segment: int
    device: str          # the worker that ran it (a peer core group's, by continuation or work sharing)
    start_s: float       # when the worker took the segment, before copying its inputs
    end_s: float
    copy_s: float        # of end_s - start_s, the time spent copying inputs from other devices


@dataclass
class _Request:
    index: int
    future: Future
    inputs: list[Any] | None                           # host tensors (None: ``prepare`` makes them)
    missing: list[int]                                 # per segment: producer segments not yet ended
    remaining: int                                     # segments not yet ended
    values: dict[int, Any] = field(default_factory=dict)             # op id -> tensor on its producer's device
    copies: dict[tuple[Any, str], Any] = field(default_factory=dict)  # (op id or ("in", k), device) -> copy
    held_on: dict[int, str] = field(default_factory=dict)            # op id -> the worker's device that made it,
                                                                     # where not its segment's planned device
    failed: bool = False
    on_finish: Callable[[], None] | None = None        # called once its future is set (run_many admits the next)
    prepare: Callable[[], list[Any]] | None = None     # makes ``inputs`` when a segment first reads them
    prepare_lock: threading.Lock = field(default_factory=threading.Lock)

    def host_inputs(self) -> list[Any]:
        """The request's input tensors on the host, made by the first segment that reads them (run_many)."""
        if self.inputs is None:
            with self.prepare_lock:
                if self.inputs is None:
                    assert self.prepare is not None
                    self.inputs = self.prepare()
        return self.inputs

    def finish(self) -> None:
        """Call ``on_finish`` once (its future holds the outputs or the exception by now)."""
        hook, self.on_finish = self.on_finish, None
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 (the worker that calls it must keep serving)
                log.exception("the end-of-request hook of request %d failed", self.index)


@dataclass
class _Worker:
    device: str
    runtime_device: Any
    threads: int | None
    cores: tuple[int, ...]                                        # the worker's pool is pinned there (empty: any)
    affinity: tuple[int, ...] = ()                                # the cores its thread may run on, once started
    stream: Any = None                                            # a CUDA worker's stream
    vm: Any = None                                                # its relax.VirtualMachine (used by it alone)
    copies: int = 0                                               # tensors it copied to its device
    heap: list[tuple[int, int]] = field(default_factory=list)     # (request index, segment id)
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    idle: bool = False                                            # waiting for work (the runtime's lock held)
    woken: int = 0                                                # pushes that woke it since it last took work
    busy_until_us: float = 0.0                                    # cross-device sharing: its segment's predicted end


def start_worker(worker: _Worker, build: Any, functions: Sequence[Any], on_cuda: bool) -> dict[int, Any]:
    """In the worker's own thread: size (and pin) its TVM pool, give a CUDA worker its own stream, and load its
    VM with the segment functions it may run; returns segment id -> callable (the VM lives on in them)."""
    import tvm

    if worker.threads is not None:
        configure_pool(tvm.get_global_func("runtime.config_threadpool"), worker.threads, worker.cores)
    if hasattr(os, "sched_getaffinity"):
        worker.affinity = tuple(sorted(os.sched_getaffinity(0)))     # this thread's cores (Linux)
    if on_cuda:                   # its own stream; segments end with a sync of that stream
        worker.stream = worker.runtime_device.create_raw_stream()
        worker.runtime_device.set_raw_stream(worker.stream)
    worker.vm, by_name = new_virtual_machine(build.gpu_executable if on_cuda else build.executable,
                                             worker.runtime_device, [f.name for f in functions])
    return {f.segment: by_name[f.name] for f in functions}


def _copy(value: Any, device: Any) -> Any:
    if hasattr(value, "copyto"):
        return value.copyto(device)
    return [_copy(v, device) for v in value]          # a tuple-valued op output


def _flatten(value: Any) -> list[Any]:
    if hasattr(value, "numpy"):
        return [value]
    return [leaf for item in value for leaf in _flatten(item)]
