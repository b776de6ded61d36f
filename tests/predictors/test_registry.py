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


def test_a_predictor_for_the_device_s_thread_count_comes_before_the_cpu_s_every_core_one(tmp_path, monkeypatch):
    """A CPU device of one core on a 2-core host prices its kernels with a predictor timed at one thread when there
    is one (fitted here first, then shipped), else with the CPU's every-core predictor, else the default."""
    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(registry.os, "cpu_count", lambda: 2)
    assert registry.cpu_predictor_filename("znver4") == "cpu_znver4.json"
    assert registry.cpu_predictor_filename("znver4", 2) == "cpu_znver4.json"
    assert registry.cpu_predictor_filename("znver4", 1) == "cpu_znver4_threads1.json"
    shipped = registry.shipped_cpu_predictor_path("znver4")
    assert registry.default_cpu_predictor_path("znver4", threads=1) == shipped
    one_thread = registry.fitted_cpu_predictor_path("znver4", 1)
    one_thread.parent.mkdir(parents=True)
    one_thread.write_text(shipped.read_text())
    assert registry.default_cpu_predictor_path("znver4", threads=1) == one_thread
    assert registry.default_cpu_predictor_path("znver4", threads=2) == shipped
    assert registry.resolve_cpu_predictor_path(None, threads=1) == registry.default_cpu_predictor_path(threads=1)
    assert registry.default_cpu_predictor_path("no-such-cpu", threads=1).name == registry.DEFAULT_CPU_PREDICTOR


def test_fit_names_its_predictor_by_the_thread_count_the_database_was_timed_with(tmp_path, monkeypatch):
    import argparse

    from hetpart.driver import cli_predictors
    from tests.predictors.profiling.test_zoo_profile import build_fake_db

    monkeypatch.setenv("HETPART_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "host_cpu_name", lambda: "znver4")
    db = tmp_path / "p.sqlite"
    build_fake_db(db)                                     # timed with 2 threads
    parser = argparse.ArgumentParser()
    cli_predictors.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fit", "--db", str(db)])
    for cores, name in ((4, "cpu_znver4_threads2.json"), (2, "cpu_znver4.json")):
        monkeypatch.setattr(registry.os, "cpu_count", lambda cores=cores: cores)
        assert args.func(args) == 0
        assert (tmp_path / "predictors" / name).exists()
        assert registry.default_cpu_predictor_path("znver4", threads=2) == tmp_path / "predictors" / name
