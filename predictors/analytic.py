"""Analytic GPU latency model: roofline + launch overhead from datasheet figures (no measurement behind it).

For a kernel of kind ``k`` with ``flops`` and ``bytes = bytes_read + bytes_written``:

    latency_us = launch_overhead_us + 1e6 * max(flops / (peak_flops_per_s * compute_eff[k]),
                                                bytes / (bandwidth_bytes_per_s * memory_eff[k]))

Peak FP32 throughput, DRAM bandwidth, launch overhead and the host link come from
:data:`hetpart.devices.GPU_PRESETS` (public datasheets, cited there). The per-kind efficiencies below are
**assumptions**, not measurements: round figures for untuned-to-moderately-tuned TVM/DLight kernels (dense
convolutions and matmuls reach a fair share of peak; depthwise convolutions, pools, reductions and elementwise
kernels are memory bound). Every number this model produces is labelled ``source="analytic"``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from hetpart.devices import GPU_PRESETS, DeviceSpec, Link, gpu_from_preset, preset_links
from hetpart.errors import PredictorError, UnknownDeviceError
from hetpart.graph import OpNode
from predictors.context import ContextTerms
from predictors.features import KINDS, kernel_kind

# (compute efficiency, memory-bandwidth efficiency) per kernel kind — ASSUMED, not measured.
ASSUMED_EFFICIENCY: dict[str, tuple[float, float]] = {
    "conv2d": (0.50, 0.70),
    "depthwise_conv2d": (0.15, 0.60),
    "matmul": (0.60, 0.70),
    "pool": (0.20, 0.60),
    "elementwise": (0.20, 0.75),
    "reduction": (0.15, 0.50),
    "data_movement": (0.10, 0.60),
    "other": (0.10, 0.40),
}


class AnalyticGpuModel:
    """Roofline latency of kernels on a GPU preset; same ``predict(nodes)`` interface as a fitted predictor."""

    source = "analytic"

    def __init__(self, preset: str = "p2200", efficiencies: Mapping[str, tuple[float, float]] | None = None,
                 device: str = "gpu"):
        key = preset.lower()
        if key not in GPU_PRESETS:
            raise UnknownDeviceError(f"unknown GPU preset {preset!r}; known presets: {', '.join(sorted(GPU_PRESETS))}")
        self.preset = GPU_PRESETS[key]
        self.device = device
        self.efficiencies = dict(ASSUMED_EFFICIENCY)
        self.efficiencies.update(efficiencies or {})
        for kind, (compute, memory) in self.efficiencies.items():
            if kind not in KINDS or not (0 < compute <= 1 and 0 < memory <= 1):
                raise PredictorError(f"efficiency for {kind!r} must be a known kind ({', '.join(KINDS)}) with both "
                                     f"factors in (0, 1]; found ({compute}, {memory})")
        self.context = ContextTerms(0.0, 0.0)  # the launch overhead is already inside every kernel's latency
        self.target = {"kind": "cuda", "arch": self.preset.arch}

    def predict(self, nodes: Sequence[OpNode]) -> np.ndarray:
        """Latency (µs) of each kernel; monotone non-decreasing in its FLOPs and in its bytes."""
        out = np.empty(len(nodes))
        for i, node in enumerate(nodes):
            compute_eff, memory_eff = self.efficiencies[kernel_kind(node)]
            compute_s = node.flops / (self.preset.peak_flops_per_s * compute_eff)
            memory_s = (node.bytes_read + node.bytes_written) / (self.preset.memory_bandwidth_bytes_per_s
                                                                * memory_eff)
            out[i] = self.preset.launch_overhead_us + 1e6 * max(compute_s, memory_s)
        return out

    def device_spec(self) -> DeviceSpec:
        return gpu_from_preset(self.preset.name, name=self.device)

    def links(self, cpu: str = "cpu") -> tuple[Link, Link]:
        """Host<->GPU copy links (latency + bytes / bandwidth) from the preset's host interface."""
        return preset_links(self.preset.name, cpu=cpu, gpu=self.device)

    def provenance(self) -> dict[str, Any]:
        return {"device": self.device, "source": self.source, "preset": self.preset.name,
                "citation": self.preset.citation, "peak_flops_per_s": self.preset.peak_flops_per_s,
                "memory_bandwidth_bytes_per_s": self.preset.memory_bandwidth_bytes_per_s,
                "launch_overhead_us": self.preset.launch_overhead_us,
                "efficiencies_assumed_not_measured": {k: list(v) for k, v in self.efficiencies.items()}}
