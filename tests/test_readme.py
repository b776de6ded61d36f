"""The README's examples work: its Python blocks run as written, and every command line it shows parses."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _hetpart_command_lines() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            for command in line.split("&&"):
                command = command.split("#", 1)[0].strip()
                if command.startswith("hetpart "):
                    lines.append(command)
    return lines


def test_readme_starts_with_the_two_setup_commands():
    first = _blocks("bash")[0].strip().splitlines()
    assert len(first) == 2
    assert "hetpart compile" in first[0] and "pytest" in first[1]
    assert all(line.startswith("pip install") for line in first)


def test_every_readme_command_line_parses():
    from hetpart.driver.cli import build_parser

    commands = _hetpart_command_lines()
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:          # argparse exits on unknown options / choices
            pytest.fail(f"README command does not parse ({exc}): {command}")


@pytest.mark.tvm
@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_readme_python_examples_run(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _blocks("python")[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
