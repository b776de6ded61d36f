"""Errors of the torch side of training partitioning (all derive from :class:`hetpart.errors.HetpartError`)."""
from __future__ import annotations

from hetpart.errors import HetpartError, InvalidPlanError


class UnitMappingError(HetpartError, ValueError):
    """A model cannot be cut into module units: a unit is called twice, a parameter is shared by two units,
    units interleave in the forward pass, or the model cannot be traced."""


class CalibrationError(HetpartError, RuntimeError):
    """Timing forward and backward passes gave no usable ratio (e.g. a backward time that is not positive)."""


class TrainingPlanFileError(InvalidPlanError):
    """A training plan file is malformed, or its plan cannot run as a torch pipeline (replicated stages, a stage
    layout the schedule does not accept, a batch that does not split into the micro-batches)."""


class PipelineRunError(HetpartError, RuntimeError):
    """A pipeline run failed in one of its processes, or did not finish in time."""
