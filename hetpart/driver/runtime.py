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
from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.errors import BuildError, InputMismatchError, SchemaError
from hetpart.threads import ensure_tvm_threads

log = logging.getLogger(__name__)


class CompiledRuntime:
    """A loaded executable; call it with numpy arrays, get a list of numpy arrays back."""

    def __init__(self, directory: str | Path):
        ensure_tvm_threads()
        import tvm
        from tvm import relax

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
        self._relax = relax
        self._tvm = tvm
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
        arrays = check_inputs(self.manifest.inputs, args, named)
        if self._vm is None:  # one VM per runtime object; a VM is not thread-safe (share the directory instead)
            devices = self.manifest.runtime_devices()
            self._vm = self._relax.VirtualMachine(self._executable, devices)
            self._main = self.manifest.main_caller(self._vm)   # uploads GPU weights once, then calls main
        host = self._tvm.cpu(0)
        result = self._main(*[self._tvm.runtime.tensor(a, host) for a in arrays])
        return [np.asarray(t.numpy()) for t in _flatten(result)]



def check_inputs(specs: Sequence[Mapping[str, Any]], args: Sequence[Any],
                 named: Mapping[str, Any]) -> list[np.ndarray]:
    """Model inputs as contiguous numpy arrays of the compiled shapes and dtypes, given positionally or by name
    (a same-kind dtype is cast, e.g. float64 -> float32)."""
    names = [str(s["name"]) for s in specs]
    if args and named:
        raise InputMismatchError("pass inputs either positionally or by name, not both")
    if named:
        unknown, missing = sorted(set(named) - set(names)), [n for n in names if n not in named]
        if unknown or missing:
            raise InputMismatchError(f"inputs must be exactly {names}; unknown {unknown}, missing {missing}")
        args = [named[n] for n in names]
    if len(args) != len(specs):
        raise InputMismatchError(f"the model takes {len(specs)} input(s) {names}; got {len(args)}")
    arrays = []
    for spec, value in zip(specs, args):
        array = np.asarray(value)
        shape, dtype = tuple(int(d) for d in spec["shape"]), str(spec["dtype"])
        if array.shape != shape:
            raise InputMismatchError(f"input {spec['name']!r} must have shape {list(shape)} (compiled for it); "
                                     f"got {list(array.shape)}. Recompile with --input-shape to change it")
        if array.dtype != np.dtype(dtype):
            if not np.can_cast(array.dtype, dtype, casting="same_kind"):
                raise InputMismatchError(f"input {spec['name']!r} must be {dtype}; got {array.dtype}")
            array = array.astype(dtype)
        arrays.append(np.ascontiguousarray(array))
    return arrays

def _flatten(result: Any) -> list[Any]:
    if hasattr(result, "numpy"):
        return [result]
    out: list[Any] = []
    for item in result:
        out.extend(_flatten(item))
    return out


def load(directory: str | Path) -> CompiledRuntime:
    """Load a directory written by ``hetpart compile`` / ``CompiledModel.save``."""
    return CompiledRuntime(directory)
