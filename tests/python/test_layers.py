"""gnnio.nn layers against torch_geometric.nn's: same state_dict, same forward and backward.

Precision rule (conftest.assert_no_worse_than_reference): on the same float32 inputs, gnnio's
error against PyG's layer run in float64 is at most 2x PyG's own float32 error, plus a floor of a
few ulp. It is applied to every output and every gradient (x, edge_weight, all parameters).
"""
import copy

import pytest
import torch

import gnnio
import gnnio.nn
from graphs import adversarial, random_graph, real
from layer_pairs import (
    gcn_adds_loops, make_pair, max_degree, shadowed_self_loops, gcn_weights, check_against_pyg,
    graph_inputs, call_with_weight, call_without_weight)

GRAPHS = [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()
GRAPH_IDS = [g[0] for g in GRAPHS]
DIMS = [(7, 5), (33, 130)]
DIM_IDS = ["7to5", "33to130"]


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
    terms = max_degree(ei) + 1 if opts.get("normalize", True) else 1
    check_against_pyg(pyg, ours, call_with_weight(ei), inputs, calls=calls, shadowed=shadowed,
                      edge_weight_terms=terms)


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
                {"normalize": True, "project": True, "bias": False, "root_weight": False},
                {"aggr": "add"}, {"aggr": "sum", "project": True}]
SAGE_IDS = ["default", "normalize", "no_root", "project", "no_bias", "all_flipped", "add",
            "sum_project"]


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
