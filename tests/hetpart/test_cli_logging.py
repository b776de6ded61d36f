"""The command line's console: Python warnings become one log line each, at a level that fits who raised them."""
from __future__ import annotations

import logging
import warnings

from hetpart.driver import cli
from hetpart.errors import DegeneratePlanWarning


def test_warnings_become_single_log_lines_at_their_level(monkeypatch, caplog):
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)      # restored after the test
    with warnings.catch_warnings():
        cli._route_warnings(verbose=0)
        warnings.simplefilter("always")
        with caplog.at_level(logging.DEBUG, logger="hetpart.warnings"):
            warnings.warn(DegeneratePlanWarning("degenerate plan: all on 'gpu'"))
            warnings.warn("torch says this is going away", FutureWarning)
            warnings.warn("something a library noticed", UserWarning)
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "hetpart.warnings"]
    assert records == [
        (logging.WARNING, "DegeneratePlanWarning: degenerate plan: all on 'gpu'"),
        (logging.DEBUG, "FutureWarning: torch says this is going away"),
        (logging.INFO, "UserWarning: something a library noticed"),
    ]
