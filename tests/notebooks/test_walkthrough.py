"""The walkthrough notebook runs headless, top to bottom, without errors."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.tvm

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "walkthrough.ipynb"


def test_walkthrough_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for o in cell.get("outputs", []))
    assert "max |diff| vs onnxruntime" in outputs
    assert "cp_greedy" in outputs and "measured" in outputs
