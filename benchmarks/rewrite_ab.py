"""One import rewrite of ``tvm_passes.frontend`` off and on, against onnxruntime, for a one-input ONNX model: the
shared measurement of ``conv1d_rewrite.py`` and ``conv_channel_padding.py`` (``cpu_kernels.py``'s block protocol)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def time_rewrite_off_and_on(row: dict, path: Path, x: np.ndarray, rewrite_name: str, variants: tuple[str, str],
                            rounds: int, calls: int) -> None:
    """Fill ``row`` with onnxruntime's times and those of the model imported with ``tvm_passes.frontend``'s
    ``rewrite_name`` replaced by a no-op (``variants[0]``) and as it is (``variants[1]``): each variant's largest
    relative difference from onnxruntime (RuntimeError above 1e-4), its import notes, and the block timings
    (``cpu_kernels._record_times``)."""
    import tvm
    from tvm import relax

    import cpu_kernels as ck
    import tvm_passes.frontend as frontend
    from tvm_passes.schedules import cpu_pipeline, default_cpu_target

    sessions = {"onnxruntime": ck._ort_session(path), "onnxruntime_spinning": ck._ort_session(path, spinning=True)}
    reference = sessions["onnxruntime"].run(None, {"x": x})[0]
    target = default_cpu_target()
    runners = {key: (lambda s=s: s.run(None, {"x": x})) for key, s in sessions.items()}
    rewrite = getattr(frontend, rewrite_name)
    for variant, applied in zip(variants, (False, True)):
        setattr(frontend, rewrite_name, rewrite if applied else (lambda mod: (mod, 0)))
        try:
            imported = frontend.import_model(path)
        finally:
            setattr(frontend, rewrite_name, rewrite)
        row[f"{variant}_notes"] = list(imported.notes)
        vm = relax.VirtualMachine(tvm.compile(imported.mod, target=target, relax_pipeline=cpu_pipeline(target)),
                                  tvm.cpu())
        arg = tvm.runtime.tensor(x)
        out = vm["main"](arg).numpy()
        row[f"{variant}_max_rel_diff"] = float(np.abs(out - reference).max() / np.abs(reference).max())
        if row[f"{variant}_max_rel_diff"] > 1e-4:
            raise RuntimeError(f"{row.get('case')} {variant}: differs from onnxruntime by "
                               f"{row[f'{variant}_max_rel_diff']:.1e}")
        runners[variant] = lambda vm=vm, arg=arg: vm["main"](arg)
    ck._record_times(row, ck._block_times(runners, rounds, calls))
