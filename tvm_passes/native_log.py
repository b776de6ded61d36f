"""Route what TVM's C++ code prints to the process's stderr through Python logging.

TVM's native ``LOG(WARNING)`` lines bypass Python: exporting a Relax executable prints one ``executable.cc:...:
Warning: Scope Saving:global`` line per saved constant (dozens per compile), and ``take`` in fast mode warns about
out-of-bounds indices. Around the TVM calls that print them, :func:`native_output_to_log` points file descriptor 2
at a temporary file and, afterwards, logs each captured line: lines known to be harmless at DEBUG, anything else at
WARNING, so nothing is lost and the console shows only what a user needs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from typing import Iterator

logger = logging.getLogger("tvm.native")

# Native messages and the level they are logged at (anything else: WARNING):
KNOWN_LEVELS = (
    # the VM executable notes each constant's storage scope as it is saved or loaded: nothing to act on
    (re.compile(r"Warning: Scope (Saving|Loaded):"), logging.DEBUG),
    # ONNX Gather becomes take(mode="fast"), which does not bounds-check indices: valid ids are the user's contract
    # (``hetpart run`` samples them in range), so it is said once per compile, not as a warning
    (re.compile(r"Warning: Fast mode segfaults when there are out-of-bounds indices"), logging.INFO),
    # TOPI's scatter kernels (ONNX ScatterElements, ScatterND, also in torch's pack_padded_sequence exports) mark
    # statement sequences with a "pragma_scope" attribute that the LLVM code generator does not use: it skips it
    (re.compile(r"Warning: Unknown pragma pragma_scope"), logging.DEBUG),
)
_lock = threading.RLock()    # re-entrant: a narrow capture may run inside a wide one


def _relog(text: str) -> None:
    """Log each distinct captured line once, with its count, at its level (:data:`KNOWN_LEVELS`)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        message = re.sub(r"^\[[0-9:]+\]\s*", "", line.strip())
        if message:
            counts[message] = counts.get(message, 0) + 1
    for message, count in counts.items():
        level = next((lvl for pattern, lvl in KNOWN_LEVELS if pattern.search(message)), logging.WARNING)
        logger.log(level, "TVM: %s%s", message, f" ({count} times)" if count > 1 else "")


@contextlib.contextmanager
def native_output_to_log() -> Iterator[None]:
    """Capture file descriptor 2 inside the block and re-log its lines (see the module docstring).

    Process-wide while it runs (one at a time); Python's own ``sys.stderr`` is flushed before and after, and what
    Python code writes to stderr inside the block is re-logged too rather than lost."""
    with _lock:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):       # no usable stderr (e.g. closed): nothing to redirect
            yield
            return
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                _relog(capture.read().decode("utf-8", errors="replace"))
