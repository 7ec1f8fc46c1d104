"""The layers' Graph caches share what they build from one edge_index tensor (_SharedGraphs): a
model's layers called with the same edge_index (each mini-batch's new one) build its Graph once.
Outputs are the per-layer build's bit for bit; an entry lives as long as its tensor; in-place
changes, other node counts and reset_parameters() are seen by every layer."""
import gc
import weakref

import pytest
import torch

import gnnio
import gnnio.nn
from gnnio.nn import _common
from graphs import random_graph

ALL = ["GCNConv", "GraphConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv"]


@pytest.fixture
def builds(monkeypatch):
    """The Graphs the layers' caches construct, in order."""
    made = []

    class Counted(gnnio.Graph):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(_common, "Graph", Counted)
    return made


def _model(name, device, layers=3):
    torch.manual_seed(0)
    return torch.nn.ModuleList([getattr(gnnio.nn, name)(6, 6) for _ in range(layers)]).to(device)


def _run(model, x, edge_indices):
    for layer, ei in zip(model, edge_indices):
        x = layer(x, ei).relu()
    return x


@pytest.mark.parametrize("name", ALL)
def test_layers_given_one_edge_index_build_one_graph(device, builds, name):
    ei, n = random_graph(40, 200)
    ei = ei.to(device)
    x = torch.randn(n, 6, device=device, requires_grad=True)
    model = _model(name, device)
    out = _run(model, x, [ei] * 3)
    out.square().sum().backward()
    assert len(builds) == 1
    assert all(layer._graphs._graph is builds[0] for layer in model)
    # the same bits as each layer building its own (clones: other tensors, so no sharing)
    shared_grad, x.grad = x.grad, None
    clones = [ei.clone() for _ in range(3)]
    separate = _run(model, x, clones)
    separate.square().sum().backward()
    assert len(builds) == 4
    assert torch.equal(out, separate) and torch.equal(x.grad, shared_grad)


def test_a_batch_graph_goes_with_its_batch(builds):
    """Mini-batches: each new edge_index is built once, and its Graph is freed with it (the
    layers' own caches hold their last Graph, not the tensor)."""
    model = _model("GATConv", "cpu", layers=2)
    gc.collect()
    before = len(_common._SHARED._entries)  # (other tests' tensors still alive)
    refs = []
    for _ in range(3):
        ei, n = random_graph(40, 200)
        _run(model, torch.randn(n, 6), [ei, ei])
        refs.append(weakref.ref(ei))
        del ei
    gc.collect()
    assert len(builds) == 3 and all(r() is None for r in refs)
    assert len(_common._SHARED._entries) == before


def test_in_place_change_rebuilds_once_for_every_layer(device, builds):
    ei, n = random_graph(40, 200)
    ei = ei.to(device)
    x = torch.randn(n, 6, device=device)
    model = _model("SAGEConv", device)
    _run(model, x, [ei] * 3)
    ei[0, :10] = (ei[0, :10] + 1) % n  # the version counter moves
    after = _run(model, x, [ei] * 3)
    assert len(builds) == 2
    assert torch.equal(after, _run(model, x, [ei.clone() for _ in range(3)]))


def test_other_node_counts_get_their_own_graph(builds):
    """Bipartite layers of different sizes on one edge_index: a Graph each, and the right one."""
    ei, _ = random_graph(20, 100)
    a, b = gnnio.nn.SAGEConv((6, 6), 4), gnnio.nn.SAGEConv((6, 6), 4)
    x_src = torch.randn(20, 6)
    for _ in range(2):
        out_a = a((x_src, torch.randn(20, 6)), ei)
        out_b = b((x_src, torch.randn(25, 6)), ei)
    assert out_a.shape == (20, 4) and out_b.shape == (25, 4)
    assert a._graphs._graph.num_dst == 20 and b._graphs._graph.num_dst == 25
    assert len(builds) == 2  # (the shared entry holds b's now; a's own cache keeps a's)


def test_reset_parameters_forgets_the_shared_graph(builds):
    """Writes that bypass the version counter are seen after reset_parameters(), as documented,
    now that other layers could hand the old Graph back."""
    ei, n = random_graph(40, 200)
    x = torch.randn(n, 6)
    model = _model("GCNConv", "cpu", layers=2)
    _run(model, x, [ei, ei])
    ei.data[0, :10] = (ei[0, :10] + 1) % n  # .data: no version bump
    for layer in model:
        state = layer.state_dict()
        layer.reset_parameters()
        layer.load_state_dict(state)
    after = _run(model, x, [ei, ei])
    assert len(builds) == 2
    assert torch.equal(after, _run(model, x, [ei.clone(), ei.clone()]))


def test_reset_parameters_forgets_graphs_of_earlier_tensors_too():
    """(A reviewer's finding: reset dropped only the shared Graph of each layer's last tensor, so
    training on ei_train, evaluating on ei_full, writing ei_train through .data and resetting
    every layer still served ei_train's old Graph.)"""
    n = 20
    x = torch.randn(n, 4)
    model = torch.nn.ModuleList([gnnio.nn.SAGEConv(4, 4, aggr="sum") for _ in range(2)])

    def run(ei):
        return model[1](model[0](x, ei).relu(), ei)
    ei_train, ei_full = torch.randint(0, n, (2, 50)), torch.randint(0, n, (2, 80))
    run(ei_train)
    run(ei_full)
    ei_train.data[0] = (ei_train[0] + 1) % n
    for layer in model:
        state = layer.state_dict()
        layer.reset_parameters()
        layer.load_state_dict(state)
    assert torch.equal(run(ei_train), run(ei_train.clone()))


@pytest.mark.parametrize("coalesced", [True, False])
def test_sparse_adjacency_batches_are_freed(coalesced):
    """(A reviewer's finding: a kept edge weight held the adjacency's values, a view of it, so
    neither the adjacency nor its shared Graph was ever freed.) The Graph keeps its weights by
    weak reference now; a layer's private coalesced copy is not shared."""
    n, layer, refs = 200, gnnio.nn.GINConv(torch.nn.Identity()), []
    x = torch.randn(n, 8)
    gc.collect()
    before = len(_common._SHARED._entries)
    for _ in range(5):
        adj = torch.sparse_coo_tensor(torch.randint(0, n, (2, 2000)), torch.rand(2000), (n, n))
        adj = adj.coalesce() if coalesced else adj
        layer(x, adj)
        refs.append(weakref.ref(adj))
        del adj
    layer(x, torch.randint(0, n, (2, 5)))  # the layer moves on
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert len(_common._SHARED._entries) <= before + 1  # (the last edge_index's)


def test_a_graph_with_kept_weights_pickles():
    import copy
    import pickle
    ei, n = random_graph(20, 60)
    w = torch.rand(60)
    g = gnnio.Graph(ei, num_nodes=n)
    kept = g.slot_weights(w, torch.float32)
    for other in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
        assert torch.equal(other.slot_weights(w, torch.float32), kept)
