"""The attention family on CPU: gnnio.ops.gat_attention (fused online softmax, lse saved,
weights recomputed in the backward) and gnnio.nn.GATConv against PyG."""
import copy

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real

pyg_nn = pytest.importorskip("torch_geometric.nn")


def cases():
    return [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()


def run_pair(pyg, ours, call):
    """Outputs and gradients (x and every parameter) of PyG fp32, gnnio fp32 and PyG fp64."""
    exact = copy.deepcopy(pyg).double()
    results = []
    for module, dtype in ((pyg, torch.float32), (ours, torch.float32), (exact, torch.float64)):
        out, inputs = call(module, dtype)
        gout = torch.ones_like(out) if out.numel() == 0 else torch.cos(torch.arange(out.numel(), dtype=dtype)).view_as(out)
        grads = torch.autograd.grad(out, inputs + list(module.parameters()), gout, allow_unused=True)
        results.append((out, grads))
    (o_p, g_p), (o_o, g_o), (o_e, g_e) = results
    assert_no_worse_than_reference(o_o, o_p, o_e)
    for a, b, c in zip(g_o, g_p, g_e):
        if c is None:
            assert a is None or a.abs().max() == 0
            continue
        assert_no_worse_than_reference(a, b, c)


OPTIONS = [{}, {"heads": 3}, {"heads": 2, "concat": False}, {"heads": 2, "add_self_loops": False},
           {"negative_slope": 0.01, "heads": 2}, {"bias": False}, {"residual": True, "heads": 2}]
IDS = ["default", "heads3", "mean_heads", "no_loops", "slope", "no_bias", "residual"]


@pytest.mark.parametrize("opts", OPTIONS, ids=IDS)
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_gat_conv_matches_pyg(name, ei, n, opts):
    pyg = pyg_nn.GATConv(7, 5, **opts)
    ours = gnnio.nn.GATConv(7, 5, **opts)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    ours.load_state_dict(pyg.state_dict())
    x = torch.randn(n, 7)

    def call(module, dtype):
        xi = x.to(dtype).requires_grad_()
        return module(xi, ei), [xi]

    run_pair(pyg, ours, call)


@pytest.mark.parametrize("ns,nd", [(30, 12), (12, 30)])
@pytest.mark.parametrize("mode", ["pair", "pair_size", "src_only"])
@pytest.mark.parametrize("opts", [{"heads": 2}, {"heads": 2, "add_self_loops": False}])
def test_gat_conv_bipartite(ns, nd, mode, opts):
    if mode == "src_only" and opts.get("add_self_loops", True):
        opts = dict(opts, add_self_loops=False)  # PyG needs x_dst to add loops on (x_src, None)
    pyg = pyg_nn.GATConv((6, 4), 3, **opts)
    ours = gnnio.nn.GATConv((6, 4), 3, **opts)
    ours.load_state_dict(pyg.state_dict())
    ei = torch.stack([torch.randint(ns, (90,)), torch.randint(nd, (90,))])
    xs, xd = torch.randn(ns, 6), torch.randn(nd, 4)

    def call(module, dtype):
        a, b = xs.to(dtype).requires_grad_(), xd.to(dtype).requires_grad_()
        if mode == "pair":
            return module((a, b), ei), [a, b]
        if mode == "pair_size":
            return module((a, b), ei, size=(ns, nd)), [a, b]
        return module((a, None), ei, size=(ns, nd)), [a]

    run_pair(pyg, ours, call)


def test_return_attention_weights_follow_pyg_edge_order():
    ei, n = real("cora")
    pyg, ours = pyg_nn.GATConv(8, 4, heads=2), gnnio.nn.GATConv(8, 4, heads=2)
    ours.load_state_dict(pyg.state_dict())
    x = torch.randn(n, 8)
    _, (e_p, a_p) = pyg(x, ei, return_attention_weights=True)
    _, (e_o, a_o) = ours(x, ei, return_attention_weights=True)
    assert torch.equal(e_p, e_o)
    # Each weight is one exp of a float32 score minus a float32 lse: a few ulp of 1.
    torch.testing.assert_close(a_o, a_p, rtol=1e-5, atol=8 * torch.finfo(torch.float32).eps)
    sums = torch.zeros(n, 2).index_add(0, e_o[1], a_o)
    torch.testing.assert_close(sums, torch.ones(n, 2), rtol=0, atol=1e-5)


def test_gradcheck_float64():
    ei, n = random_graph(9, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    a_s = torch.randn(n, 2, dtype=torch.float64, requires_grad=True)
    a_d = torch.randn(n, 2, dtype=torch.float64, requires_grad=True)
    h = torch.randn(n, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: gnnio.ops.gat_attention(g, a, b, c, 0.2)[0],
                                    (a_s, a_d, h))


def test_eval_mode_dropout_equals_no_dropout():
    ei, n = random_graph(20, 80)
    ref, drop = gnnio.nn.GATConv(4, 3), gnnio.nn.GATConv(4, 3, dropout=0.5)
    drop.load_state_dict(ref.state_dict())
    x = torch.randn(n, 4)
    assert torch.equal(ref(x, ei), drop.eval()(x, ei))


@pytest.mark.parametrize("make,fragment", [
    (lambda: gnnio.nn.GATConv(4, 3, edge_dim=2), "edge_dim"),
    (lambda: gnnio.nn.GATConv(4, 3, flow="target_to_source"), "flow"),
    (lambda: gnnio.nn.GATConv(-1, 3), "channel"),
])
def test_unsupported_arguments(make, fragment):
    with pytest.raises(NotImplementedError, match=fragment):
        make()


def test_unsupported_calls():
    ei, n = random_graph(10, 30)
    x = torch.randn(n, 4)
    with pytest.raises(NotImplementedError, match="edge_attr"):
        gnnio.nn.GATConv(4, 3)(x, ei, edge_attr=torch.randn(30, 2))
    with pytest.raises(NotImplementedError, match="dropout"):
        gnnio.nn.GATConv(4, 3, dropout=0.1).train()(x, ei)


@pytest.mark.slow
def test_hub_of_100k_neighbours():
    ei, n = hub(100_000)
    pyg, ours = pyg_nn.GATConv(8, 4, heads=2), gnnio.nn.GATConv(8, 4, heads=2)
    ours.load_state_dict(pyg.state_dict())
    x = torch.randn(n, 8)

    def call(module, dtype):
        xi = x.to(dtype).requires_grad_()
        return module(xi, ei), [xi]

    run_pair(pyg, ours, call)
