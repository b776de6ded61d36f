"""Where hetpart keeps what it builds and measures outside the repository (standard library only).

Everything lives under one root: ``$HETPART_CACHE_DIR`` when set, else ``~/.cache/hetpart``: built zoo models
(``models/``), the profile database (``profiles.sqlite``), predictors fitted by ``hetpart fit`` (``predictors/``),
MetaSchedule records (``tuning/``) and host calibration
timings (``calibration/``).
"""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "HETPART_CACHE_DIR"


def cache_root() -> Path:
    """``$HETPART_CACHE_DIR`` when that variable is set, else ``~/.cache/hetpart`` (not created here)."""
    root = os.environ.get(CACHE_ENV_VAR)
    return Path(root) if root else Path.home() / ".cache" / "hetpart"
