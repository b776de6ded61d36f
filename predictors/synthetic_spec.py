"""What a synthetic single-kernel workload is: :class:`SyntheticSpec` names one op and its parameters.

Plain data, without TVM: the host calibration's suite (:mod:`predictors.host_calibration`) is a tuple of specs, and
the profiler builds and times them (:func:`predictors.profiling.synthetic_modules.build_synthetic_module`);
which specs the profiling campaign measures is :mod:`predictors.profiling.sampling`'s business.
"""
from __future__ import annotations

from dataclasses import dataclass

from hetpart.errors import PredictorError


@dataclass(frozen=True)
class SyntheticSpec:
    """A single-kernel workload: ``op`` in conv2d | conv2d_residual | depthwise_conv2d | matmul | max_pool2d |
    add_relu | gates | layer_norm | softmax (``conv2d_residual``: a conv2d whose epilogue also adds a residual
    input, as in ResNet's blocks)."""

    op: str
    items: tuple[tuple[str, int], ...] = ()     # sorted (parameter, value) pairs; hashable

    @classmethod
    def of(cls, op: str, **params: int) -> "SyntheticSpec":
        return cls(op, tuple(sorted((k, int(v)) for k, v in params.items()))).validate()

    @property
    def params(self) -> dict[str, int]:
        return dict(self.items)

    @property
    def name(self) -> str:
        return "syn_" + self.op + "_" + "_".join(f"{k}{v}" for k, v in self.items)

    def validate(self) -> "SyntheticSpec":
        conv = {"n", "ci", "co", "hw", "k", "stride"}
        need = {"conv2d": conv, "conv2d_residual": conv, "depthwise_conv2d": {"n", "c", "hw", "k", "stride"},
                "matmul": {"m", "k", "n"}, "max_pool2d": {"n", "c", "hw", "k", "stride"},
                "add_relu": {"n", "c", "hw"}, "gates": {"m", "n", "t"}, "layer_norm": {"m", "n"},
                "softmax": {"m", "n"}}
        if self.op not in need or set(self.params) != need[self.op]:
            raise PredictorError(f"synthetic spec {self.op!r} needs parameters {sorted(need.get(self.op, []))}; "
                                 f"found {sorted(self.params)}")
        if any(int(v) < 1 for v in self.params.values()):
            raise PredictorError(f"synthetic spec {self.name}: every parameter must be >= 1")
        return self
