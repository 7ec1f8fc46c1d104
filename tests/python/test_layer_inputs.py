"""gnnio.nn's SpMM-family layers (GCNConv, GraphConv, SAGEConv) on the inputs around the math:
bad edge_index, sizes and devices, graph caching and sharing, PyG EdgeIndex, empty graphs and
isolated nodes, a hub, and the shared-input linears. Outputs are compared with PyG's layer
under test_layers.py's precision rule."""

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex

import gnnio
import gnnio.nn
from graphs import hub, random_graph
from layer_pairs import (
    gcn_adds_loops, make_pair, gcn_weights, check_against_pyg, graph_inputs, call_with_weight,
    call_without_weight)


# ---------------------------------------------------------------------------------------------
# bad input

LAYERS = ["GCNConv", "GraphConv", "SAGEConv"]


def test_gcn_rejects_pairs_and_loops_without_normalisation(device):
    layer = gnnio.nn.GCNConv(4, 3).to(device)
    x = torch.randn(5, 4, device=device)
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    with pytest.raises(ValueError, match="tuple"):
        layer((x, x), ei)
    with pytest.raises(ValueError, match="tuple"):
        layer([x, x], ei)
    with pytest.raises(ValueError, match="self-loops"):
        gnnio.nn.GCNConv(4, 3, add_self_loops=True, normalize=False)
    # PyG raises the same errors
    with pytest.raises(ValueError):
        pyg_nn.GCNConv(4, 3).to(device)((x, x), ei)
    with pytest.raises(ValueError):
        pyg_nn.GCNConv(4, 3, add_self_loops=True, normalize=False)


@pytest.mark.parametrize("make,argument", [
    (lambda: gnnio.nn.SAGEConv(16, 8, aggr="lstm"), "aggr"),
    (lambda: gnnio.nn.SAGEConv(16, 8, aggr=["mean", "max"]), "aggr"),
    (lambda: gnnio.nn.GraphConv(16, 8, aggr="std"), "aggr"),
    (lambda: gnnio.nn.GCNConv(16, 8, flow="target_to_source"), "flow"),
    (lambda: gnnio.nn.GraphConv(16, 8, flow="target_to_source"), "flow"),
    (lambda: gnnio.nn.SAGEConv(16, 8, decomposed_layers=2), "decomposed_layers"),
    (lambda: gnnio.nn.GCNConv(16, 8, node_dim=0), "node_dim"),
    (lambda: gnnio.nn.GCNConv(16, 8, aggr="mean"), "aggr"),
], ids=["sage_max", "sage_list", "graph_max", "gcn_flow", "graph_flow", "sage_decomposed",
        "gcn_node_dim", "gcn_mean"])
def test_unsupported_arguments_raise_not_implemented(device, make, argument):
    with pytest.raises(NotImplementedError, match=argument):
        make().to(device)


def test_defaults_of_message_passing_arguments_are_accepted(device):
    x = torch.randn(3, 4, device=device)
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    for layer in (gnnio.nn.GCNConv(4, 3, aggr="add", flow="source_to_target", node_dim=-2),
                  gnnio.nn.GraphConv(4, 3, decomposed_layers=1),
                  gnnio.nn.SAGEConv(4, 3, flow="source_to_target")):
        assert layer.to(device)(x, ei).shape == (3, 3)


@pytest.mark.parametrize("name", LAYERS)
def test_bad_edge_index(device, name):
    layer = getattr(gnnio.nn, name)(4, 3).to(device)
    x = torch.randn(5, 4, device=device)
    for bad in ([[0, 1], [1, 5]], [[0, -1], [1, 2]], [[5, 0], [0, 1]], [[0, 1], [-3, 2]]):
        with pytest.raises(IndexError):
            layer(x, torch.tensor(bad, device=device))
    with pytest.raises(ValueError, match="integer"):
        layer(x, torch.tensor([[0.0, 1.0], [1.0, 2.0]], device=device))
    with pytest.raises(ValueError, match="shape"):
        layer(x, torch.tensor([[0, 1, 2]], device=device))
    # the layer still works afterwards (nothing was left half-built in its cache)
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    assert layer(x, ei).shape == (5, 3)


@pytest.mark.parametrize("name", LAYERS)
def test_int32_edge_index_matches_pyg(device, name):
    ei, n = random_graph(30, 100)
    pyg, ours = make_pair(name, 6, 4, device=device)
    ei = ei.to(device)
    x = torch.randn(n, 6, device=device)
    ei32 = ei.int()
    check_against_pyg(pyg, ours, lambda layer, t: layer(t["x"], ei32 if layer is ours else ei),
                      {"x": x})


@pytest.mark.parametrize("name", LAYERS)
def test_graph_with_wrong_node_count(device, name):
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    layer = getattr(gnnio.nn, name)(4, 3).to(device)
    with pytest.raises(ValueError, match="nodes|rows|num_src"):
        layer(torch.randn(n + 1, 4, device=device), g)
    with pytest.raises(ValueError):
        layer(torch.randn(n - 1, 4, device=device), g)


@pytest.mark.parametrize("name", ["GraphConv", "SAGEConv"])
def test_bipartite_size_mismatch(device, name):
    layer = getattr(gnnio.nn, name)(4, 3).to(device)
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    xs, xd = torch.randn(5, 4, device=device), torch.randn(6, 4, device=device)
    with pytest.raises(ValueError, match="x_dst"):
        layer((xs, xd), ei, size=(5, 7))
    with pytest.raises(ValueError, match="x_src"):
        layer((xs, xd), ei, size=(4, 6))
    with pytest.raises(IndexError):  # destination id 6 with only 6 destinations
        layer((xs, xd), torch.tensor([[0], [6]], device=device))


def test_features_on_another_device_than_the_graph(device):
    if device.type != "cuda":
        pytest.skip("needs a second device")
    ei = torch.tensor([[0, 1], [1, 2]])
    for name in LAYERS:
        layer = getattr(gnnio.nn, name)(4, 3).to(device)
        with pytest.raises(ValueError, match="on"):
            layer(torch.randn(3, 4, device=device), ei)


# ---------------------------------------------------------------------------------------------
# the Graph cache, gnnio.Graph and EdgeIndex inputs

@pytest.mark.parametrize("name", LAYERS)
def test_graph_cache_reuse_and_rebuild(device, name):
    ei, n = random_graph(30, 120)
    ei = ei.to(device)
    pyg, ours = make_pair(name, 6, 4, device=device)
    x = torch.randn(n, 6, device=device)
    call = call_without_weight(ei)
    check_against_pyg(pyg, ours, call, {"x": x})
    g1 = ours._graphs._graph
    assert isinstance(g1, gnnio.Graph)
    ours(x, ei)
    assert ours._graphs._graph is g1  # same tensor, unmodified: reused

    ei[0, 0] = (ei[0, 0] + 1) % n  # in place: the version counter moves
    ei[1, 5] = (ei[1, 5] + 7) % n
    check_against_pyg(pyg, ours, call, {"x": x})  # PyG sees the modified graph too
    g2 = ours._graphs._graph
    assert g2 is not g1
    assert torch.equal(g2.edge_index.long().cpu(), ei.cpu())

    clone = ei.clone()  # another tensor with the same values: a new Graph
    ours(x, clone)
    assert ours._graphs._graph is not g2

    # the same edge_index with more nodes (isolated ones): a new Graph with the new count
    x_big = torch.randn(n + 3, 6, device=device)
    check_against_pyg(pyg, ours, call_without_weight(clone), {"x": x_big})
    assert ours._graphs._graph.num_dst == n + 3


@pytest.mark.parametrize("name", LAYERS)
def test_gnnio_graph_input(device, name):
    ei, n = random_graph(30, 120)
    ei = ei.to(device)
    g = gnnio.Graph(ei, num_nodes=n)
    pyg, ours = make_pair(name, 6, 4, device=device)
    w = torch.rand(ei.size(1), device=device) if name != "SAGEConv" else None
    w, shadowed = gcn_weights(ei, w) if name == "GCNConv" else (w, None)
    inputs = {"x": torch.randn(n, 6, device=device), "edge_weight": w}

    def call(layer, t):
        graph = g if layer is ours else ei
        return layer(t["x"], graph) if w is None else layer(t["x"], graph, t["edge_weight"])
    check_against_pyg(pyg, ours, call, inputs, shadowed=shadowed)
    # again: the Graph's cached values are reused correctly
    check_against_pyg(pyg, ours, call, inputs, shadowed=shadowed)


def test_gnnio_graph_shared_between_layers(device):
    ei, n = random_graph(30, 120)
    ei = ei.to(device)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 6, device=device)
    for name in LAYERS:
        pyg, ours = make_pair(name, 6, 4, device=device)
        check_against_pyg(pyg, ours, lambda layer, t: layer(t["x"], g if layer is ours else ei),
                          {"x": x})
    g_bip = gnnio.Graph(ei[:, ei[1] < 20], size=(n, 20))
    for name in ["GraphConv", "SAGEConv"]:
        pyg, ours = make_pair(name, 6, 4, device=device)
        eib = g_bip.edge_index.long()
        check_against_pyg(pyg, ours, lambda layer, t: layer((t["x"], t["x"][:20]),
                                                            g_bip if layer is ours else eib),
                          {"x": x})


EDGE_INDEX_VARIANTS = [("unsorted", True), ("row", True), ("col", True), ("row", False),
                       ("row_isolated", False)]
EDGE_INDEX_IDS = ["unsorted_sized", "row_sorted_sized", "col_sorted_sized",
                  "row_sorted_unsized", "row_sorted_unsized_trailing_isolated"]
EDGE_INDEX_LAYERS = [("GCNConv", {}), ("GCNConv", {"add_self_loops": False}), ("GraphConv", {}),
                     ("SAGEConv", {})]


@pytest.mark.parametrize("name,opts", EDGE_INDEX_LAYERS, ids=["gcn", "gcn_no_loops", "graph", "sage"])
@pytest.mark.parametrize("order,sized", EDGE_INDEX_VARIANTS, ids=EDGE_INDEX_IDS)
def test_pyg_edge_index_input(device, name, opts, order, sized):
    # row_isolated: a sorted EdgeIndex without sparse_size whose largest id is below N - 1, so
    # its own CSC pointer (max id + 2 entries) does not fit the layer's N nodes.
    n = 30
    ei, _ = random_graph(n, 150)
    if order == "row_isolated":
        ei = ei % (n - 4)  # nodes n-4 .. n-1 neither send nor receive
    else:
        ids = torch.arange(n)
        ei[:, :n] = torch.stack([ids, ids.roll(1)])  # every id appears as src and dst
    w = torch.rand(ei.size(1))
    if order in ("row", "row_isolated"):
        perm = (ei[0] * n + ei[1]).argsort()
    elif order == "col":
        perm = (ei[1] * n + ei[0]).argsort()
    else:
        perm = torch.randperm(ei.size(1))
    ei, w = ei[:, perm].to(device), w[perm].to(device)
    shadowed = None
    if name == "GCNConv" and gcn_adds_loops(opts):
        w, shadowed = gcn_weights(ei, w)
    kw = {"sort_order": "col" if order == "col" else "row"} if order != "unsorted" else {}
    if sized:
        kw["sparse_size"] = (n, n)
    eix = EdgeIndex(ei, **kw)
    eix.validate()
    pyg, ours = make_pair(name, 6, 4, device=device, **opts)
    weighted = name != "SAGEConv"
    inputs = {"x": torch.randn(n, 6, device=device), "edge_weight": w if weighted else None}

    def call(layer, t):  # PyG gets the plain tensor: it is the reference, not under test
        graph = eix if layer is ours else ei
        return layer(t["x"], graph, t["edge_weight"]) if weighted else layer(t["x"], graph)
    check_against_pyg(pyg, ours, call, inputs, shadowed=shadowed)
    check_against_pyg(pyg, ours, call, inputs, shadowed=shadowed)  # cached Graph of the EdgeIndex


# ---------------------------------------------------------------------------------------------
# empty graphs and graphs without edges

@pytest.mark.parametrize("name", LAYERS)
def test_empty_graph(device, name):
    pyg, ours = make_pair(name, 6, 4, device=device)
    ei = torch.empty(2, 0, dtype=torch.long, device=device)
    x = torch.randn(0, 6, device=device)
    out = check_against_pyg(pyg, ours, call_without_weight(ei), {"x": x})
    assert out.shape == (0, 4)
    if name != "SAGEConv":
        out = check_against_pyg(pyg, ours, call_with_weight(ei),
                                {"x": x, "edge_weight": torch.rand(0, device=device)})
        assert out.shape == (0, 4)


@pytest.mark.parametrize("name,opts", [
    ("GCNConv", {}), ("GCNConv", {"improved": True}),
    ("GCNConv", {"add_self_loops": False}), ("GCNConv", {"normalize": False}),
    ("GraphConv", {"aggr": "add"}), ("GraphConv", {"aggr": "mean"}),
    ("SAGEConv", {}), ("SAGEConv", {"root_weight": False}),
], ids=["gcn", "gcn_improved", "gcn_no_loops", "gcn_no_normalize", "graph_add", "graph_mean",
        "sage", "sage_no_root"])
def test_nodes_without_edges_give_root_and_bias_only(device, name, opts):
    pyg, ours = make_pair(name, 6, 4, device=device, **opts)
    ei = torch.empty(2, 0, dtype=torch.long, device=device)
    x = torch.randn(9, 6, device=device)
    out = check_against_pyg(pyg, ours, call_without_weight(ei), {"x": x})
    # The aggregated part is exactly zero, so the output is exactly the root and bias terms.
    with torch.no_grad():
        if name == "GCNConv":
            root = ours.lin(x) if ours.add_self_loops else torch.zeros_like(out)
            expected = root + ours.bias
        elif name == "GraphConv":
            expected = ours.lin_rel.bias + ours.lin_root(x)
        else:
            expected = ours.lin_l.bias.expand_as(out)
            if ours.root_weight:
                expected = ours.lin_l.bias + ours.lin_r(x)
    assert torch.equal(out.detach(), expected)


# ---------------------------------------------------------------------------------------------
# hubs of 10^5 neighbours

@pytest.mark.slow
@pytest.mark.parametrize("name,opts", [
    ("GCNConv", {}), ("GraphConv", {"aggr": "add"}), ("GraphConv", {"aggr": "mean"}),
    ("SAGEConv", {}),
], ids=["gcn", "graph_add", "graph_mean", "sage"])
def test_hub_of_100k_neighbours(device, name, opts):
    ei, n = hub(100_000)
    ei = ei.to(device)
    pyg, ours = make_pair(name, 16, 8, device=device, **opts)
    weighted = name != "SAGEConv"
    inputs = graph_inputs(ei, n, 16, device, weighted)
    shadowed = None
    if name == "GCNConv":  # the hub receives ~10 self loops (src drawn uniformly, dst = 0)
        inputs["edge_weight"], shadowed = gcn_weights(ei, inputs["edge_weight"])
    call = call_with_weight(ei) if weighted else call_without_weight(ei)
    check_against_pyg(pyg, ours, call, inputs, shadowed=shadowed)


@pytest.mark.parametrize("biases", [(True, True), (True, False, True, True)])
def test_linears_of_one_input(biases):
    """The shared-input linears of GATv2Conv / TransformerConv (one autograd node, one d x
    buffer): float64 gradcheck of every input, and in float32 the plain linears' outputs (same
    bits: the same F.linear) and gradients (d x as a sum of the same products, summed in the
    same order; to fp32 rounding)."""
    from gnnio.nn._common import linears_of_one_input
    gen = torch.Generator().manual_seed(5)
    lins = [torch.nn.Linear(8, 6 + k, bias=b) for k, b in enumerate(biases)]
    x = torch.randn(40, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    params = [p for lin in lins for p in lin.double().parameters()]
    assert torch.autograd.gradcheck(lambda x, *p: linears_of_one_input(x, *lins), (x, *params))
    for lin in lins:
        lin.float()
    x32 = x.detach().float().requires_grad_()
    fused = linears_of_one_input(x32, *lins)
    plain = [lin(x32) for lin in lins]
    gouts = [torch.randn(y.shape, generator=gen) for y in plain]
    inputs = [x32] + [p for lin in lins for p in lin.parameters()]
    got = torch.autograd.grad(fused, inputs, gouts)
    want = torch.autograd.grad(plain, inputs, gouts)
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)
    for a, b in zip(got, want):
        # a sum of len(lins) GEMM results: rounding of len(lins) additions of the largest term
        assert (a - b).abs().max() <= 4 * len(lins) * torch.finfo(torch.float32).eps * b.abs().max()


def test_linears_of_one_input_respects_hooks_and_torch_func():
    """A hook on one of a layer's linears still runs (its module's own call is used), and
    torch.func.grad works through the fused node."""
    layer = gnnio.nn.GATv2Conv(8, 4, heads=2)
    ei, n = random_graph(30, 120, generator=torch.Generator().manual_seed(1))
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(2))
    calls = []
    handle = layer.lin_l.register_forward_hook(lambda *a: calls.append(1))
    layer(x, ei)
    handle.remove()
    assert calls == [1]
    from gnnio.nn._common import linears_of_one_input
    lins = [torch.nn.Linear(8, 3), torch.nn.Linear(8, 5)]
    g = torch.func.grad(lambda x: sum(y.square().sum() for y in linears_of_one_input(x, *lins)))(x)
    x_ = x.clone().requires_grad_()
    want, = torch.autograd.grad(sum(lin(x_).square().sum() for lin in lins), x_)
    # d x as a sum of the same two products in another order: a few roundings of the largest
    assert (g - want).abs().max() <= 8 * torch.finfo(torch.float32).eps * want.abs().max()
