"""Kernel graphs of the zoo's RNN language models at small sequence lengths, imported once per session."""
from __future__ import annotations

from typing import Callable

import pytest

from hetpart.graph import OpGraph


@pytest.fixture(scope="session")
def zoo_rnn_graph() -> Callable[[str, int, int | None], OpGraph]:
    """``(model, seq, slice_steps) -> kernel graph``; ``slice_steps`` None: the default hoisted projection, else
    one input projection per ``slice_steps`` steps."""
    cache: dict[tuple[str, int, int | None], OpGraph] = {}

    def get(model: str, seq: int, slice_steps: int | None) -> OpGraph:
        key = (model, seq, slice_steps)
        if key not in cache:
            from hetpart.driver.api import import_model
            from tvm_passes.extract import extract_op_graph
            from tvm_passes.rnn import RnnImportOptions

            options = None if slice_steps is None else RnnImportOptions("per_slice", slice_steps)
            imported = import_model(model, batch=1, size=seq, rnn_options=options)
            cache[key] = extract_op_graph(imported.mod, name=f"{model}-{seq}",
                                          source_hash=imported.source_hash).kernel_graph()
        return cache[key]

    return get
