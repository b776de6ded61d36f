"""hetpart: partition DNN inference across a CPU and a GPU on Apache TVM (Relax)."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "analyze", "compile", "load"]


def __getattr__(name: str):
    # Lazy: importing hetpart must stay cheap and must not import tvm (core modules are framework-free).
    if name in ("analyze", "compile", "load"):
        from hetpart.driver import api
        return getattr(api, name)
    raise AttributeError(f"module 'hetpart' has no attribute {name!r}")
