"""Relax VMs made from several threads: one process-wide lock around making a VM and looking up its functions.

Two threads making a ``relax.VirtualMachine`` at the same moment from one freshly compiled (in-memory) executable
corrupt state the executable shares between its VMs. Measured with TVM 0.27: eight fresh executables of 100
kernels each, two threads making a VM from each at once behind a barrier, aborted with "double free or corruption"
in 1 of 8 processes; under this lock 0 of 6. In the task runtime, whose workers make their VMs as they start,
this showed as segfaults inside a VM's construction and later in ``VMExecutable::~VMExecutable`` (DenseNet-121's
measuring process crashed in 2 of 2 attempts in one benchmark run). VMs are made once per worker, so the lock
costs nothing a request sees. Calling two *different* VMs at once is safe; calling one VM from two threads is not
(one VM per thread)."""
from __future__ import annotations

import threading
from typing import Any, Sequence

_SETUP_LOCK = threading.Lock()


def new_virtual_machine(executable: Any, devices: Any, functions: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
    """``relax.VirtualMachine(executable, devices)`` and its ``functions`` looked up, made under the lock."""
    from tvm import relax

    with _SETUP_LOCK:
        vm = relax.VirtualMachine(executable, devices)
        return vm, {name: vm[name] for name in functions}
