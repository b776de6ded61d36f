"""The training plan file (``hetpart train-plan -o plan.json``): a StagePlan plus what a torch run needs to rebuild
the model, its data and its stages in every process.

* :class:`ModelSource` names the model (a zoo name, or ``"package.module:function"`` for a factory
  ``function(batch) -> (module, example_inputs)`` with deterministic weights), the mini-batch and the input size,
  and makes every step's batch (seeded: every process draws the same data) and its targets.
* :class:`TrainingPlanFile` holds the source, the unit OpGraph and its TrainCosts, the StagePlan (stages name
  their units), the pipeline split points and the loss.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetpart.errors import SchemaError
from hetpart.graph import SCHEMA_VERSION, OpGraph, check_schema_version
from hetpart.training.cost_model import TrainCosts
from hetpart.training.stage_plan import StagePlan
from hetpart.training_torch.errors import TrainingPlanFileError

LOSSES = ("cross_entropy", "mse")
KIND = "hetpart.training_torch.plan"


@dataclass(frozen=True)
class ModelSource:
    """Where every process gets the same model and the same data from."""

    model: str                      # zoo name, or "package.module:function"
    batch: int                      # samples per step (all micro-batches together)
    size: int | None = None         # zoo input size (image side / sequence length); None = the zoo default
    seed: int = 0                   # data seed (weights are seeded by the zoo or the factory)

    def validate(self) -> "ModelSource":
        if not self.model or self.batch < 1 or (self.size is not None and self.size < 1):
            raise TrainingPlanFileError(f"a model source needs a model name, batch >= 1 and size >= 1 or None; "
                                        f"found {self.model!r}, batch={self.batch}, size={self.size}")
        return self

    @property
    def is_factory(self) -> bool:
        return ":" in self.model

    def build(self, batch: int | None = None) -> tuple[Any, tuple[Any, ...]]:
        """A fresh module (identical weights in every process) and example inputs of ``batch`` samples."""
        batch = batch or self.batch
        if self.is_factory:
            module_name, _, function = self.model.partition(":")
            try:
                factory = getattr(importlib.import_module(module_name), function)
            except (ImportError, AttributeError) as exc:
                raise TrainingPlanFileError(f"cannot import the model factory {self.model!r}: {exc}") from exc
            module, inputs = factory(batch)
            return module, tuple(inputs)
        import models

        return models.build_torch(self.model, batch=batch, size=self.size)

    def batch_for_step(self, step: int, example: tuple[Any, ...], loss: str, output: Any) -> tuple[tuple, Any]:
        """Inputs and targets of step ``step``: like ``example`` (shape, dtype, and for token ids the value range),
        seeded by (seed, step). Targets: class ids of the output's last axis (cross-entropy) or a tensor shaped
        like the output (mse)."""
        import torch

        g = torch.Generator().manual_seed(1_000_003 * self.seed + step)
        inputs = []
        for x in example:
            if x.dtype.is_floating_point:
                inputs.append(torch.randn(x.shape, generator=g, dtype=x.dtype))
            else:
                high = self._vocab() or int(x.max()) + 1
                inputs.append(torch.randint(0, high, tuple(x.shape), generator=g, dtype=x.dtype))
        if loss == "cross_entropy":
            target = torch.randint(0, int(output.shape[-1]), (int(output.shape[0]),), generator=g)
        else:
            target = torch.randn(output.shape, generator=g, dtype=output.dtype)
        return tuple(inputs), target

    @property
    def batch_dim(self) -> int:
        """The input dimension that holds the samples: the zoo model's batch axis (1 for the sequence-first
        language models and speaker encoder), 0 for factories (assumed batch-first)."""
        if self.is_factory:
            return 0
        import models

        return models.get_info(self.model).batch_axis

    def _vocab(self) -> int | None:
        if self.is_factory:
            return None
        import models

        return models.get_info(self.model).vocab_size

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "batch": self.batch, "size": self.size, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelSource":
        try:
            return cls(str(data["model"]), int(data["batch"]), None if data.get("size") is None else int(data["size"]),
                       int(data.get("seed", 0))).validate()
        except (KeyError, TypeError, ValueError) as exc:
            raise TrainingPlanFileError(f"the plan file's model source is malformed: {exc}") from exc


def contiguous_split_points(stage_ops: Sequence[Sequence[int]], unit_names: Sequence[str]) -> list[str]:
    """The unit each stage after the first begins with (``pipeline(split_spec={name: SplitPoint.BEGINNING})``);
    every stage must be the next contiguous run of units in forward order, what a split at module boundaries can
    cut."""
    points = []
    expected = 0
    for k, ops in enumerate(stage_ops):
        ids = sorted(ops)
        if ids != list(range(expected, expected + len(ids))):
            raise TrainingPlanFileError(
                f"stage {k} holds units {ids[:8]}, which are not the next contiguous run of units after unit "
                f"{expected - 1}; torch's pipeline split cuts the forward at module boundaries only, so every stage "
                "must be a contiguous run of units in forward order. Re-plan with pipedream_dp (chains) or a coarser "
                "granularity")
        if k:
            points.append(unit_names[ids[0]])
        expected += len(ids)
    return points


def make_loss(loss: str) -> Any:
    """The per-micro-batch loss module (a mean over the micro-batch: equal micro-batches then average to the
    full-batch loss, and torch's ``scale_grads`` makes the gradients equal too)."""
    from torch import nn

    if loss == "cross_entropy":
        return nn.CrossEntropyLoss()
    if loss == "mse":
        return nn.MSELoss()
    raise TrainingPlanFileError(f"loss must be one of {LOSSES}; found {loss!r}")


def default_loss(output_shape: tuple[int, ...], output_dtype: str) -> str:
    """Cross-entropy for a [batch, classes] float output (a classifier), else mean squared error."""
    return "cross_entropy" if len(output_shape) == 2 and output_dtype.startswith("float") else "mse"


@dataclass(frozen=True)
class TrainingPlanFile:
    source: ModelSource
    plan: StagePlan
    graph: OpGraph                          # the unit graph (op id k = unit k)
    train_costs: TrainCosts
    split_points: tuple[str, ...]           # the unit each stage after the first begins with
    loss: str
    granularity: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)
    schema_version: int = SCHEMA_VERSION

    @property
    def microbatch_size(self) -> int:
        return self.source.batch // self.plan.microbatches

    def validate(self) -> "TrainingPlanFile":
        self.source.validate()
        self.plan.validate(self.graph)
        self.train_costs.validate(self.graph)
        if self.loss not in LOSSES:
            raise TrainingPlanFileError(f"loss must be one of {LOSSES}; found {self.loss!r}")
        if self.source.batch % self.plan.microbatches:
            raise TrainingPlanFileError(f"the batch of {self.source.batch} does not split into "
                                        f"{self.plan.microbatches} equal micro-batches; pick a batch that is a "
                                        "multiple of the micro-batch count")
        expected = contiguous_split_points([s.op_ids for s in self.plan.stages], [n.name for n in self.graph.nodes])
        if list(self.split_points) != expected:
            raise TrainingPlanFileError(f"the split points must be the first unit of every stage after the first, "
                                        f"{expected}; found {list(self.split_points)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "schema_version": self.schema_version, "source": self.source.to_dict(),
                "loss": self.loss, "granularity": self.granularity, "split_points": list(self.split_points),
                "notes": list(self.notes), "plan": self.plan.to_dict(), "graph": self.graph.to_dict(),
                "train_costs": self.train_costs.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingPlanFile":
        check_schema_version(data, "training plan file")
        if data.get("kind") != KIND:
            raise SchemaError(f"not a hetpart training plan file (kind {data.get('kind')!r}, expected {KIND!r}); "
                              "write one with `hetpart train-plan MODEL ... -o plan.json`")
        try:
            return cls(source=ModelSource.from_dict(data["source"]), plan=StagePlan.from_dict(data["plan"]),
                       graph=OpGraph.from_dict(data["graph"]), train_costs=TrainCosts.from_dict(data["train_costs"]),
                       split_points=tuple(data["split_points"]), loss=str(data["loss"]),
                       granularity=int(data.get("granularity", 1)), notes=tuple(data.get("notes", ())),
                       schema_version=data["schema_version"]).validate()
        except KeyError as exc:
            raise SchemaError(f"the training plan file lacks the key {exc}") from exc

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TrainingPlanFile":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError as exc:
            raise TrainingPlanFileError(f"no training plan file at {path}") from exc
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{path} is not valid JSON: {exc}") from exc
