"""The driver, the top layer: model lookup and import (through tvm_passes.sources), compiler orchestration,
the Python API, the command line, the report, the runtime loader, ``run --check`` and output directories.

It may import every layer below it; nothing below imports it (import-linter contracts in pyproject.toml)."""
