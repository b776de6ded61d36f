"""The activation functions and cell clip of an ONNX LSTM / GRU / RNN node, as Relax ops for the unrolled cell.

ONNX lets a recurrent node name its activations (``activations``: f, g[, h] per direction, e.g. torch's
``nn.RNN(nonlinearity="relu")`` writes ``["Relu"]``, and Keras LSTMs converted by tf2onnx carry
``HardSigmoid`` as their recurrent activation) with parameters ``activation_alpha`` / ``activation_beta``, consumed
in order by the functions that take them (onnxruntime's reading; a function with none left takes its ONNX
default), and ``clip``, which bounds every activation's input to ``[-clip, clip]``. :func:`cell_activations` parses
them per direction; :meth:`Activation.apply` emits one. Sigmoid and Tanh emit the same single op as always, so
models with the default activations unroll to the same kernels as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from tvm import relax

__all__ = ["Activation", "CellActivations", "activation_problems", "cell_activations"]

DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}


class _Parameters(NamedTuple):
    uses_alpha: bool
    uses_beta: bool
    default_alpha: float
    default_beta: float


# name (lower case) -> which parameters it takes and their defaults (ONNX's standalone ops' defaults)
PARAMETERS: dict[str, _Parameters] = {
    "relu": _Parameters(False, False, 0.0, 0.0),
    "tanh": _Parameters(False, False, 0.0, 0.0),
    "sigmoid": _Parameters(False, False, 0.0, 0.0),
    "affine": _Parameters(True, True, 1.0, 0.0),
    "leakyrelu": _Parameters(True, False, 0.01, 0.0),
    "thresholdedrelu": _Parameters(True, False, 1.0, 0.0),
    "scaledtanh": _Parameters(True, True, 1.0, 1.0),
    "hardsigmoid": _Parameters(True, True, 0.2, 0.5),
    "elu": _Parameters(True, False, 1.0, 0.0),
    "softsign": _Parameters(False, False, 0.0, 0.0),
    "softplus": _Parameters(False, False, 0.0, 0.0),
}


def _const(value: float, like: relax.Expr) -> relax.Expr:
    return relax.const(value, str(like.ty.dtype))


def _formula(name: str, alpha: float, beta: float) -> Callable[[relax.Expr], relax.Expr]:
    op = relax.op
    c = _const
    formulas: dict[str, Callable[[relax.Expr], relax.Expr]] = {
        "relu": lambda x: op.nn.relu(x),
        "tanh": lambda x: op.tanh(x),
        "sigmoid": lambda x: op.sigmoid(x),
        "affine": lambda x: op.add(op.multiply(x, c(alpha, x)), c(beta, x)),
        "leakyrelu": lambda x: op.nn.leakyrelu(x, alpha),
        "thresholdedrelu": lambda x: op.where(op.greater(x, c(alpha, x)), x, op.zeros_like(x)),
        "scaledtanh": lambda x: op.multiply(op.tanh(op.multiply(x, c(beta, x))), c(alpha, x)),
        "hardsigmoid": lambda x: op.clip(op.add(op.multiply(x, c(alpha, x)), c(beta, x)), 0.0, 1.0),
        "elu": lambda x: op.where(op.greater_equal(x, c(0.0, x)), x,
                                  op.multiply(op.subtract(op.exp(x), c(1.0, x)), c(alpha, x))),
        "softsign": lambda x: op.divide(x, op.add(op.abs(x), c(1.0, x))),
        "softplus": lambda x: op.log(op.add(op.exp(x), c(1.0, x))),
    }
    return formulas[name]


@dataclass(frozen=True)
class Activation:
    """One activation function of a cell: its ONNX name (lower case) and parameters."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def apply(self, emit: Any, x: relax.Expr, what: str) -> relax.Expr:
        """Emit ``self(x)`` as one binding named by ``emit`` (:class:`tvm_passes.rnn_cells.Emitter`)."""
        return emit(_formula(self.name, self.alpha, self.beta)(x), what)


@dataclass(frozen=True)
class CellActivations:
    """One direction's activations (``f``, ``g`` and, for LSTM, ``h``; ONNX's names) and the cell clip."""

    f: Activation
    g: Activation
    h: Activation | None = None
    clip: float | None = None

    def gate(self, emit: Any, function: Activation, x: relax.Expr, what: str) -> relax.Expr:
        """``function(x)``, its input clipped to ``[-clip, clip]`` first when the node has a clip."""
        if self.clip is not None:
            x = emit(relax.op.clip(x, -self.clip, self.clip), f"{what}_clip")
        return function.apply(emit, x, what)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def activation_problems(op_type: str, where: str, attrs: dict, num_dirs: int) -> list[str]:
    """What is wrong with a node's ``activations`` / ``clip`` attributes (empty: they can be unrolled)."""
    problems = []
    per_dir = len(DEFAULT_ACTIVATIONS[op_type])
    if "activations" in attrs:
        found = [_text(a).lower() for a in attrs["activations"]]
        unknown = sorted({a for a in found if a not in PARAMETERS})
        if unknown:
            problems.append(f"{where}: activations {unknown} are not ONNX RNN activations; supported: "
                            f"{sorted(PARAMETERS)}")
        if len(found) != per_dir * num_dirs:
            problems.append(f"{where}: {len(found)} activations given, but a {op_type} with {num_dirs} "
                            f"direction(s) takes {per_dir * num_dirs} ({per_dir} per direction)")
    if "clip" in attrs and not float(attrs["clip"]) > 0:
        problems.append(f"{where}: clip={attrs['clip']} must be a positive threshold")
    return problems


def cell_activations(op_type: str, attrs: dict, num_dirs: int) -> tuple[CellActivations, ...]:
    """Each direction's activations of a node whose attributes passed :func:`activation_problems`."""
    names = [_text(a).lower() for a in attrs.get("activations", ())] or list(DEFAULT_ACTIVATIONS[op_type]) * num_dirs
    alphas, betas = list(attrs.get("activation_alpha", ())), list(attrs.get("activation_beta", ()))
    functions = []
    for name in names:
        params = PARAMETERS[name]
        alpha = (alphas.pop(0) if alphas else params.default_alpha) if params.uses_alpha else 0.0
        beta = (betas.pop(0) if betas else params.default_beta) if params.uses_beta else 0.0
        functions.append(Activation(name, float(alpha), float(beta)))
    clip = float(attrs["clip"]) if "clip" in attrs else None
    per_dir = len(DEFAULT_ACTIVATIONS[op_type])
    out = []
    for d in range(num_dirs):
        mine = functions[d * per_dir:(d + 1) * per_dir]
        out.append(CellActivations(f=mine[0], g=mine[1] if per_dir > 1 else mine[0],
                                   h=mine[2] if per_dir > 2 else None, clip=clip))
    return tuple(out)
