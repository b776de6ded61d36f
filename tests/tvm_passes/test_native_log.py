"""TVM's native stderr lines are routed through logging at their level, deduplicated, and none is lost."""
from __future__ import annotations

import logging
import os

from tvm_passes.native_log import native_output_to_log


def test_native_lines_become_log_records_at_their_level(caplog, capfd):
    with caplog.at_level(logging.DEBUG, logger="tvm.native"):
        with native_output_to_log():
            for _ in range(3):
                os.write(2, b"[16:19:32] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:global\n")
            os.write(2, b"[16:19:33] something new went wrong\n")
            with native_output_to_log():                     # nested captures are allowed
                os.write(2, b"inner line\n")
    assert capfd.readouterr().err == "", "nothing reaches the terminal directly"
    records = {r.getMessage(): r.levelno for r in caplog.records if r.name == "tvm.native"}
    assert records == {
        "TVM: /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:global (3 times)": logging.DEBUG,
        "TVM: something new went wrong": logging.WARNING,
        "TVM: inner line": logging.WARNING,
    }
