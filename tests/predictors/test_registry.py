"""The predictor registry: which CPU predictor a host gets, and the override CI uses to act as an unknown CPU."""
from __future__ import annotations

from predictors import registry


def test_the_host_cpu_can_be_named_to_run_as_an_unknown_cpu(monkeypatch):
    monkeypatch.setenv(registry.HOST_CPU_ENV_VAR, "ci-unknown-cpu")
    registry.host_cpu_name.cache_clear()
    try:
        assert registry.host_cpu_name() == "ci-unknown-cpu"
        assert registry.default_cpu_predictor_path().name == registry.DEFAULT_CPU_PREDICTOR
        shipped = sorted(p.stem.removeprefix("cpu_") for p in
                         registry.cpu_predictor_path_for("x").parent.glob("cpu_*.json"))
        for name in shipped:
            if name != "default":
                assert registry.default_cpu_predictor_path(name).name == f"cpu_{name}.json"
    finally:
        registry.host_cpu_name.cache_clear()
