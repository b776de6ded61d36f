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
                         registry.shipped_cpu_predictor_path("x").parent.glob("cpu_*.json"))
        for name in shipped:
            if name != "default":
                assert registry.default_cpu_predictor_path(name).name == f"cpu_{name}.json"
    finally:
        registry.host_cpu_name.cache_clear()


def test_a_predictor_fitted_here_comes_before_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    shipped = registry.shipped_cpu_predictor_path("znver4")
    assert shipped.exists() and registry.default_cpu_predictor_path("znver4") == shipped
    fitted = registry.fitted_cpu_predictor_path("znver4")
    assert fitted == tmp_path / "predictors" / "cpu_znver4.json"
    fitted.parent.mkdir(parents=True)
    fitted.write_text(shipped.read_text())
    assert registry.default_cpu_predictor_path("znver4") == fitted


def test_fit_replaces_only_a_predictor_hetpart_wrote(tmp_path):
    import pytest

    from hetpart.errors import OutputDirError

    registry.check_predictor_output(tmp_path / "new.json")                     # free: fine
    ours = tmp_path / "ours.json"
    ours.write_text(registry.shipped_cpu_predictor_path("znver4").read_text())
    registry.check_predictor_output(ours)                                     # a predictor: may be replaced
    for name, text in (("notes.json", '{"mine": 1}'), ("notes.txt", "my notes")):
        theirs = tmp_path / name
        theirs.write_text(text)
        with pytest.raises(OutputDirError, match="not a predictor hetpart wrote.*-o"):
            registry.check_predictor_output(theirs)
        assert theirs.read_text() == text
    with pytest.raises(OutputDirError):
        registry.check_predictor_output(tmp_path)                             # a directory
