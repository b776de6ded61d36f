"""A task runtime: a plan's segments run by one worker thread per device, many requests in flight.

    with TaskRuntime.from_compiled(compiled) as rt:          # compiled = hetpart.compile(...)
        (logits,) = rt(x)                                     # one request
        future = rt.submit(x)                                 # concurrent.futures.Future -> list[np.ndarray]
        outputs, latency_us = rt.run_many([[x0], [x1], ...], max_in_flight=8)

Its model is ``hetpart.simulate_requests`` (``RuntimeModel(copies="consumer")``); docs/runtime_model.md describes
both, with the measurements behind each rule. In short:

- every segment (``hetpart.segments.segment_plan``, or one per time-slice task, ``hetpart.driver.task_segments``) is
  one Relax function of ONE executable (``tvm_passes.segment_build``; GPU segments compiled for CUDA form a second);
- one worker thread per device owns its own ``relax.VirtualMachine`` (a VM must never be called from two threads).
  CPU devices (core groups of one host) all run on ``tvm.cpu(0)`` and pass tensors without copies; without CUDA
  the GPU is emulated by ``tvm.cpu(1)``; with CUDA the GPU worker runs on its own stream, synchronised after every
  segment;
- a segment is ready when every segment it reads has ended; its worker copies what lies on another device's memory
  (once per tensor, destination and request), then calls it. A free worker takes its ready segment with the lowest
  (request index, segment id); the worker that ends a request reads its outputs back;
- equal CPU core groups share work: a worker with nothing of its own runs a lone request's next segment itself
  (``continuation``) or takes the other groups' ready segments (``sharing``);
- with segments built for every device (``hetpart compile --cross-device-sharing``) a free worker also takes a busy
  device's ready segment when the recorded table predicts it ends it sooner (``cross_device_sharing``,
  ``hetpart.cross_sharing``, ``hetpart.driver.task_cross``);
- an exception in a segment (or a bad input) fails only that request's future; the runtime keeps serving;
- ``threads_per_device`` sizes each worker's TVM pool (a CPU device with cores gets one thread per core, pinned);
  ``trace=True`` records every segment run (:class:`SegmentRun`) in ``self.trace``.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from hetpart.cross_sharing import SharingTable
from hetpart.driver.task_cross import CrossSharing
from hetpart.driver.task_devices import device_layout
from hetpart.errors import BuildError, InputMismatchError, UsageError
from hetpart.driver.inputs import check_inputs
from hetpart.driver.task_feed import RequestFeed
from hetpart.driver.task_workers import SegmentRun, _copy, _flatten, _Request, _Worker, start_worker
from hetpart.threads import ensure_tvm_threads
from tvm_passes.host_tensors import to_host_tensor, to_numpy

if TYPE_CHECKING:
    from hetpart.segments import Segmentation

log = logging.getLogger(__name__)

__all__ = ["SegmentRun", "TaskRuntime"]


class TaskRuntime:
    """Runs a :class:`tvm_passes.segment_build.SegmentBuild` with one worker thread per device."""

    def __init__(self, build: Any, *, runtime_devices: Mapping[str, Any] | None = None, host: str | None = None,
                 threads_per_device: Mapping[str, int] | None = None, start_timeout_s: float = 120.0,
                 trace: bool = False, index_bounds: Mapping[str, int] | None = None, continuation: bool = True,
                 sharing: bool = True, cross_device_sharing: bool | None = None):
        ensure_tvm_threads()          # before TVM loads (device_layout imports it)
        self.build = build
        self.program = build.program
        self.index_bounds = dict(index_bounds or {})      # inputs indexing a table: its rows (check.index_input_bounds)
        recorded = list(getattr(build, "devices", ()) or ())
        self.host = host or (recorded[0]["name"] if recorded else "cpu")
        functions = self.program.functions
        # continuation and work sharing: a worker may run the segments of interchangeable CPU core groups (the same
        # memory, as many cores each)
        layout = device_layout(build, self.host, [f.device for f in functions], runtime_devices, threads_per_device,
                               peers_wanted=continuation or sharing)
        names, runtime_devices, cores = layout.names, layout.runtime_devices, layout.cores
        self._cuda_names, self._memory_of, self._peers = layout.cuda_names, layout.memory_of, layout.peers
        self.trace: list[SegmentRun] | None = [] if trace else None
        self._producers = [sorted({self.program.segment_of[op] for op in f.op_params}) for f in functions]
        self._consumers: list[list[int]] = [[] for _ in functions]
        for k, producers in enumerate(self._producers):
            for p in producers:
                self._consumers[p].append(k)
        self._continuation, self._sharing = continuation, sharing and bool(self._peers)
        self._lock = threading.Lock()
        self._conds: dict[str, threading.Condition] = {}
        self._workers: dict[str, _Worker] = {}
        self._requests: dict[int, _Request] = {}
        self._across: CrossSharing | None = None        # cross-device sharing (segments built for every device)
        if cross_device_sharing is None:
            cross_device_sharing = sharing and build.sharing is not None
        if cross_device_sharing:
            if build.sharing is None:
                raise UsageError("cross-device sharing needs every segment built for every device; compile with "
                                 "--cross-device-sharing (partition option cross_device_sharing=True)")
            self._across = CrossSharing(SharingTable.from_dict(build.sharing), [f.device for f in functions],
                                        self._workers, self._peers, self._conds, self._requests)
        self._counter = itertools.count()
        self._closing = False
        self._started = threading.Event()
        for name in names:
            if not any(f.device == name for f in functions) and name != self.host and not (
                    self._sharing and name in self._peers) and self._across is None:   # idle, it may still take work
                continue
            worker = _Worker(name, runtime_devices[name], layout.threads.get(name), cores.get(name, ()))
            self._workers[name] = worker
            self._conds[name] = threading.Condition(self._lock)
            worker.thread = threading.Thread(target=self._loop, args=(worker,), daemon=True,
                                             name=f"hetpart-{name}-worker")
            worker.thread.start()
        for worker in self._workers.values():
            if not worker.ready.wait(start_timeout_s) or worker.error is not None:
                self.close()
                raise BuildError(f"the {worker.device} worker could not start its VM on {worker.runtime_device}: "
                                 f"{worker.error or 'timed out'}")
        self._started.set()
        log.info("task runtime: %d segments on %s", len(functions),
                 ", ".join(f"{w.device}={w.runtime_device}" for w in self._workers.values()))

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_module(cls, mod: Any, graph: Any, plan: Any, *, gpu_devices: Sequence[str] = ("gpu",),
                    tuning_database: Any = None, devices: Sequence[Mapping[str, Any]] = (),
                    segmentation: Segmentation | None = None, **kwargs: Any) -> "TaskRuntime":
        """Build the segments of the op-level ``plan`` of ``graph`` (the OpGraph of ``mod["main"]``) and start
        (:func:`hetpart.driver.task_build.segments_of_module`)."""
        from hetpart.driver.check import index_input_bounds
        from hetpart.driver.task_build import segments_of_module

        kwargs.setdefault("index_bounds", index_input_bounds(graph))
        return cls(segments_of_module(mod, graph, plan, gpu_devices=gpu_devices, tuning_database=tuning_database,
                                      devices=devices, segmentation=segmentation), **kwargs)

    @classmethod
    def from_compiled(cls, compiled: Any, module: Any = None, **kwargs: Any) -> "TaskRuntime":
        """A task runtime for a :class:`hetpart.driver.compiler.CompiledModel` (its op-level plan; ``module``: the
        imported Relax module, re-imported from the recorded ONNX file by default;
        :func:`hetpart.driver.task_build.segments_of_compiled`)."""
        from hetpart.driver.check import index_input_bounds
        from hetpart.driver.task_build import segments_of_compiled

        kwargs.setdefault("index_bounds", index_input_bounds(compiled.op_graph))
        return cls(segments_of_compiled(compiled, module), **kwargs)

    # ------------------------------------------------------------------ public API
    @property
    def worker_cores(self) -> dict[str, tuple[int, ...]]:
        """The cores each device's worker thread may run on (as the OS reports them once it started)."""
        return {name: w.affinity for name, w in self._workers.items()}

    @property
    def runtime_devices(self) -> dict[str, Any]:
        """The TVM device each worker runs on (CPU devices share ``cpu(0)``: nothing is copied between them)."""
        return {name: w.runtime_device for name, w in self._workers.items()}

    @property
    def cross_device_sharing(self) -> bool:
        """Whether a free worker may take another device's segments (``hetpart.cross_sharing``)."""
        return self._across is not None

    @property
    def copies_made(self) -> int:
        """Tensors copied between devices so far (one per tensor, destination and request; none between CPUs)."""
        return sum(w.copies for w in self._workers.values())

    @property
    def input_specs(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.build.input_specs)

    def submit(self, *args: Any, **named: Any) -> Future:
        """Admit one request; its future gives the outputs (list of numpy arrays) or the request's exception."""
        future: Future = Future()
        try:
            arrays = check_inputs(self.input_specs, args, named, self.index_bounds)
        except InputMismatchError as exc:
            future.set_exception(exc)
            return future
        return self._submit_arrays(arrays, future)

    def __call__(self, *args: Any, **named: Any) -> list[np.ndarray]:
        return self.submit(*args, **named).result()

    def run_many(self, inputs_list: Sequence[Sequence[Any]], max_in_flight: int = 1
                 ) -> tuple[list[list[np.ndarray]], list[float]]:
        """Run every request (admitted in order, at most ``max_in_flight`` at a time: the worker that ends one
        admits the next, :class:`hetpart.driver.task_feed.RequestFeed`); returns the outputs in request order and
        each request's latency in µs (completion minus admission). Raises the first failed request's exception
        after all have finished."""
        if max_in_flight < 1:
            raise UsageError(f"max_in_flight must be >= 1; found {max_in_flight}")
        return RequestFeed(self._admit, inputs_list, max_in_flight).run()

    def _admit(self, inputs: Sequence[Any], future: Future, on_finish: Any) -> bool:
        """Admit one request of :meth:`run_many`; False when it failed at once (``future`` holds why). Its inputs
        are checked now and copied to the host tensors by the worker that first reads them (the calling thread
        admits a whole wave at once, while the workers run)."""
        try:
            arrays = check_inputs(self.input_specs, inputs, {}, self.index_bounds)
            self._submit_arrays(arrays, future, on_finish, deferred=True)
        except Exception as exc:  # noqa: BLE001 (bad inputs, a closed runtime: this request's failure only)
            future.set_exception(exc)
            return False
        return True

    def close(self) -> None:
        """Stop every worker, join its thread, and fail the requests still in flight."""
        with self._lock:
            self._closing = True
            for cond in self._conds.values():
                cond.notify_all()
            pending = list(self._requests.values())
            self._requests.clear()
        for worker in self._workers.values():
            if worker.thread is not None and worker.thread is not threading.current_thread():
                worker.thread.join()
        for request in pending:
            if not request.future.done():
                request.future.set_exception(UsageError("the task runtime was closed before this request ended"))
            request.finish()

    def __enter__(self) -> "TaskRuntime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def emulated(self) -> bool:
        """True when GPU segments run on an emulated CPU device."""
        return bool(self.build.emulated)

    def __repr__(self) -> str:
        devices = ", ".join(f"{w.device}={w.runtime_device}" for w in self._workers.values())
        return (f"TaskRuntime({len(self.program.functions)} segments, devices [{devices}]"
                f"{', GPU EMULATED on CPU' if self.build.emulated else ''})")

    # ------------------------------------------------------------------ scheduling
    def _submit_arrays(self, arrays: Sequence[np.ndarray], future: Future | None = None,
                       on_finish: Any = None, deferred: bool = False) -> Future:
        future = future or Future()
        host = self._workers[self.host].runtime_device

        def prepare() -> list[Any]:
            return [to_host_tensor(a, host) for a in arrays]

        with self._lock:
            if self._closing:
                raise UsageError("the task runtime is closed")
            index = next(self._counter)
            request = _Request(index, future, None if deferred else prepare(), [len(p) for p in self._producers],
                               len(self._producers), on_finish=on_finish, prepare=prepare)
            self._requests[index] = request
            for k, missing in enumerate(request.missing):
                if not missing:
                    self._push(index, k)
        return future

    def _push(self, index: int, segment: int) -> None:
        """Queue a ready segment (the lock is held): wake its device's worker, or, when that one is busy, an idle
        peer that may take it (work sharing between interchangeable CPU core groups)."""
        device = self.program.functions[segment].device
        owner = self._workers[device]
        heapq.heappush(owner.heap, (index, segment))
        target: _Worker | None = owner
        if not owner.idle:
            target = next((self._workers[p] for p in sorted(self._peers.get(device, ())) if self._workers[p].idle),
                          None) if self._sharing else None
        if target is None:                   # every worker that may run it is busy: the first free one takes it
            if self._across is not None:     # unless another device's idle worker is predicted to end it sooner
                self._across.offer(owner)
            return
        if target.idle:
            target.idle = False              # it will take a segment: the next push wakes another idle worker,
            target.woken += 1                # and no peer takes the one it comes for from under it
        self._conds[target.device].notify()

    def _peer_to_take_from(self, peers: list[_Worker]) -> _Worker | None:
        """Work sharing: the peer whose best ready segment comes first, None when no peer has one (lock held)."""
        if not self._sharing:
            return None
        ready = [p for p in peers if len(p.heap) > p.woken]       # not the segments its woken worker comes for
        return min(ready, key=lambda p: p.heap[0]) if ready else None

    def _loop(self, worker: _Worker) -> None:
        try:
            served = {worker.device} | self._peers.get(worker.device, set())
            mine = [f for f in self.program.functions if f.device in served
                    or (self._across is not None and self._across.can_run(worker.device, f.segment))]
            calls = start_worker(worker, self.build, mine, on_cuda=worker.device in self._cuda_names)
        except BaseException as exc:  # noqa: BLE001 (reported by the constructor)
            worker.error = exc
            worker.ready.set()
            return
        worker.ready.set()
        cond = self._conds[worker.device]
        peers: list[_Worker] | None = None
        while True:
            with cond:
                while True:
                    if peers is None and self._started.is_set():     # every worker exists once the runtime started
                        peers = [self._workers[p] for p in sorted(self._peers.get(worker.device, ()))
                                 if p in self._workers]
                    source = worker if worker.heap else self._peer_to_take_from(peers or [])
                    if source is None and self._across is not None:
                        source = self._across.owner_to_take_from(worker)
                    if source is not None or self._closing:
                        break
                    worker.idle, worker.woken = True, 0       # both set by the push that wakes it
                    cond.wait()
                if self._closing:
                    return
                worker.woken = 0                     # awake now: whatever it was woken for is its to take
                index, segment = heapq.heappop(source.heap)
                request = self._requests.get(index)
                if self._across is not None:
                    self._mark_started(worker, segment)
                    if source is worker:
                        self._across.offer(worker)       # the next segment queued here may go elsewhere
            if request is None or request.failed:
                continue
            next_segment: int | None = segment
            while next_segment is not None:         # a segment it took on by continuation runs right after
                if self._across is not None and next_segment != segment:     # taken on by continuation
                    self._mark_started(worker, next_segment)
                segment = next_segment
                try:
                    started = time.perf_counter()
                    copy_s = self._run_segment(request, segment, worker, calls[segment])
                    if self.trace is not None:
                        self.trace.append(SegmentRun(index, segment, worker.device, started, time.perf_counter(),
                                                     copy_s))
                except BaseException as exc:  # noqa: BLE001 (fails this request only)
                    self._fail(request, exc)
                    break
                next_segment = self._segment_done(request, segment, worker)

    def _mark_started(self, worker: _Worker, segment: int) -> None:
        planned = self.program.functions[segment].device
        assert self._across is not None
        self._across.started(worker, segment, taken=planned != worker.device
                             and planned not in self._peers.get(worker.device, ()))

    def _operand(self, request: _Request, key: Any, value: Any, source: str, worker: _Worker) -> Any:
        if self._memory_of[source] == self._memory_of[worker.device]:
            return value          # on its own device, or on another CPU device: the same memory, no copy
        cached = request.copies.get((key, worker.device))   # only this worker writes copies to its device
        if cached is None:
            cached = request.copies[(key, worker.device)] = _copy(value, worker.runtime_device)
            worker.copies += 1
        return cached

    def _run_segment(self, request: _Request, segment: int, worker: _Worker, call: Any) -> float:
        """Run ``segment`` of ``request`` on ``worker``; the seconds spent copying its inputs to the device."""
        fn = self.program.functions[segment]
        segment_of = self.program.segment_of
        inputs = request.host_inputs() if fn.input_params else []      # the request's copy of its inputs
        started = time.perf_counter()
        args = [self._operand(request, ("in", k), inputs[k], self.host, worker) for k in fn.input_params]
        args += [self._operand(request, op, request.values[op], request.held_on.get(
            op, self.program.functions[segment_of[op]].device), worker) for op in fn.op_params]
        copy_s = time.perf_counter() - started
        result = call(*args)
        if worker.stream is not None:     # the outputs are ready for other workers' copies once the stream is done
            worker.runtime_device.sync(worker.stream)
        for k, op in enumerate(fn.outputs):
            request.values[op] = result[k]
            if worker.device != fn.device:          # run by a peer core group or across devices: held there
                request.held_on[op] = worker.device
        return copy_s

    def _segment_done(self, request: _Request, segment: int, worker: _Worker) -> int | None:
        """Record that ``segment`` ended; queue the segments that became ready. Returns the one ``worker`` takes on
        itself (continuation: nothing of its own device is ready and a peer CPU core group's segment is), or None."""
        claimed = None
        with self._lock:
            if request.failed:
                return None
            peers = self._peers.get(worker.device, set()) if self._continuation else set()
            held = []
            for consumer in self._consumers[segment]:
                request.missing[consumer] -= 1
                if not request.missing[consumer]:
                    if self.program.functions[consumer].device in peers:
                        held.append(consumer)
                    else:
                        self._push(request.index, consumer)
            if held and not worker.heap and not self._closing:
                claimed = held.pop(0)
            for consumer in held:
                self._push(request.index, consumer)
            request.remaining -= 1
            finished = request.remaining == 0
            if finished:
                self._requests.pop(request.index, None)
        if finished:
            try:
                outputs = []
                for op, path in self.program.model_outputs:
                    value = request.values[op]
                    for i in path:
                        value = value[i]
                    outputs.extend(to_numpy(t) for t in _flatten(value))
            except BaseException as exc:  # noqa: BLE001
                request.future.set_exception(exc)
                request.finish()
                return None
            request.future.set_result(outputs)
            request.finish()
        return claimed

    def _fail(self, request: _Request, exc: BaseException) -> None:
        with self._lock:
            if request.failed:
                return
            request.failed = True
            self._requests.pop(request.index, None)
        log.warning("request %d failed: %s: %s", request.index, type(exc).__name__, str(exc)[:300])
        if not request.future.done():
            request.future.set_exception(exc)
        request.finish()
