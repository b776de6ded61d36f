"""A segment build on disk: ``segments.so`` (every segment function), ``segments_gpu.so`` (those compiled for
CUDA, when there are any) and ``segments.json`` (the program, inputs, devices and cross-device sharing table) in a
compiled model's directory, written by :func:`export_segments` and read back by :func:`load_segments`
(:mod:`tvm_passes.segment_build` makes the build)."""
from __future__ import annotations

import json
from pathlib import Path

import tvm

from hetpart.errors import BuildError, SchemaError
from tvm_passes.native_log import native_output_to_log
from tvm_passes.segment_build import SegmentBuild, SegmentProgram

__all__ = ["SEGMENTS_GPU_LIBRARY", "SEGMENTS_LIBRARY", "SEGMENTS_MANIFEST", "export_segments", "load_segments"]

SEGMENTS_LIBRARY = "segments.so"
SEGMENTS_GPU_LIBRARY = "segments_gpu.so"
SEGMENTS_MANIFEST = "segments.json"


def export_segments(build: SegmentBuild, out_dir: str | Path) -> Path:
    """Write ``segments.so`` (all segment functions) and ``segments.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with native_output_to_log():
            build.executable.export_library(str(out / SEGMENTS_LIBRARY))
    except Exception as exc:  # TVM raises its own error types
        raise BuildError(f"export_library to {out / SEGMENTS_LIBRARY} failed: {type(exc).__name__}: {exc}") from exc
    if build.gpu_executable is not None:
        try:
            with native_output_to_log():
                build.gpu_executable.export_library(str(out / SEGMENTS_GPU_LIBRARY))
        except Exception as exc:  # TVM raises its own error types
            raise BuildError(f"export_library to {out / SEGMENTS_GPU_LIBRARY} failed: {type(exc).__name__}: "
                             f"{exc}") from exc
    (out / SEGMENTS_MANIFEST).write_text(json.dumps({"program": build.program.to_dict(),
                                                     "inputs": list(build.input_specs), "emulated": build.emulated,
                                                     "build_time_s": build.build_time_s,
                                                     "devices": list(build.devices),
                                                     "gpu_library": SEGMENTS_GPU_LIBRARY
                                                     if build.gpu_executable is not None else None,
                                                     "sharing": build.sharing}, indent=1))
    return out


def load_segments(directory: str | Path) -> SegmentBuild:
    """Load what :func:`export_segments` wrote."""
    path = Path(directory)
    manifest = path / SEGMENTS_MANIFEST
    if not manifest.exists():
        raise SchemaError(f"{path} holds no segment build ({SEGMENTS_MANIFEST} is missing)")
    try:
        data = json.loads(manifest.read_text())
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{manifest} is not valid JSON: {exc}") from exc
    try:
        with native_output_to_log():
            executable = tvm.runtime.load_module(str(path / SEGMENTS_LIBRARY))
    except Exception as exc:  # TVM raises its own error types
        raise BuildError(f"cannot load {path / SEGMENTS_LIBRARY}: {exc}") from exc
    gpu_executable = None
    if data.get("gpu_library"):
        try:
            with native_output_to_log():
                gpu_executable = tvm.runtime.load_module(str(path / data["gpu_library"]))
        except Exception as exc:  # TVM raises its own error types
            raise BuildError(f"cannot load {path / data['gpu_library']} (its GPU segments need CUDA): {exc}") from exc
    return SegmentBuild(executable, SegmentProgram.from_dict(data["program"]), tuple(data["inputs"]),
                        emulated=bool(data["emulated"]), build_time_s=float(data.get("build_time_s", 0.0)),
                        devices=tuple(data.get("devices", ())), gpu_executable=gpu_executable,
                        sharing=data.get("sharing"))
