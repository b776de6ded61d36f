"""One TVM thread policy for every entry point (hetpart.threads): profiles and deployments use the same count."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hetpart.threads import deployment_threads, ensure_tvm_threads


@pytest.mark.parametrize("value, expected", [("3", 3), (" 1 ", 1), ("0", None), ("two", None), ("", None)])
def test_deployment_threads_reads_a_positive_setting_else_uses_every_core(monkeypatch, value, expected):
    monkeypatch.setenv("TVM_NUM_THREADS", value)
    assert deployment_threads() == (expected or os.cpu_count())


def test_ensure_keeps_the_users_setting_and_fills_in_every_core(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert ensure_tvm_threads() == 1 and os.environ["TVM_NUM_THREADS"] == "1"
    monkeypatch.delenv("TVM_NUM_THREADS")
    assert ensure_tvm_threads() == os.cpu_count() and os.environ["TVM_NUM_THREADS"] == str(os.cpu_count())


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2+ cores: TVM's own default (half the cores) and "
                                                      "hetpart's (every core) only differ there")
def test_every_cli_command_starts_tvm_with_every_core():
    # `hetpart profile` once ran with TVM's default of half the cores (1 thread here) while compiled models ran
    # with both, so its labels were 1.4x-7x slow. The CLI now sets the count before any subcommand loads TVM.
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    code = ("from hetpart.driver.cli import main; main(['zoo']); import tvm; "
            "print('threads', tvm.get_global_func('runtime.NumThreads')())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"threads {os.cpu_count()}" in out.stdout


def test_a_restricted_pool_gives_the_thread_every_core_back():
    """After restricted_pool(1, (core,)) the calling thread may run on every core again (TVM keeps the core list
    of its last configuration, so a careless restore leaves the thread pinned)."""
    import os

    import pytest

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs a process allowed on two cores")
    from tvm_passes.thread_pool import pool_threads_wanted, restricted_pool

    with restricted_pool(1, (cores[-1],)):
        assert sorted(os.sched_getaffinity(0)) == [cores[-1]] and pool_threads_wanted() == 1
    assert sorted(os.sched_getaffinity(0)) == cores
