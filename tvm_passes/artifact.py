"""What a heterogeneous build produces: the executable, its manifest (devices, I/O signature, emulation) and
the exported directory (``model.so`` + ``manifest.json``). Read by ``hetpart.driver.runtime``."""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import tvm
from tvm import relax

from hetpart.errors import BuildError, InputMismatchError, SchemaError
from tvm_passes.host_tensors import to_host_tensor, to_numpy
from tvm_passes.native_log import native_output_to_log
from tvm_passes.virtual_machine import new_virtual_machine

logger = logging.getLogger(__name__)

MANIFEST_SCHEMA_VERSION = 1
LIBRARY_NAME = "model.so"
MANIFEST_NAME = "manifest.json"
WEIGHTS_FUNCTION = "hetpart_upload_weights"


# ---------------------------------------------------------------------------------------------- manifest
@dataclass(frozen=True)
class BuildManifest:
    """What a built library needs to be run: its vdevices (in VM device-list order) and its I/O signature."""

    devices: tuple[Mapping[str, Any], ...]   # per vdevice: name kind target runtime index emulated used
    inputs: tuple[Mapping[str, Any], ...]    # name, shape, dtype
    outputs: tuple[Mapping[str, Any], ...]   # name, shape, dtype
    emulated: bool                           # True when a used GPU vdevice was mapped to a CPU device
    weights_function: str | None = None      # if set: call it once, pass its result as main's last argument
    library: str = LIBRARY_NAME
    build_time_s: float = 0.0
    notes: tuple[str, ...] = ()
    schema_version: int = MANIFEST_SCHEMA_VERSION

    def __post_init__(self) -> None:
        for key in ("devices", "inputs", "outputs", "notes"):
            object.__setattr__(self, key, tuple(getattr(self, key)))

    def validate(self) -> "BuildManifest":
        if self.schema_version != MANIFEST_SCHEMA_VERSION:
            raise SchemaError(f"manifest schema_version must be {MANIFEST_SCHEMA_VERSION}; found {self.schema_version}")
        if not self.devices or self.devices[0]["runtime"] != "cpu":
            raise SchemaError(f"manifest device 0 must be the host CPU; found {list(self.devices)[:1]}")
        if self.emulated != any(d["emulated"] and d["used"] for d in self.devices):
            raise SchemaError("manifest 'emulated' must say whether any used device is emulated")
        return self

    def runtime_devices(self) -> list[tvm.runtime.Device]:
        """The device list to create a ``relax.VirtualMachine`` with (index = vdevice index)."""
        return [tvm.device(d["runtime"], int(d["index"])) for d in self.devices]

    def main_caller(self, vm: relax.VirtualMachine) -> Callable[..., Any]:
        """``f(*input_tensors)`` calling ``main`` on ``vm``, with the weights uploaded once (if the build has any)."""
        if self.weights_function is None:
            return vm["main"]
        weights = vm[self.weights_function]()
        return lambda *inputs: vm["main"](*inputs, weights)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "library": self.library, "emulated": self.emulated,
                "weights_function": self.weights_function,
                "build_time_s": self.build_time_s, "devices": [dict(d) for d in self.devices],
                "inputs": [dict(i) for i in self.inputs], "outputs": [dict(o) for o in self.outputs],
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BuildManifest":
        try:
            return cls(devices=data["devices"], inputs=data["inputs"], outputs=data["outputs"],
                       emulated=data["emulated"], weights_function=data["weights_function"],
                       library=data["library"], build_time_s=data["build_time_s"],
                       notes=data.get("notes", ()), schema_version=data["schema_version"]).validate()
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"build manifest is malformed ({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class BuildResult:
    """A compiled heterogeneous executable, the final IRModule it came from, and its manifest."""

    executable: Any                       # tvm.runtime.Executable (relax VM)
    lowered: tvm.IRModule                 # the module handed to tvm.compile (scheduled PrimFuncs, targets bound)
    manifest: BuildManifest
    library_path: Path | None = None      # set when exported
    manifest_path: Path | None = None
    cpu_schedules_applied: bool = False
    stats: Mapping[str, Any] = field(default_factory=dict)
    _per_thread: threading.local = field(default_factory=threading.local, init=False, repr=False, compare=False)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run ``main`` (devices from the manifest); returns every output as numpy, on the host. Each calling thread
        gets one VM, made at its first call (a VM is not thread-safe; weights are uploaded once per VM)."""
        expected = [(tuple(i["shape"]), i["dtype"]) for i in self.manifest.inputs]
        found = [(tuple(np.shape(x)), str(np.asarray(x).dtype)) for x in inputs]
        if found != expected:
            raise InputMismatchError(f"main takes inputs (shape, dtype) {expected}; found {found}")
        state = self._per_thread
        if getattr(state, "main", None) is None:
            state.vm, _ = new_virtual_machine(self.executable, self.manifest.runtime_devices())
            state.main = self.manifest.main_caller(state.vm)
        host = tvm.cpu(0)
        result = state.main(*[to_host_tensor(np.asarray(x), host) for x in inputs])
        return [to_numpy(t) for t in _flatten_outputs(result)]

    def cuda_source(self) -> str:
        """The generated CUDA C++ source ("" when the build has no CUDA module)."""
        sources = [m.inspect_source() for m in _all_modules(self.executable.mod) if m.kind == "cuda"]
        return "\n".join(dict.fromkeys(sources))   # the same module can be reachable twice


def _flatten_outputs(result: Any) -> list[Any]:
    if isinstance(result, (list, tuple)) or type(result).__name__ in ("Array", "List"):
        return [t for r in result for t in _flatten_outputs(r)]
    return [result]


def _all_modules(mod: Any) -> list[Any]:
    found, stack = [], [mod]
    while stack:
        m = stack.pop()
        found.append(m)
        stack.extend(m.imports)
    return found


def export(result: BuildResult, out_dir: str | Path) -> BuildResult:
    """Write ``model.so`` (the one artifact) and ``manifest.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    library_path, manifest_path = out / result.manifest.library, out / MANIFEST_NAME
    try:
        with native_output_to_log():
            result.executable.export_library(str(library_path))
    except Exception as exc:  # TVM raises its own error types
        raise BuildError(f"export_library to {library_path} failed: {type(exc).__name__}: {exc}") from exc
    manifest_path.write_text(json.dumps(result.manifest.to_dict(), indent=1))
    return BuildResult(result.executable, result.lowered, result.manifest, library_path, manifest_path,
                       result.cpu_schedules_applied, result.stats)
