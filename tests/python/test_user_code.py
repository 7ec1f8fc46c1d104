"""What ordinary PyG user code does with a layer besides calling it on [N, F] features: pickle a
trained model, batched [B, N, F] features, [E, 1] edge weights, the MessagePassing attributes
and reprs it reads, forward hooks that keep a projection. Each against PyG's layer."""
import io
import pickle

import pytest
import torch

import gnnio
import gnnio.nn
from graphs import random_graph
from layer_pairs import check_against_pyg, make_pair

ALL = ["GCNConv", "GraphConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv"]


@pytest.mark.parametrize("name", ALL)
def test_a_called_model_pickles_and_runs_after(name):
    """torch.save(model) / multiprocessing pickle a model after training: the Graph cache is not
    part of the state (it is rebuilt at the next call)."""
    ei, n = random_graph(30, 120)
    x = torch.randn(n, 8)
    layer = getattr(gnnio.nn, name)(8, 4)
    before = layer(x, ei)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x, ei), before, rtol=0, atol=0)
    torch.testing.assert_close(pickle.loads(pickle.dumps(layer))(x, ei), before, rtol=0, atol=0)


@pytest.mark.parametrize("name,opts,weighted", [
    ("GCNConv", {}, True), ("GCNConv", {"normalize": False}, False),
    ("GraphConv", {"aggr": "mean"}, True), ("GraphConv", {"aggr": "max"}, False),
    ("SAGEConv", {}, False), ("SAGEConv", {"aggr": "max", "project": True}, False)])
@pytest.mark.parametrize("batch", [1, 2], ids=["B", "B1xB2"])
def test_batched_features_as_pyg_takes_them(device, name, opts, weighted, batch):
    """x [B, N, F] or [B1, B2, N, F] (node_dim=-2): feature sets on one graph, as temporal GNN
    code passes them. (No self loops: GCN's edge weights of shadowed duplicate loops are
    test_layers.py's case.)"""
    ei, n = random_graph(40, 200)
    ei = ei[:, ei[0] != ei[1]].to(device)
    pyg, ours = make_pair(name, 8, 5, device=device, **opts)
    lead = (3,) if batch == 1 else (2, 3)
    inputs = {"x": torch.randn(*lead, n, 8, device=device),
              "edge_weight": torch.rand(ei.size(1), device=device) if weighted else None}

    def call(layer, t):
        return layer(t["x"], ei, t["edge_weight"]) if weighted else layer(t["x"], ei)
    out = check_against_pyg(pyg, ours, call, inputs)
    assert out.shape == (*lead, n, 5) and out.is_contiguous()  # as PyG's, for user code's .view


@pytest.mark.parametrize("name,opts", [("GCNConv", {}), ("GCNConv", {"cached": True}),
                                       ("GraphConv", {})])
def test_edge_weight_of_shape_e_by_1(device, name, opts):
    """conv(x, edge_index, data.edge_attr) with one edge feature: PyG broadcasts [E, 1]."""
    ei, n = random_graph(40, 200)
    ei = ei[:, ei[0] != ei[1]].to(device)
    pyg, ours = make_pair(name, 8, 5, device=device, **opts)
    inputs = {"x": torch.randn(n, 8, device=device),
              "edge_weight": torch.rand(ei.size(1), 1, device=device)}
    check_against_pyg(pyg, ours, lambda layer, t: layer(t["x"], ei, t["edge_weight"]), inputs,
                      calls=2 if opts.get("cached") else 1)


@pytest.mark.parametrize("name,args,kwargs", [
    ("GCNConv", (8, 4), {}), ("GraphConv", (8, 4), {}), ("GraphConv", ((8, 6), 4), {"aggr": "max"}),
    ("SAGEConv", (8, 4), {}), ("SAGEConv", ((8, 6), 4), {"aggr": "max"}), ("SAGEConv", (-1, 4), {}),
    ("GATConv", (8, 4), {"heads": 2}), ("GATv2Conv", ((8, 6), 4), {}),
    ("TransformerConv", (8, 4), {"heads": 2})])
def test_attributes_and_repr_as_pyg(name, args, kwargs):
    import torch_geometric.nn as pyg_nn
    pyg, ours = getattr(pyg_nn, name)(*args, **kwargs), getattr(gnnio.nn, name)(*args, **kwargs)
    assert repr(ours) == repr(pyg)
    for attr in ("in_channels", "out_channels", "aggr", "flow", "node_dim"):
        assert getattr(ours, attr) == getattr(pyg, attr), attr


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_16_bit_model_under_another_16_bit_autocast(name):
    """A bf16 model under fp16 autocast: the projections come out in fp16, the attention vectors
    are bf16; the op runs in their promotion, float32, as PyG's does."""
    ei, n = random_graph(30, 120)
    x = torch.randn(n, 8).bfloat16()
    pyg, ours = make_pair(name, 8, 4, heads=2)
    pyg, ours = pyg.bfloat16(), ours.bfloat16()
    with torch.autocast("cpu", dtype=torch.float16):
        out, ref = ours(x, ei), pyg(x, ei)
    assert out.dtype == ref.dtype == torch.float32
    # both take the same bf16 weights and fp16 projections; GATv2 in PyG rounds x_i + x_j to
    # fp16 once more (eps 2^-10 of these O(1) values, through the softmax): 0.02 covers it
    torch.testing.assert_close(out, ref, rtol=0.02, atol=0.02)


def test_pickled_graph_gets_its_own_cache_key():
    """A Graph's cuSPARSE descriptors are keyed per process object: a copy (pickle, deepcopy,
    or a pickled cached GCNConv) registers a key of its own."""
    import copy
    ei, n = random_graph(30, 120)
    graph = gnnio.Graph(ei, n)
    keys = {graph.cache_key, pickle.loads(pickle.dumps(graph)).cache_key,
            copy.deepcopy(graph).cache_key}
    assert len(keys) == 3


def test_transformer_leaves_a_hooked_skip_projection_alone():
    """The skip's output takes the attention's in place only when nothing else can hold it."""
    layer = gnnio.nn.TransformerConv(8, 4, heads=2)
    kept = []
    layer.lin_skip.register_forward_hook(lambda module, args, out: kept.append(out))
    ei, n = random_graph(30, 120)
    x = torch.randn(n, 8)
    layer(x, ei)
    torch.testing.assert_close(kept[0], layer.lin_skip(x), rtol=0, atol=0)
