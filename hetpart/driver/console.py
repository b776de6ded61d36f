"""The console the command line prints its results to (rich; stdout)."""
from __future__ import annotations


def console():
    """A rich console on stdout; pipes and CI logs get 160 columns instead of 80, so tables are not squeezed."""
    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=160)
    return out
