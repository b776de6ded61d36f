"""Load and run a compiled hetpart model directory (``model.so`` + ``manifest.json`` + ``plan.json``).

    model = hetpart.load("out/resnet18")
    (logits,) = model(x)                  # positional numpy arrays, or model(input=x) by name

Without CUDA, a library built with an emulated GPU runs its "GPU" part on a second CPU device; the object
says so (``model.emulated``) and so does its ``repr``.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from hetpart.errors import BuildError, SchemaError, UsageError
from hetpart.driver.inputs import check_inputs
from hetpart.threads import ensure_tvm_threads
from tvm_passes.host_tensors import to_host_tensor, to_numpy
from tvm_passes.virtual_machine import new_virtual_machine

log = logging.getLogger(__name__)


class CompiledRuntime:
    """A loaded executable; call it with numpy arrays, get a list of numpy arrays back."""

    def __init__(self, directory: str | Path):
        ensure_tvm_threads()
        import tvm
        from tvm_passes.artifact import MANIFEST_NAME, BuildManifest

        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST_NAME
        if not manifest_path.exists():
            raise SchemaError(f"{self.directory} is not a compiled hetpart model: {MANIFEST_NAME} is missing "
                              "(create one with `hetpart compile MODEL -o DIR`)")
        try:
            self.manifest = BuildManifest.from_dict(json.loads(manifest_path.read_text()))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{manifest_path} is not valid JSON: {exc}") from exc
        library = self.directory / self.manifest.library
        if any(d["runtime"] == "cuda" for d in self.manifest.devices):
            if not tvm.cuda(0).exist:
                raise BuildError(f"{library.name} was built for a real CUDA GPU, and this machine has none; "
                                 "recompile with the GPU emulated (the default without CUDA) to run it here")
        from tvm_passes.native_log import native_output_to_log

        try:
            with native_output_to_log():
                self._executable = tvm.runtime.load_module(str(library))
        except Exception as exc:
            raise BuildError(f"cannot load {library}: {exc}") from exc
        self._tvm = tvm
        self.index_bounds = recorded_index_bounds(self.directory)
        self._vm = None
        self._main = None

    @property
    def emulated(self) -> bool:
        return bool(self.manifest.emulated)

    @property
    def input_names(self) -> list[str]:
        return [str(i["name"]) for i in self.manifest.inputs]

    def __repr__(self) -> str:
        devices = ", ".join(f"{d['name']}={d['runtime']}:{d['index']}" for d in self.manifest.devices)
        return (f"CompiledRuntime({self.directory}, devices [{devices}]"
                f"{', GPU EMULATED on CPU' if self.emulated else ''})")

    def __call__(self, *args: Any, **named: Any) -> list[np.ndarray]:
        arrays = check_inputs(self.manifest.inputs, args, named, self.index_bounds)
        if self._vm is None:  # one VM per runtime object; a VM is not thread-safe (share the directory instead)
            devices = self.manifest.runtime_devices()
            self._vm, _ = new_virtual_machine(self._executable, devices)
            self._main = self.manifest.main_caller(self._vm)   # uploads GPU weights once, then calls main
        host = self._tvm.cpu(0)
        result = self._main(*[to_host_tensor(a, host) for a in arrays])
        return [to_numpy(t) for t in _flatten(result)]




def _flatten(result: Any) -> list[Any]:
    if hasattr(result, "numpy"):
        return [result]
    out: list[Any] = []
    for item in result:
        out.extend(_flatten(item))
    return out


MODES = ("sequential", "tasks")


def recorded_index_bounds(directory: str | Path) -> dict[str, int]:
    """The table length of each input that indexes a table (``hetpart.driver.check.index_input_bounds``), as the
    compile recorded it in compile.json; empty for an output written before it was recorded."""
    from hetpart.driver.compiler import COMPILE_INFO

    path = Path(directory) / COMPILE_INFO
    if not path.exists():
        return {}
    try:
        return {str(k): int(v) for k, v in json.loads(path.read_text()).get("index_bounds", {}).items()}
    except (OSError, json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        log.warning("%s cannot be read (%s): token ids are not checked against their tables; compile again to "
                    "rewrite it", path, exc)
        return {}


def load(directory: str | Path, mode: str = "sequential", **task_options: Any) -> Any:
    """Load a directory written by ``hetpart compile`` / ``CompiledModel.save``.

    ``mode="sequential"``: one VM runs the whole heterogeneous executable (``model.so``) on the calling thread.
    ``mode="tasks"``: the plan's segments (``segments.so``, written by ``hetpart compile --segments``) run on one
    worker thread per device (:class:`hetpart.driver.task_runtime.TaskRuntime`; ``task_options`` go to it); close it
    when done (it is a context manager)."""
    if mode == "sequential":
        return CompiledRuntime(directory)
    if mode != "tasks":
        raise UsageError(f"mode must be one of {list(MODES)}; found {mode!r}")
    from hetpart.driver.task_runtime import TaskRuntime
    from tvm_passes.segment_artifact import SEGMENTS_MANIFEST, load_segments

    if not (Path(directory) / SEGMENTS_MANIFEST).exists():
        raise UsageError(f"{directory} holds no segments for the task runtime; compile with --segments (Python: "
                         "compile(..., segments=True)) or load it with mode='sequential'")
    task_options.setdefault("index_bounds", recorded_index_bounds(directory))
    return TaskRuntime(load_segments(directory), **task_options)
