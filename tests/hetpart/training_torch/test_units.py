"""Module units of torch models: every parameter in exactly one unit, units in forward order, glue and skip edges.
(Tracing only: no TVM. Costing is tested in test_unit_costs.py.)"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hetpart.training_torch.errors import UnitMappingError  # noqa: E402
from hetpart.training_torch.units import map_units, record_calls, trace_model  # noqa: E402
from tests.hetpart.training_torch import toy_models  # noqa: E402

ZOO = [("squeezenet1_1", 32, 2), ("resnet18", 32, 2), ("bert_small", 8, 2), ("lstm_lm", 4, 2)]


def _zoo(name: str, size: int, batch: int):
    import models

    model, example = models.build_torch(name, batch=batch, size=size)
    return model, example


def _units(model, example, granularity: int = 1):
    return map_units(trace_model(model, example, granularity=granularity))


@pytest.mark.parametrize("name,size,batch", ZOO)
def test_every_parameter_belongs_to_exactly_one_unit(name, size, batch):
    model, example = _zoo(name, size, batch)
    traced = _units(model, example)
    owned = [p for u in traced.units for p in u.param_names]
    assert len(owned) == len(set(owned))
    assert set(owned) == {n for n, _ in model.named_parameters()}
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    for u in traced.units:
        assert u.param_bytes == sum(sizes[p] for p in u.param_names)


@pytest.mark.parametrize("name,size,batch", ZOO)
def test_units_follow_forward_execution_and_edges_go_forward(name, size, batch):
    model, example = _zoo(name, size, batch)
    traced = _units(model, example)
    _, _, order = record_calls(model, example)
    first_call = [order.index(u.name) for u in traced.units]
    assert first_call == sorted(first_call)
    assert all(e.src < e.dst for e in traced.edges)
    graph = traced.to_graph([{}] * len(traced.units))
    assert graph.num_ops == len(traced.units) and [n.name for n in graph.nodes] == [u.name for u in traced.units]


@pytest.mark.parametrize("name,size,batch", [("squeezenet1_1", 32, 2), ("bert_small", 8, 2)])
def test_chain_models_give_a_chain(name, size, batch):
    traced = _units(*_zoo(name, size, batch))
    assert [(e.src, e.dst) for e in traced.edges] == [(k, k + 1) for k in range(len(traced.units) - 1)]
    assert traced.inputs[0].consumers == (0,)
    assert traced.outputs[0].producer == len(traced.units) - 1


def test_expected_units_of_the_zoo():
    resnet = _units(*_zoo("resnet18", 32, 1))
    assert [u.name for u in resnet.units][4:8] == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]
    bert = _units(*_zoo("bert_small", 8, 1))
    assert [u.name for u in bert.units] == ["word_embeddings", "embedding_norm", "layers.0", "layers.1",
                                            "layers.2", "layers.3"]
    # the position embedding is never called: its weight is sliced in the root's forward (glue) and belongs to the
    # unit that runs before that glue, where the pipeline tracer puts it too
    assert "position_embeddings.weight" in bert.units[0].param_names
    assert {"slice.Tensor", "add.Tensor"} <= set(bert.units[0].glue_ops)
    # identical layers have equal signatures (costed once)
    assert len({u.signature for u in bert.units[2:]}) == 1 and bert.units[0].signature != bert.units[2].signature


def test_a_stateless_module_applied_twice_is_glue():
    lstm = _units(*_zoo("lstm_lm", 4, 1))
    assert [u.name for u in lstm.units] == ["encoder", "rnn", "decoder"]
    assert "dropout.default" in lstm.units[0].glue_ops


def test_a_skip_connection_across_units_is_an_edge():
    model, example = toy_models.skip_net(batch=3)
    traced = _units(model, example)
    assert [u.name for u in traced.units] == ["a", "b", "c"]
    edges = {(e.src, e.dst): e.size_bytes for e in traced.edges}
    assert edges == {(0, 1): 3 * 16 * 4, (0, 2): 3 * 16 * 4, (1, 2): 3 * 16 * 4}


def test_a_module_with_weights_running_twice_is_refused():
    model = toy_models.SharedLinear()
    with pytest.raises(UnitMappingError, match="runs 2 times"):
        trace_model(model, (torch.randn(2, 8),))


def test_granularity_two_cuts_blocks_into_their_layers():
    model, example = toy_models.toy_cnn(batch=2)
    coarse = [u.name for u in _units(model, example).units]
    fine = [u.name for u in _units(model, example, granularity=2).units]
    assert "blocks.0" in coarse and "blocks.0.conv1" not in coarse
    assert fine[fine.index("blocks.0.conv1") + 1] == "blocks.0.conv2"
    assert len(fine) > len(coarse)


def test_tracing_restores_every_training_flag():
    model, example = toy_models.toy_cnn(batch=2)
    model.train()
    model.blocks[5].eval()            # a user's own choice (a dropout switched off) must survive
    before = {n: m.training for n, m in model.named_modules()}
    _units(model, example)
    assert {n: m.training for n, m in model.named_modules()} == before
