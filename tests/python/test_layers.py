"""gnnio.nn layers against torch_geometric.nn's: same state_dict, same forward and backward.

Precision rule (conftest.assert_no_worse_than_reference): on the same float32 inputs, gnnio's
error against PyG's layer run in float64 is at most 2x PyG's own float32 error, plus a floor of a
few ulp. It is applied to every output and every gradient (x, edge_weight, all parameters).
"""
import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex

import gnnio
import gnnio.nn
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real

GRAPHS = [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()
GRAPH_IDS = [g[0] for g in GRAPHS]
DIMS = [(7, 5), (33, 130)]
DIM_IDS = ["7to5", "33to130"]


def gcn_adds_loops(opts):
    return opts.get("add_self_loops", opts.get("normalize", True))


# ---------------------------------------------------------------------------------------------
# helpers

def make_pair(name, *args, device="cpu", **kwargs):
    """The PyG layer and the gnnio layer of the same class and arguments, with equal weights.
    Checks that the state_dicts have the same keys and load into each other strictly, both ways."""
    pyg = getattr(pyg_nn, name)(*args, **kwargs)
    ours = getattr(gnnio.nn, name)(*args, **kwargs)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    # gnnio -> PyG (a PyG layer reading a gnnio checkpoint) ...
    pyg.load_state_dict(ours.state_dict(), strict=True)
    for k, v in ours.state_dict().items():
        assert torch.equal(pyg.state_dict()[k], v), k
    # ... and PyG -> gnnio, with fresh PyG weights so the copy is not a no-op.
    pyg.reset_parameters()
    with torch.no_grad():
        for p in pyg.parameters():  # PyG zeros some biases; make every parameter informative
            p.add_(torch.randn_like(p) * 0.1)
    ours.load_state_dict(pyg.state_dict(), strict=True)
    for k, v in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    return pyg.to(device), ours.to(device)


EPS32 = torch.finfo(torch.float32).eps


def _close(what, ours, theirs, exact):
    assert ours.shape == exact.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(exact.shape)}"
    # The floor the rule intends: 8 float32 ulp of the output's scale. (Passed explicitly:
    # conftest's default converts `ours` to float64 before it picks eps, so it would take
    # float64's eps and the floor would vanish.)
    scale = exact.detach().abs().max().item() if exact.numel() else 0.0
    try:
        assert_no_worse_than_reference(ours, theirs, exact, floor=8 * EPS32 * max(scale, 1.0))
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def shadowed_self_loops(ei):
    """Mask of the self loops that a later loop of the same node overrides. GCN's
    add_remaining_self_loops keeps the last loop's weight (`loop_attr[i] = w`, last write wins),
    so the output does not depend on the others' weights. PyG's autograd of that index_put still
    hands every duplicate the full gradient; gnnio gives them 0, the true derivative."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    loops = (src == dst).nonzero().view(-1)
    last = torch.full((int(src.max()) + 1 if src.numel() else 0,), -1, dtype=torch.long)
    last.scatter_reduce_(0, src[loops], loops, reduce="amax")
    mask = torch.zeros(src.numel(), dtype=torch.bool)
    mask[loops] = last[src[loops]] != loops
    return mask.to(ei.device), last.to(ei.device)


def gcn_weights(ei, w):
    """edge_weight for GCN with self loops: duplicate loops of a node get the weight of its last
    loop, so the output is the same whichever loop PyG's index_put lets win (on CUDA it is not
    defined). Returns (w, mask of the shadowed loops)."""
    mask, last = shadowed_self_loops(ei)
    if mask.any():
        w = w.clone()
        w[mask] = w[last[ei[0][mask]]]
    return w, mask


def check_against_pyg(pyg, ours, call, inputs, calls=1, shadowed=None, exact_call=None):
    """Runs `call(layer, inputs)` with PyG in float32, gnnio in float32 and PyG in float64 (the
    exact reference), all on the same inputs and the same upstream gradient, and checks the output
    and the gradients of every input in `inputs` and of every parameter. `calls` > 1 repeats the
    forward on the same inputs (cached layers) and differentiates the last output.
    `shadowed` (a mask over edges): edge weights the output does not depend on (see
    shadowed_self_loops); gnnio's gradient must be exactly 0 there, PyG's is not compared.
    `exact_call` (default `call`) is what the float64 reference runs; it starts uncached."""
    exact = copy.deepcopy(pyg).double()
    for attr in ("_cached_edge_index", "_cached_adj_t"):  # a float32 cache would spoil float64
        if hasattr(exact, attr):
            setattr(exact, attr, None)
    runs = {}
    for key, layer, dtype in [("pyg", pyg, torch.float32), ("ours", ours, torch.float32),
                              ("exact", exact, torch.float64)]:
        leaves = {k: None if v is None else v.detach().to(dtype).requires_grad_()
                  for k, v in inputs.items()}
        fn = exact_call if key == "exact" and exact_call is not None else call
        for _ in range(calls):
            out = fn(layer, leaves)
        runs[key] = (layer, leaves, out)
    (_, in_p, out_p), (_, in_o, out_o), (_, in_e, out_e) = runs["pyg"], runs["ours"], runs["exact"]
    assert out_o.dtype == out_p.dtype and out_o.device == out_p.device
    assert not torch.isnan(out_o).any()
    _close("output", out_o, out_p, out_e)

    gout = torch.randn(out_p.shape, device=out_p.device)
    out_p.backward(gout)
    out_o.backward(gout)
    out_e.backward(gout.double())

    def grad(t):
        return torch.zeros_like(t) if t.grad is None else t.grad

    for k in inputs:
        if inputs[k] is not None and k != "edge_weight":
            _close(f"grad of {k}", grad(in_o[k]), grad(in_p[k]), grad(in_e[k]))
    params_p, params_o = dict(pyg.named_parameters()), dict(ours.named_parameters())
    params_e = dict(exact.named_parameters())
    assert set(params_o) == set(params_p)
    for name in params_p:
        _close(f"grad of {name}", grad(params_o[name]), grad(params_p[name]), grad(params_e[name]))
    if inputs.get("edge_weight") is not None:  # last, so that everything else is checked first
        k = "edge_weight"
        g_o, g_p, g_e = grad(in_o[k]), grad(in_p[k]), grad(in_e[k])
        if shadowed is not None and shadowed.any():
            assert torch.equal(g_o[shadowed], torch.zeros_like(g_o[shadowed]))
            g_o, g_p, g_e = g_o[~shadowed], g_p[~shadowed], g_e[~shadowed]
        _close("grad of edge_weight", g_o, g_p, g_e)
    return out_o


def graph_inputs(ei, n, f_in, device, weighted):
    x = torch.randn(n, f_in, device=device)
    w = torch.rand(ei.size(1), device=device) if weighted else None
    return {"x": x, "edge_weight": w}


def call_with_weight(ei):
    return lambda layer, t: layer(t["x"], ei, t["edge_weight"])


def call_without_weight(ei):
    return lambda layer, t: layer(t["x"], ei)


# ---------------------------------------------------------------------------------------------
# forward + backward on real and adversarial graphs

GCN_OPTIONS = [{}, {"improved": True}, {"add_self_loops": False}, {"normalize": False},
               {"bias": False}, {"cached": True}]
GCN_IDS = ["default", "improved", "no_loops", "no_normalize", "no_bias", "cached"]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("opts", GCN_OPTIONS, ids=GCN_IDS)
@pytest.mark.parametrize("f_in,f_out", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("name,ei,n", GRAPHS, ids=GRAPH_IDS)
def test_gcn_conv(device, name, ei, n, f_in, f_out, opts, weighted):
    pyg, ours = make_pair("GCNConv", f_in, f_out, device=device, **opts)
    ei = ei.to(device)
    inputs = graph_inputs(ei, n, f_in, device, weighted)
    shadowed = None
    if weighted and gcn_adds_loops(opts):
        inputs["edge_weight"], shadowed = gcn_weights(ei, inputs["edge_weight"])
    calls = 2 if opts.get("cached") else 1
    check_against_pyg(pyg, ours, call_with_weight(ei), inputs, calls=calls, shadowed=shadowed)


def test_gcn_duplicate_self_loops(device):
    # node 1 has loops at edges 1 and 4 (edge 4 wins), node 3 at 5, 6 and 7 (edge 7 wins)
    ei = torch.tensor([[0, 1, 2, 0, 1, 3, 3, 3, 2], [1, 1, 0, 2, 1, 3, 3, 3, 3]], device=device)
    n = 5
    x = torch.randn(n, 6, device=device)
    w = torch.rand(ei.size(1), device=device) + 0.1
    mask, _ = shadowed_self_loops(ei)
    assert mask.cpu().tolist() == [False, True, False, False, False, True, True, False, False]
    for opts in ({}, {"improved": True}):
        pyg, ours = make_pair("GCNConv", 6, 4, device=device, **opts)
        w_eq, shadowed = gcn_weights(ei, w)
        check_against_pyg(pyg, ours, call_with_weight(ei), {"x": x, "edge_weight": w_eq},
                          shadowed=shadowed)
        # with different weights on the duplicates the last loop's weight is the one used
        wo = w.clone().requires_grad_()
        out = ours(x, ei, wo)
        w_last = w.clone()
        w_last[mask] = 123.0  # changing a shadowed weight changes nothing
        torch.testing.assert_close(ours(x, ei, w_last), out, rtol=0, atol=0)
        out.sum().backward()
        assert torch.equal(wo.grad[mask], torch.zeros_like(wo.grad[mask]))
        layer = copy.deepcopy(ours).double()
        x64 = x.double().requires_grad_()
        w64 = w.double().requires_grad_()
        assert torch.autograd.gradcheck(lambda a, b: layer(a, ei, b), (x64, w64))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("aggr", ["add", "mean"])
@pytest.mark.parametrize("f_in,f_out", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("name,ei,n", GRAPHS, ids=GRAPH_IDS)
def test_graph_conv(device, name, ei, n, f_in, f_out, aggr, bias, weighted):
    pyg, ours = make_pair("GraphConv", f_in, f_out, aggr=aggr, bias=bias, device=device)
    ei = ei.to(device)
    check_against_pyg(pyg, ours, call_with_weight(ei), graph_inputs(ei, n, f_in, device, weighted))


SAGE_OPTIONS = [{}, {"normalize": True}, {"root_weight": False}, {"project": True}, {"bias": False},
                {"normalize": True, "project": True, "bias": False, "root_weight": False}]
SAGE_IDS = ["default", "normalize", "no_root", "project", "no_bias", "all_flipped"]


@pytest.mark.parametrize("opts", SAGE_OPTIONS, ids=SAGE_IDS)
@pytest.mark.parametrize("f_in,f_out", DIMS, ids=DIM_IDS)
@pytest.mark.parametrize("name,ei,n", GRAPHS, ids=GRAPH_IDS)
def test_sage_conv(device, name, ei, n, f_in, f_out, opts):
    pyg, ours = make_pair("SAGEConv", f_in, f_out, device=device, **opts)
    ei = ei.to(device)
    check_against_pyg(pyg, ours, call_without_weight(ei), graph_inputs(ei, n, f_in, device, False))


def test_gcn_improved_follows_pyg_2_8(device):
    """PyG 2.8's gcn_norm adds the self loops before it fills a missing edge_weight with ones, so
    `improved` (loops of weight 2) only acts when an edge_weight is passed. gnnio does the same."""
    ei, n = random_graph(30, 100)
    ei = ei.to(device)
    x = torch.randn(n, 6, device=device)
    ones = torch.ones(ei.size(1), device=device)
    pyg, ours = make_pair("GCNConv", 6, 4, improved=True, device=device)
    check_against_pyg(pyg, ours, call_without_weight(ei), {"x": x})
    _, shadowed = gcn_weights(ei, ones)  # duplicate loops: see shadowed_self_loops
    check_against_pyg(pyg, ours, call_with_weight(ei), {"x": x, "edge_weight": ones},
                      shadowed=shadowed)
    plain = gnnio.nn.GCNConv(6, 4).to(device)
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert torch.equal(ours(x, ei), plain(x, ei))
        assert not torch.equal(ours(x, ei, ones), plain(x, ei, ones))


def test_gcn_cached_keeps_the_first_graph_like_pyg(device):
    (ei1, n), (ei2, _) = random_graph(40, 150), random_graph(40, 170)
    ei1, ei2 = ei1.to(device), ei2.to(device)
    pyg, ours = make_pair("GCNConv", 6, 4, cached=True, device=device)
    x = torch.randn(n, 6, device=device)
    on1, on2 = (lambda layer, t: layer(t["x"], ei1)), (lambda layer, t: layer(t["x"], ei2))
    ours(x, ei1)
    check_against_pyg(pyg, ours, on1, {"x": x})
    # Both layers now hold ei1's normalisation and ignore ei2, as PyG documents for cached=True:
    # the reference is an uncached layer on ei1.
    check_against_pyg(pyg, ours, on2, {"x": x}, exact_call=on1)
    assert torch.equal(ours._cached_graph.edge_index.long(), ei1)
    # reset_parameters clears the cache: ei2 is used from then on. Reset both, equal weights again.
    pyg.reset_parameters()
    ours.reset_parameters()
    assert ours._cached_graph is None
    ours.load_state_dict(pyg.state_dict())
    check_against_pyg(pyg, ours, on2, {"x": x})


def test_edge_weight_gradient_with_wide_features(device):
    # 2^16 features: each edge_weight gradient is one 65536-term dot product (SDDMM). PyG's
    # error grows like log(F) (pairwise sum); a float32 running sum's like sqrt(F) to F, which
    # broke the rule every time here before the CPU SDDMM accumulated in double.
    ei, n = random_graph(50, 500)
    pyg, ours = make_pair("GraphConv", 1 << 16, 2, device=device)
    ei = ei.to(device)
    check_against_pyg(pyg, ours, call_with_weight(ei), graph_inputs(ei, n, 1 << 16, device, True))


# ---------------------------------------------------------------------------------------------
# bipartite graphs

BIPARTITE_SIZES = [(13, 40), (40, 13)]
BIPARTITE_DIMS = [((7, 9), 5), ((33, 4), 130)]
MODES = ["pair", "pair_with_size", "src_only_with_size"]


def bipartite_inputs(ns, nd, dims, device, weighted, num_edges=200):
    ei = torch.stack([torch.randint(ns, (num_edges,)), torch.randint(nd, (num_edges,))]).to(device)
    (fs, fd), _ = dims
    t = {"x_src": torch.randn(ns, fs, device=device), "x_dst": torch.randn(nd, fd, device=device)}
    if weighted:
        t["edge_weight"] = torch.rand(num_edges, device=device)
    return ei, t


def bipartite_call(ei, ns, nd, mode, weighted):
    def call(layer, t):
        kw = {"edge_weight": t["edge_weight"]} if weighted else {}
        if mode == "pair":
            return layer((t["x_src"], t["x_dst"]), ei, **kw)
        if mode == "pair_with_size":
            return layer((t["x_src"], t["x_dst"]), ei, size=(ns, nd), **kw)
        return layer((t["x_src"], None), ei, size=(ns, nd), **kw)
    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("aggr", ["add", "mean"])
@pytest.mark.parametrize("dims", BIPARTITE_DIMS, ids=["7.9to5", "33.4to130"])
@pytest.mark.parametrize("ns,nd", BIPARTITE_SIZES, ids=["src<dst", "src>dst"])
def test_graph_conv_bipartite(device, ns, nd, dims, aggr, weighted, mode):
    pyg, ours = make_pair("GraphConv", dims[0], dims[1], aggr=aggr, device=device)
    ei, t = bipartite_inputs(ns, nd, dims, device, weighted)
    if mode == "src_only_with_size":
        del t["x_dst"]
    out = check_against_pyg(pyg, ours, bipartite_call(ei, ns, nd, mode, weighted), t)
    assert out.shape == (nd, dims[1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("opts", [{}, {"normalize": True, "project": True}, {"root_weight": False}],
                         ids=["default", "normalize_project", "no_root"])
@pytest.mark.parametrize("dims", BIPARTITE_DIMS, ids=["7.9to5", "33.4to130"])
@pytest.mark.parametrize("ns,nd", BIPARTITE_SIZES, ids=["src<dst", "src>dst"])
def test_sage_conv_bipartite(device, ns, nd, dims, opts, mode):
    pyg, ours = make_pair("SAGEConv", dims[0], dims[1], device=device, **opts)
    ei, t = bipartite_inputs(ns, nd, dims, device, False)
    if mode == "src_only_with_size":
        del t["x_dst"]
    out = check_against_pyg(pyg, ours, bipartite_call(ei, ns, nd, mode, False), t)
    assert out.shape == (nd, dims[1])


# ---------------------------------------------------------------------------------------------
# gradcheck in float64

@pytest.mark.parametrize("opts", [{}, {"improved": True}, {"add_self_loops": False},
                                  {"normalize": False}], ids=["default", "improved", "no_loops",
                                                              "no_normalize"])
def test_gcn_gradcheck(device, opts):
    ei, n = random_graph(12, 40)
    ei = torch.cat([ei, torch.tensor([[3, 5], [3, 5]])], 1).to(device)  # existing self loops too
    layer = gnnio.nn.GCNConv(3, 2, **opts).double().to(device)
    x = torch.randn(n, 3, dtype=torch.float64, device=device, requires_grad=True)
    w = (torch.rand(ei.size(1), dtype=torch.float64, device=device) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: layer(x, ei, w), (x, w))
    assert torch.autograd.gradcheck(lambda x: layer(x, ei), (x,))


@pytest.mark.parametrize("aggr", ["add", "mean"])
def test_graph_conv_gradcheck(device, aggr):
    ei, n = random_graph(12, 40)
    ei = ei.to(device)
    layer = gnnio.nn.GraphConv(3, 2, aggr=aggr).double().to(device)
    x = torch.randn(n, 3, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: layer(x, ei, w), (x, w))
    # bipartite, gradients w.r.t. both sides and the weights
    eib = torch.stack([torch.randint(5, (30,)), torch.randint(9, (30,))]).to(device)
    bip = gnnio.nn.GraphConv((3, 4), 2, aggr=aggr).double().to(device)
    xs = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    xd = torch.randn(9, 4, dtype=torch.float64, device=device, requires_grad=True)
    wb = torch.rand(30, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, w: bip((a, b), eib, w), (xs, xd, wb))


@pytest.mark.parametrize("opts", [{}, {"normalize": True}, {"project": True}],
                         ids=["default", "normalize", "project"])
def test_sage_conv_gradcheck(device, opts):
    ei, n = random_graph(12, 40)
    ei = ei.to(device)
    layer = gnnio.nn.SAGEConv(3, 2, **opts).double().to(device)
    x = torch.randn(n, 3, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x, ei), (x,))
    eib = torch.stack([torch.randint(9, (30,)), torch.randint(5, (30,))]).to(device)
    bip = gnnio.nn.SAGEConv((3, 4), 2, **opts).double().to(device)
    xs = torch.randn(9, 3, dtype=torch.float64, device=device, requires_grad=True)
    xd = torch.randn(5, 4, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: bip((a, b), eib), (xs, xd))


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
    (lambda: gnnio.nn.GCNConv(-1, 8), "channel"),
    (lambda: gnnio.nn.GraphConv(-1, 8), "channel"),
    (lambda: gnnio.nn.GraphConv((16, -1), 8), "channel"),
    (lambda: gnnio.nn.SAGEConv(-1, 8), "channel"),
], ids=["sage_max", "sage_list", "graph_max", "gcn_flow", "graph_flow", "sage_decomposed",
        "gcn_node_dim", "gcn_mean", "gcn_lazy", "graph_lazy", "graph_lazy_dst", "sage_lazy"])
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
