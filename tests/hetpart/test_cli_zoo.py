"""`hetpart zoo`: every model with its default input, what --size sets for it and the sizes it takes."""
from __future__ import annotations

import models
from hetpart.driver import cli


def test_zoo_lists_what_size_means_for_each_model(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    args = cli.build_parser().parse_args(["zoo"])
    assert args.func(args) == 0
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("│")}
    assert set(rows) == set(models.ZOO)
    for name, info in models.ZOO.items():
        family, kind, shape, size_is, sizes, _gmacs = rows[name]
        assert (family, kind, size_is) == (info.family, info.kind, info.size_meaning)
        assert shape == "x".join(map(str, info.input_shape()))
        assert sizes.startswith(f"{info.min_size}-{info.max_size}" if info.max_size else f">= {info.min_size}")
    assert rows["yolo_detector"][4].endswith("multiples of 32")
    assert rows["lstm_speaker"][3] != rows["resnet18"][3]
