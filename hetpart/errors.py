"""The hetpart error hierarchy.

Every error raised on purpose by hetpart derives from :class:`HetpartError`, and also from the built-in
exception a caller would naturally catch (``ValueError`` for bad values, ``KeyError`` for missing entries, ...).
Messages say what must hold, what was found, and how to fix it.
"""
from __future__ import annotations


class HetpartError(Exception):
    """Base class of all hetpart errors."""


class SchemaError(HetpartError, ValueError):
    """A serialised object (JSON) is malformed or has an unsupported ``schema_version``."""


class InvalidGraphError(HetpartError, ValueError):
    """An OpGraph violates an invariant (cycle, dangling id, non-topological ids, ...)."""


class ModelLoadError(HetpartError, ValueError):
    """A model file cannot be read (missing, truncated, not ONNX, ...)."""


class MissingInputShapeError(ModelLoadError):
    """A model input has symbolic or unknown dimensions and no shape was given for it."""


class UnsupportedOpError(HetpartError, NotImplementedError):
    """One or more operators cannot be imported or handled; the message lists every one with counts."""


class UnknownDeviceError(HetpartError, KeyError):
    """A device or preset name is not known."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class MissingCostError(HetpartError, KeyError):
    """A latency needed for a decision is not in the CostTable (it is never silently taken as 0)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidCostTableError(HetpartError, ValueError):
    """A CostTable has non-finite or negative entries, or does not match its graph."""


class InvalidPlanError(HetpartError, ValueError):
    """A Plan does not fit its graph (unassigned op, unknown device, violated pin, wrong model)."""


class PinError(InvalidPlanError):
    """A pin names no operator, or names a device that cannot run the pinned operator."""


class InfeasibleError(HetpartError, ValueError):
    """No valid schedule exists, e.g. the operators placed on a device do not fit in its memory."""


class PredictorError(HetpartError, ValueError):
    """A predictor is missing, unfitted, or was fitted for another device / feature schema."""


class ExtrapolationWarning(UserWarning):
    """A prediction was requested outside the predictor's training range; the input was clamped."""


class ProfileDatabaseError(HetpartError, RuntimeError):
    """The profile database is corrupt, foreign, or of an unsupported version."""


class HostRegimeError(HetpartError, RuntimeError):
    """The host runs at another speed than when a profile database was measured; mixing the two would corrupt it."""


class BuildError(HetpartError, RuntimeError):
    """Compiling a (partitioned) module failed."""


class InputMismatchError(HetpartError, ValueError):
    """Run-time inputs do not match the compiled model (names, shapes or dtypes)."""


class DegeneratePlanWarning(UserWarning):
    """Both devices were offered but the plan uses only one."""


class OutputDirError(HetpartError, FileExistsError):
    """An output path cannot be written without touching files hetpart did not write."""


class UsageError(HetpartError, ValueError):
    """A command-line or API argument is malformed or names an unknown choice."""


class InvalidClusterError(HetpartError, ValueError):
    """A training cluster spec is malformed, names an unknown device or link preset, or breaks an invariant."""


class InvalidStagePlanError(InvalidPlanError):
    """A training StagePlan does not fit its graph or cluster (ops missing or repeated, stages not contiguous, ...)."""


class StageInfeasibleError(InfeasibleError):
    """No split of the model into pipeline stages fits the devices (memory, unsupported ops, too few devices)."""


class StateLimitError(StageInfeasibleError):
    """The antichain DP would enumerate more ideals (states) than its configured limit."""


class ScheduleError(HetpartError, ValueError):
    """A pipeline schedule cannot be built or simulated for a StagePlan (shape, micro-batch count, deadlock)."""
