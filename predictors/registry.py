"""Which CPU predictor prices this host's kernels, and how it is fitted to this host.

hetpart ships one CPU predictor per CPU core type (``predictors/data/cpu_<mcpu>.json``, plus ``cpu_default.json``),
and for some CPUs one per smaller thread count (``cpu_<mcpu>_threads<N>.json``, for CPU devices on part of the
cores); ``hetpart fit`` writes one measured on the host into the cache (``$HETPART_CACHE_DIR/predictors/``).
:func:`load_cpu_predictor` picks the one for this host's CPU -- fitted here, else shipped -- (or the one the user
names), warns when it was measured on another CPU, with another TVM thread count or on kernels of older CPU rules,
and scales a foreign one by the
calibration suite of :mod:`predictors.host_calibration` (only a clean calibration is used: on a busy host the
predictor stays unscaled, with a warning). :func:`cpu_cost_note` is the report's line saying all of that.

Importing this module imports neither TVM nor the profiler: the host's CPU name imports the CPU pipeline when first
asked, and the profiler is never imported here. The caller passes the sweep that times the calibration suite
(``time_fresh``, e.g. :func:`predictors.profiling.calibration_sweep.time_fresh`); it runs only when the suite must
really be timed (a foreign predictor and no clean cached calibration on this host).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from importlib import resources
from pathlib import Path
from typing import Any

from hetpart.errors import OutputDirError, PredictorError
from hetpart.paths import cache_root
from hetpart.threads import deployment_threads
from predictors import host_calibration
from predictors.host_calibration import FreshTiming, HostCalibration

logger = logging.getLogger(__name__)

DEFAULT_CPU_PREDICTOR = "cpu_default.json"
CPU_PREDICTOR_ENV_VAR = "HETPART_CPU_PREDICTOR"
FIT_HERE = "`hetpart profile --device cpu --budget-minutes 60 && hetpart fit`"


# Set to any name to make hetpart treat this host's CPU as that one when it chooses and judges CPU predictors; CI
# sets a name no predictor is shipped for, so the suite runs as it would on an unknown CPU, whatever the host.
HOST_CPU_ENV_VAR = "HETPART_HOST_CPU"


@functools.lru_cache(maxsize=1)
def host_cpu_name() -> str:
    """LLVM's name for this host's CPU core (TVM's ``-mcpu``, e.g. ``znver4``): what compiled kernels are tuned
    for, and so what a CPU predictor's measurements are valid for (asked once per process; ``$HETPART_HOST_CPU``
    overrides it)."""
    override = os.environ.get(HOST_CPU_ENV_VAR, "").strip()
    if override:
        return override
    from tvm_passes.schedules.pipeline import default_cpu_target

    return str(default_cpu_target().attrs["mcpu"])


def cpu_predictor_filename(cpu_name: str, threads: int | None = None) -> str:
    """``cpu_<cpu_name>.json`` for a predictor timed with every core of the host (``threads`` None or the host's
    CPU count, the deployment default), else ``cpu_<cpu_name>_threads<threads>.json``: a CPU device on some of the
    cores (``--devices cpu:0,cpu:1``) runs its kernels with fewer threads, and kernels do not all scale alike."""
    if threads is None or threads == (os.cpu_count() or 1):
        return f"cpu_{cpu_name}.json"
    if threads < 1:
        raise PredictorError(f"a CPU predictor's thread count must be >= 1; found {threads}")
    return f"cpu_{cpu_name}_threads{threads}.json"


def shipped_cpu_predictor_path(cpu_name: str, threads: int | None = None) -> Path:
    """predictors/data/cpu_<cpu_name>[_threads<N>].json: the predictor shipped with hetpart for that CPU (and
    thread count, :func:`cpu_predictor_filename`; may not exist)."""
    return Path(str(resources.files("predictors") / "data" / cpu_predictor_filename(cpu_name, threads)))


def fitted_cpu_predictor_path(cpu_name: str, threads: int | None = None) -> Path:
    """``$HETPART_CACHE_DIR/predictors/cpu_<cpu_name>[_threads<N>].json``: where ``hetpart fit`` writes by default,
    and what the loader picks first -- a predictor measured on this very host. Kept out of the installed package,
    which may be read-only and whose shipped predictors a fit must not replace."""
    return cache_root() / "predictors" / cpu_predictor_filename(cpu_name, threads)


def default_cpu_predictor_path(cpu_name: str | None = None, threads: int | None = None) -> Path:
    """The predictor for this host's CPU at ``threads`` TVM threads (default: the deployment's): one fitted here
    for that thread count, else one shipped for it, else the CPU's predictor at every core (fitted here, else
    shipped; the loader scales it to the thread count by the host calibration), else ``cpu_default.json``.

    One machine kind is not one CPU here: the same 2-core VMs ran on AMD Zen 5 (znver5), Zen 4 (znver4), Zen 3
    (znver3) and Intel (rocketlake) cores, where the profiler's canary kernel takes 70, 147-152 and 105 µs (Zen 5,
    Zen 4, Intel) and other kernels differ by other factors, so a predictor is only valid on the CPU it was
    measured on (:func:`load_cpu_predictor` scales one from another CPU by a calibration suite timed on the
    host)."""
    cpu_name = cpu_name if cpu_name is not None else host_cpu_name()
    threads = threads or deployment_threads()
    candidates = [fitted_cpu_predictor_path(cpu_name, threads), shipped_cpu_predictor_path(cpu_name, threads),
                  fitted_cpu_predictor_path(cpu_name), shipped_cpu_predictor_path(cpu_name)]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    return Path(str(resources.files("predictors") / "data" / DEFAULT_CPU_PREDICTOR))


def check_predictor_output(path: str | Path) -> None:
    """Raise :class:`OutputDirError` unless ``path`` is free or holds a predictor hetpart wrote (JSON of this
    format): ``hetpart fit`` never replaces a file it did not write."""
    path = Path(path)
    if not path.exists():
        return
    from predictors.device_predictor import PREDICTOR_FORMAT

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not path.is_file() or not isinstance(data, dict) or data.get("format") != PREDICTOR_FORMAT:
        raise OutputDirError(f"{path} exists and is not a predictor hetpart wrote (a JSON file of format "
                             f"{PREDICTOR_FORMAT!r}); it is left alone. Give another path with -o, or move it away")


def resolve_cpu_predictor_path(path: str | Path | None = None, threads: int | None = None) -> Path:
    """``path``, else $HETPART_CPU_PREDICTOR, else :func:`default_cpu_predictor_path` for ``threads``."""
    return Path(path or os.environ.get(CPU_PREDICTOR_ENV_VAR) or default_cpu_predictor_path(threads=threads))


def predictor_rules_version(predictor: Any) -> int | None:
    """The version of hetpart's CPU schedule rules (``tvm_passes.schedules.RULES_VERSION``) that compiled the
    kernels a predictor was fitted on, from the pipeline versions its profile database recorded; None when the
    predictor does not record them."""
    found = [int(part.removeprefix("rules-")) for version in
             predictor.fit_info.get("training", {}).get("pipeline_versions", ())
             for part in str(version).split(".") if part.startswith("rules-") and part[6:].isdigit()]
    return max(found) if found else None


def stale_rules_note(predictor: Any) -> str | None:
    """Why a predictor's costs may be stale for this hetpart's kernels (older CPU rules), or None."""
    from tvm_passes.schedules import RULES_VERSION

    fitted = predictor_rules_version(predictor)
    if fitted is not None and fitted >= RULES_VERSION:
        return None
    when = f"CPU rules v{fitted}" if fitted is not None else "CPU rules it does not record"
    return (f"fitted on kernels compiled by {when}; this hetpart compiles v{RULES_VERSION}, so the costs of the "
            "kernels the newer rules changed are stale (tvm_passes/schedules/__init__.py lists each version's change)")


def _calibration_note(calibration: HostCalibration, scaling: dict[str, Any] | None) -> str:
    """The cost note's account of the host calibration: which one (cached, fresh, none-fallback), its ratio and
    when the suite was timed."""
    when = f"suite timed {calibration.measured_at}" if calibration.measured_at else "no suite timed"
    if calibration.status == "none-fallback":
        unused = f", its unused ratio x{calibration.speed_ratio:.2f}" if calibration.speed_ratio is not None else ""
        return f"not scaled to this host (calibration: none-fallback, {when}{unused}): {calibration.reason}"
    note = f"scaled x{calibration.speed_ratio:.2f} to this host (calibration: {calibration.status}, {when})"
    if scaling:
        note += (f": the geometric mean of measured / predicted over {scaling['n_kernels']} calibration kernels "
                 f"timed here with {scaling['host_threads']} thread(s) (x{scaling['kernel_ratio_min']:.2f} to "
                 f"x{scaling['kernel_ratio_max']:.2f} per kernel)")
    return note


def cpu_cost_note(predictor: Any, path: Path, calibration: HostCalibration | None = None) -> str:
    """One line for the report: which predictor gave the CPU costs, the CPU it was measured on and, when it is
    foreign to this host, which calibration scaled it (cached or fresh, its ratio, when the suite was timed) or
    why it stayed unscaled (``none-fallback``). ``calibration`` defaults to the scaled predictor's own."""
    fitted = predictor.fit_info.get("fit_date", "at an unrecorded date")
    note = (f"CPU costs: {path.name}, measured on a {predictor.target.get('mcpu', 'unrecorded')} CPU with "
            f"{predictor.num_threads or 'an unrecorded number of'} TVM thread(s), fitted {fitted}; this host's CPU: "
            f"{host_cpu_name()}")
    calibration = calibration if calibration is not None else getattr(predictor, "calibration", None)
    if calibration is not None:
        note += "; " + _calibration_note(calibration, getattr(predictor, "scaling", None))
    stale = stale_rules_note(predictor)
    if stale:
        note += f"; {stale}"
    return note


@dataclasses.dataclass(frozen=True)
class HostCpuPredictor:
    """The CPU predictor a compile uses: its file, the predictor (scaled to this host or not) and the host
    calibration behind it (None: none was needed, or scaling was not asked for)."""

    path: Path
    predictor: Any
    calibration: HostCalibration | None

    def cost_note(self) -> str:
        """The report's line on these CPU costs (:func:`cpu_cost_note`)."""
        return cpu_cost_note(self.predictor, self.path, self.calibration)


def load_host_cpu_predictor(path: str | Path | None = None, *, scale_to_host: bool = True,
                            time_fresh: FreshTiming | None = None, threads: int | None = None) -> HostCpuPredictor:
    """:func:`load_cpu_predictor`, with the file it read and the host calibration (for :func:`cpu_cost_note`).
    ``threads``: the TVM thread count the costs are for (a CPU device on some of the cores); default the
    deployment's."""
    from predictors.device_predictor import DevicePredictor

    threads = threads or deployment_threads()
    path = resolve_cpu_predictor_path(path, threads)
    if not path.exists():
        raise PredictorError(f"no CPU latency predictor at {path}; build one with `hetpart profile --device cpu "
                             "--budget-minutes 60` and `hetpart fit`, or pass --cpu-predictor FILE")
    predictor = DevicePredictor.load(path)
    fitted_on, host = str(predictor.target.get("mcpu", "")), host_cpu_name()
    foreign_cpu = bool(fitted_on) and fitted_on != host
    foreign_threads = bool(predictor.num_threads) and predictor.num_threads != threads
    result, calibration = predictor, None
    if scale_to_host and (foreign_cpu or foreign_threads):
        result, calibration = host_calibration.calibrate_to_host(predictor, host, threads, time_fresh=time_fresh)
    if foreign_cpu or foreign_threads:
        _warn_foreign(path, predictor, host, threads, foreign_cpu, foreign_threads, calibration)
    stale = stale_rules_note(predictor)
    if stale:
        logger.warning("the CPU predictor %s was %s. Refit it on this host: %s.", path, stale, FIT_HERE)
    return HostCpuPredictor(path, result, calibration)


def load_cpu_predictor(path: str | Path | None = None, *, scale_to_host: bool = True,
                       time_fresh: FreshTiming | None = None) -> Any:
    """The CPU predictor: ``path``, else $HETPART_CPU_PREDICTOR, else the shipped one for this host's CPU
    (:func:`default_cpu_predictor_path`).

    When it was measured on another CPU or with another TVM thread count, this warns and -- unless
    ``scale_to_host=False`` -- scales every prediction by the host's speed ratio from a clean calibration suite
    (:func:`predictors.host_calibration.calibrate_to_host`: read from this host's cache, else timed by
    ``time_fresh``, ~5 s the first time on a host). On a busy host, or when the suite cannot be timed (also without
    a ``time_fresh`` and no cached calibration), the predictor is returned unscaled and the warning says why."""
    return load_host_cpu_predictor(path, scale_to_host=scale_to_host, time_fresh=time_fresh).predictor


def _warn_foreign(path: Path, predictor: Any, host: str, threads: int, foreign_cpu: bool, foreign_threads: bool,
                  calibration: HostCalibration | None) -> None:
    """One warning line: how the predictor is foreign, what was done about it, and the fix."""
    what = []
    if foreign_cpu:
        what.append(f"was measured on a {predictor.target.get('mcpu')} CPU; this host is a {host}")
    if foreign_threads:
        what.append(f"was fitted on kernels timed with {predictor.num_threads} TVM thread(s); this deployment runs "
                    f"{threads} (TVM_NUM_THREADS)")
    if calibration is None:
        done = "not scaled"
    elif calibration.status == "none-fallback":
        done = f"not scaled, because {calibration.reason}"
    else:
        done = (f"scaled x{calibration.speed_ratio:.2f} by a calibration suite timed here ({calibration.status} "
                f"calibration, suite timed {calibration.measured_at}), a first-order correction "
                "(benchmarks/results/predictor_transfer*.md)")
    fit = (f"profile and fit on this host for costs measured here: {FIT_HERE} writes "
           f"{fitted_cpu_predictor_path(host, threads)}, which is then used by default"
           + (" (run it with the deployment's TVM_NUM_THREADS)" if foreign_threads else ""))
    busy = calibration is not None and calibration.status == "none-fallback" and calibration.measured_at
    fix = (f"Compile again when the host is quiet (a clean calibration is then kept for later compiles), or {fit}"
           if busy else fit[0].upper() + fit[1:])
    logger.warning("the CPU predictor %s %s: its CPU costs are %s. %s.", path, ", and ".join(what), done, fix)
