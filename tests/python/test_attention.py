"""The attention family: gnnio.ops.graph_attention (kinds 'gat', 'gatv2', 'dot': fused online
softmax, weights recomputed in the backward, dropout from a counter-based mask) and
gnnio.nn.GATConv / GATv2Conv / TransformerConv against PyG 2.8 on the same weights."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

EPS32 = torch.finfo(torch.float32).eps


def cases():
    return [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()


def _grad_inputs(module, inputs):
    names = [name for name, _ in module.named_parameters()]
    return names, inputs + [p for _, p in module.named_parameters()]


def run_pair(pyg, ours, call, rows=1):
    """Outputs and gradients (inputs and every parameter, matched by name) of PyG fp32, gnnio
    fp32 and PyG fp64: gnnio's error against fp64 is at most twice PyG's (conftest).

    A parameter's gradient is a sum over up to ``rows`` nodes or edges whose exact value can be
    ~0 while its terms are not (a key bias under dot attention has gradient exactly 0: the
    softmax is shift-invariant), so both fp32 results can be pure rounding noise, which grows
    like sqrt(rows) eps of the terms: those get a floor of max(8, 4 sqrt(rows)) eps."""
    exact = copy.deepcopy(pyg).double()
    results = []
    for module, dtype in ((pyg, torch.float32), (ours, torch.float32), (exact, torch.float64)):
        out, inputs = call(module, dtype)
        params = dict(module.named_parameters())
        names = sorted(params)
        gout = torch.ones_like(out) if out.numel() == 0 else \
            torch.cos(torch.arange(out.numel(), dtype=dtype)).view_as(out)
        grads = torch.autograd.grad(out, inputs + [params[k] for k in names], gout,
                                    allow_unused=True)
        results.append((names, out, grads, len(inputs)))
    (n_p, o_p, g_p, k), (n_o, o_o, g_o, _), (n_e, o_e, g_e, _) = results
    assert n_o == n_p == n_e
    assert_no_worse_than_reference(o_o, o_p, o_e)
    for i, (a, b, c) in enumerate(zip(g_o, g_p, g_e)):
        if c is None:  # PyG never touched it (e.g. lin_edge on a graph without edges)
            assert a is None or a.numel() == 0 or a.abs().max() == 0
            continue
        floor = None
        if i >= k and c.numel():
            floor = max(8.0, 4 * math.sqrt(rows)) * EPS32 * max(c.abs().max().item(), 1.0)
        assert_no_worse_than_reference(a, b, c, floor=floor)


# -- the three layers and their options ---------------------------------------------------------

GAT_OPTIONS = {
    "default": {}, "heads3": {"heads": 3}, "mean_heads": {"heads": 2, "concat": False},
    "no_loops": {"heads": 2, "add_self_loops": False},
    "slope": {"negative_slope": 0.01, "heads": 2}, "no_bias": {"bias": False},
    "residual": {"residual": True, "heads": 2},
    "edge": {"heads": 2, "edge_dim": 3},
    "edge_no_loops": {"heads": 2, "edge_dim": 3, "add_self_loops": False},
    "edge_1d": {"edge_dim": 1, "_edge_attr_1d": True},
    "fill_add": {"heads": 2, "edge_dim": 3, "fill_value": "add"},
    "fill_max": {"edge_dim": 3, "fill_value": "max"},
    "fill_min": {"edge_dim": 3, "fill_value": "min"},
    "fill_mul": {"edge_dim": 2, "fill_value": "mul"},
    "fill_float": {"heads": 2, "edge_dim": 3, "fill_value": 0.5},
    "fill_tensor": {"edge_dim": 3, "fill_value": torch.tensor([1.0, -1.0, 2.0])},
    "edge_mean_residual": {"heads": 2, "edge_dim": 3, "concat": False, "residual": True},
}
GATV2_OPTIONS = dict(GAT_OPTIONS, **{
    "share": {"heads": 2, "share_weights": True},
    "share_edge": {"heads": 2, "share_weights": True, "edge_dim": 3},
    "share_no_bias": {"share_weights": True, "bias": False},
})
TRANSFORMER_OPTIONS = {
    "default": {}, "heads3": {"heads": 3}, "mean_heads": {"heads": 2, "concat": False},
    "beta": {"heads": 2, "beta": True}, "beta_mean": {"heads": 2, "beta": True, "concat": False},
    "no_root": {"heads": 2, "root_weight": False},
    "beta_no_root": {"beta": True, "root_weight": False},  # beta is dropped without root_weight
    "no_bias": {"heads": 2, "bias": False},
    "edge": {"heads": 2, "edge_dim": 3}, "edge_beta": {"heads": 2, "edge_dim": 3, "beta": True},
    "edge_mean": {"heads": 2, "edge_dim": 3, "concat": False},
}
LAYERS = {"GATConv": GAT_OPTIONS, "GATv2Conv": GATV2_OPTIONS, "TransformerConv": TRANSFORMER_OPTIONS}
LAYER_CASES = [(layer, name) for layer, options in LAYERS.items() for name in options]


def make_pair(layer, in_channels, out_channels, **opts):
    """A PyG module and the gnnio one with PyG's weights."""
    opts = {k: v for k, v in opts.items() if not k.startswith("_")}
    pyg = getattr(pyg_nn, layer)(in_channels, out_channels, **opts)
    ours = getattr(gnnio.nn, layer)(in_channels, out_channels, **opts)
    assert list(ours.state_dict()) == list(pyg.state_dict())
    for k, v in pyg.state_dict().items():
        assert ours.state_dict()[k].shape == v.shape, k
    ours.load_state_dict(pyg.state_dict())
    return pyg, ours


def edge_features(opts, num_edges):
    if opts.get("edge_dim") is None:
        return None
    if opts.get("_edge_attr_1d"):
        return torch.randn(num_edges)
    return torch.randn(num_edges, opts["edge_dim"])


def layer_call(x, ei, ea, **kwargs):
    def call(module, dtype):
        xi = x.to(dtype).requires_grad_()
        if ea is None:
            return module(xi, ei, **kwargs), [xi]
        eai = ea.to(dtype).requires_grad_()
        return module(xi, ei, eai, **kwargs), [xi, eai]
    return call


@pytest.mark.parametrize("layer,opt", LAYER_CASES, ids=[f"{a}-{b}" for a, b in LAYER_CASES])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_layer_matches_pyg(layer, opt, name, ei, n):
    opts = LAYERS[layer][opt]
    pyg, ours = make_pair(layer, 7, 5, **opts)
    x = torch.randn(n, 7)
    run_pair(pyg, ours, layer_call(x, ei, edge_features(opts, ei.size(1))), rows=n + ei.size(1))


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("opts", [{"heads": 2}, {"heads": 2, "edge_dim": 3}])
def test_seeded_construction_gives_pyg_weights(layer, opts):
    """Same constructor, same initialisers in the same order: a seeded construction (and a
    seeded reset_parameters) gives PyG's numbers bit for bit."""
    extra = {"share_weights": True} if layer == "GATv2Conv" else {}
    for kw in (opts, dict(opts, **extra), dict(opts, bias=False)):
        torch.manual_seed(7)
        pyg = getattr(pyg_nn, layer)(6, 4, **kw)
        torch.manual_seed(7)
        ours = getattr(gnnio.nn, layer)(6, 4, **kw)
        sp, so = pyg.state_dict(), ours.state_dict()
        assert list(sp) == list(so)
        assert all(torch.equal(sp[k], so[k]) for k in sp)
        torch.manual_seed(3)
        pyg.reset_parameters()
        torch.manual_seed(3)
        ours.reset_parameters()
        assert all(torch.equal(v, ours.state_dict()[k]) for k, v in pyg.state_dict().items())


def test_gat_ignores_edge_attr_without_edge_dim():
    """PyG's GATConv uses edge_attr only through lin_edge: without edge_dim it is ignored."""
    ei, n = random_graph(30, 120)
    pyg, ours = make_pair("GATConv", 5, 4, heads=2)
    x, ea = torch.randn(n, 5), torch.randn(120, 3)
    torch.testing.assert_close(ours(x, ei, ea), pyg(x, ei, ea), rtol=1e-5, atol=1e-6)


# -- bipartite inputs and size ------------------------------------------------------------------

def _bipartite(ns, nd, e=90):
    ei = torch.stack([torch.randint(ns, (e,)), torch.randint(nd, (e,))])
    return ei, torch.randn(ns, 6), torch.randn(nd, 4)


@pytest.mark.parametrize("ns,nd", [(30, 12), (12, 30)])
@pytest.mark.parametrize("mode", ["pair", "pair_size", "src_only"])
@pytest.mark.parametrize("opts", [{"heads": 2}, {"heads": 2, "add_self_loops": False},
                                  {"heads": 2, "edge_dim": 2, "fill_value": 0.5},
                                  {"heads": 2, "residual": True}],
                         ids=["loops", "no_loops", "edge", "residual"])
def test_gat_conv_bipartite(ns, nd, mode, opts):
    if mode == "src_only":  # PyG needs x_dst to add loops on (x_src, None) and for residual
        if opts.get("residual"):
            pytest.skip("residual needs x_dst")
        opts = dict(opts, add_self_loops=False)
    pyg, ours = make_pair("GATConv", (6, 4), 3, **opts)
    ei, xs, xd = _bipartite(ns, nd)
    ea = torch.randn(ei.size(1), 2) if opts.get("edge_dim") else None

    def call(module, dtype):
        a, b = xs.to(dtype).requires_grad_(), xd.to(dtype).requires_grad_()
        extra, ins = {}, []
        if ea is not None:
            extra["edge_attr"] = ea.to(dtype).requires_grad_()
            ins = [extra["edge_attr"]]
        if mode == "pair":
            return module((a, b), ei, **extra), [a, b] + ins
        if mode == "pair_size":
            return module((a, b), ei, size=(ns, nd), **extra), [a, b] + ins
        return module((a, None), ei, size=(ns, nd), **extra), [a] + ins

    run_pair(pyg, ours, call, rows=ns + nd + 90)


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv"])
def test_fill_mean_bipartite_more_destinations(layer):
    """num_src < num_dst: loops go on the first num_src nodes and their edge features are the
    mean over each one's incoming edges (PyG's own scatter runs out of range here). Checked
    against PyG without loops on the looped edge list with those features given."""
    ns, nd = 12, 30
    ei, xs, xd = _bipartite(ns, nd)
    xs = torch.randn(ns, 4)  # shared in_channels so GATv2 can share the call
    ea = torch.randn(ei.size(1), 2)
    pyg, ours = make_pair(layer, 4, 3, heads=2, edge_dim=2, add_self_loops=False)
    ours.add_self_loops = True
    keep = ei[0] != ei[1]
    kept, kept_attr = ei[:, keep], ea[keep]
    mean = torch.zeros(nd, 2).index_add(0, kept[1], kept_attr)
    mean = mean / torch.bincount(kept[1], minlength=nd).clamp(min=1).unsqueeze(1)
    loops = torch.arange(ns).repeat(2, 1)
    looped = torch.cat([kept, loops], 1)
    out_p, (e_p, a_p) = pyg((xs, xd), looped, torch.cat([kept_attr, mean[:ns]]),
                            return_attention_weights=True)
    out_o, (e_o, a_o) = ours((xs, xd), ei, ea, return_attention_weights=True)
    assert torch.equal(e_o, e_p)
    torch.testing.assert_close(out_o, out_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a_o, a_p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", ["GATv2Conv", "TransformerConv"])
@pytest.mark.parametrize("ns,nd", [(30, 12), (12, 30)])
@pytest.mark.parametrize("opts", [{"heads": 2}, {"heads": 2, "edge_dim": 2}],
                         ids=["plain", "edge"])
def test_bipartite_pairs(layer, ns, nd, opts):
    if layer == "GATv2Conv" and opts.get("edge_dim"):
        opts = dict(opts, fill_value=0.5)  # PyG's 'mean' fill runs out of range for ns < nd
    pyg, ours = make_pair(layer, (6, 4), 3, **opts)
    ei, xs, xd = _bipartite(ns, nd)
    ea = torch.randn(ei.size(1), 2) if opts.get("edge_dim") else None

    def call(module, dtype):
        a, b = xs.to(dtype).requires_grad_(), xd.to(dtype).requires_grad_()
        if ea is None:
            return module((a, b), ei), [a, b]
        e = ea.to(dtype).requires_grad_()
        return module((a, b), ei, e), [a, b, e]

    run_pair(pyg, ours, call, rows=ns + nd + 90)


def test_gatv2_shared_weights_on_pairs():
    pyg, ours = make_pair("GATv2Conv", (5, 5), 3, heads=2, share_weights=True)
    ei = torch.stack([torch.randint(20, (70,)), torch.randint(9, (70,))])
    xs, xd = torch.randn(20, 5), torch.randn(9, 5)

    def call(module, dtype):
        a, b = xs.to(dtype).requires_grad_(), xd.to(dtype).requires_grad_()
        return module((a, b), ei), [a, b]

    run_pair(pyg, ours, call, rows=29 + 70)


def test_gat_size_argument():
    ei, n = random_graph(25, 100)
    pyg, ours = make_pair("GATConv", 5, 4, heads=2)
    x = torch.randn(n, 5)

    def call(module, dtype):
        xi = x.to(dtype).requires_grad_()
        return module(xi, ei, size=(n, n)), [xi]

    run_pair(pyg, ours, call, rows=n + 100)
    with pytest.raises(ValueError, match="size"):
        ours(x, ei, size=(n, n + 1))


# -- return_attention_weights -------------------------------------------------------------------

RAW_CASES = [("GATConv", {"heads": 2}), ("GATConv", {"heads": 2, "add_self_loops": False}),
             ("GATConv", {"heads": 2, "edge_dim": 3}),
             ("GATConv", {"heads": 2, "edge_dim": 3, "fill_value": "add"}),
             ("GATv2Conv", {"heads": 2}), ("GATv2Conv", {"heads": 2, "edge_dim": 3}),
             ("GATv2Conv", {"heads": 2, "share_weights": True, "add_self_loops": False}),
             ("TransformerConv", {"heads": 2}), ("TransformerConv", {"heads": 2, "edge_dim": 3})]


@pytest.mark.parametrize("layer,opts", RAW_CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(RAW_CASES)])
@pytest.mark.parametrize("graph", ["cora", "self_loops", "duplicates", "no_edges", "int32"])
def test_return_attention_weights_match_pyg(layer, opts, graph):
    if graph == "cora":
        ei, n = real("cora")
    elif graph == "int32":
        ei, n = random_graph(40, 200)
        ei = ei.int()
    else:
        _, ei, n = next(c for c in adversarial() if c[0] == graph)
    pyg, ours = make_pair(layer, 8, 4, **opts)
    x = torch.randn(n, 8)
    ea = edge_features(opts, ei.size(1))
    args = (x, ei) if ea is None else (x, ei, ea)
    out_p, (e_p, a_p) = pyg(*args, return_attention_weights=True)
    out_o, (e_o, a_o) = ours(*args, return_attention_weights=True)
    assert e_o.dtype == e_p.dtype and torch.equal(e_o, e_p)
    assert a_o.shape == a_p.shape and a_o.dtype == a_p.dtype
    # Each weight is one exp of a float32 score over a float32 sum: a few ulp of 1.
    torch.testing.assert_close(a_o, a_p, rtol=1e-5, atol=8 * EPS32)
    torch.testing.assert_close(out_o, out_p, rtol=1e-4, atol=1e-5)
    sums = torch.zeros(n, a_o.size(1)).index_add(0, e_o[1].long(), a_o)
    has_in = torch.zeros(n, dtype=torch.bool)
    has_in[e_o[1].long()] = True
    torch.testing.assert_close(sums[has_in], torch.ones_like(sums[has_in]), rtol=0, atol=1e-5)
    assert (sums[~has_in] == 0).all()


def test_return_attention_weights_flag_semantics():
    """GATConv / GATv2Conv test the flag's truthiness; TransformerConv tests isinstance(bool)."""
    ei, n = random_graph(20, 60)
    x = torch.randn(n, 4)
    for layer in ("GATConv", "GATv2Conv"):
        pyg, ours = make_pair(layer, 4, 3)
        assert isinstance(ours(x, ei, return_attention_weights=False), torch.Tensor)
        assert isinstance(pyg(x, ei, return_attention_weights=False), torch.Tensor)
    pyg, ours = make_pair("TransformerConv", 4, 3)
    r_p, r_o = pyg(x, ei, return_attention_weights=False), ours(x, ei, return_attention_weights=False)
    assert isinstance(r_p, tuple) and isinstance(r_o, tuple)
    torch.testing.assert_close(r_o[1][1], r_p[1][1], rtol=1e-5, atol=8 * EPS32)
    assert isinstance(ours(x, ei, return_attention_weights=None), torch.Tensor)


# -- the op: reference, gradcheck ---------------------------------------------------------------

def reference_attention(graph, kind, value, *, src_score=None, dst_score=None, edge_score=None,
                        query=None, key=None, edge_key=None, att=None, edge_value=None,
                        negative_slope=0.2, scale=1.0, keep=None, dropout=0.0):
    """graph_attention's contract written out with E x H tensors and PyG's softmax; ``keep`` is
    an [E, H] dropout mask in edge order. Returns (out, weights)."""
    src, dst = graph.edge_index.long()
    heads, channels = value.shape[1:]
    if kind == "gat":
        e = src_score[src]
        if dst_score is not None:
            e = e + dst_score[dst]
        if edge_score is not None:
            e = e + edge_score
        e = F.leaky_relu(e, negative_slope)
    elif kind == "gatv2":
        z = key[src] + query[dst] + (0 if edge_key is None else edge_key)
        e = (F.leaky_relu(z, negative_slope) * att.reshape(1, heads, channels)).sum(-1)
    else:
        k = key[src] + (0 if edge_key is None else edge_key)
        e = scale * (query[dst] * k).sum(-1)
    p = pyg_utils.softmax(e, dst, num_nodes=graph.num_dst)
    if keep is not None:
        p = p * keep.to(p.dtype) / (1 - dropout)
    v = value[src] + (0 if edge_value is None else edge_value)
    out = torch.zeros(graph.num_dst, heads, channels, dtype=value.dtype).index_add(
        0, dst, p.unsqueeze(-1) * v)
    return out, p


# (kind, which optional operands): every score form with and without its edge terms.
OP_CASES = [("gat", ()), ("gat", ("dst_score",)), ("gat", ("dst_score", "edge_score")),
            ("gat", ("dst_score", "edge_score", "edge_value")),
            ("gatv2", ()), ("gatv2", ("edge_key",)), ("gatv2", ("edge_key", "edge_value")),
            ("dot", ()), ("dot", ("edge_key",)), ("dot", ("edge_value",)),
            ("dot", ("edge_key", "edge_value"))]
OP_IDS = [f"{k}-{'+'.join(o) or 'plain'}" for k, o in OP_CASES]


def make_operands(kind, optional, graph, heads, channels, dtype, generator=None, scale_=1.0):
    ns, nd, e = graph.num_src, graph.num_dst, graph.num_edges

    def r(*shape):
        return (scale_ * torch.randn(*shape, generator=generator, dtype=torch.float64)).to(dtype)

    ops = {"value": r(ns, heads, channels)}
    if kind == "gat":
        ops["src_score"] = r(ns, heads)
        if "dst_score" in optional:
            ops["dst_score"] = r(nd, heads)
        if "edge_score" in optional:
            ops["edge_score"] = r(e, heads)
    else:
        ops["query"], ops["key"] = r(nd, heads, channels), r(ns, heads, channels)
        if kind == "gatv2":
            ops["att"] = r(heads, channels)
        if "edge_key" in optional:
            ops["edge_key"] = r(e, heads, channels)
    if "edge_value" in optional:
        ops["edge_value"] = r(e, heads, channels)
    return ops


def _op(graph, kind, names, scale=0.7, **kw):
    def f(*tensors):
        return gnnio.ops.graph_attention(graph, kind, **dict(zip(names, tensors)),
                                         negative_slope=0.1, scale=scale, **kw)
    return f


@pytest.mark.parametrize("dropout", [0.0, 0.4])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("kind,optional", OP_CASES, ids=OP_IDS)
def test_gradcheck_float64(kind, optional, bipartite, dropout):
    gen = torch.Generator().manual_seed(5)
    if bipartite:
        ei = torch.stack([torch.randint(7, (30,), generator=gen), torch.randint(6, (30,), generator=gen)])
        graph = gnnio.Graph(ei, size=(7, 6))
    else:
        ei, n = random_graph(9, 40, generator=gen)
        graph = gnnio.Graph(ei, num_nodes=n + 2)  # two isolated nodes
    ops = make_operands(kind, optional, graph, 2, 3, torch.float64, gen)
    names = list(ops)
    tensors = [t.requires_grad_() for t in ops.values()]
    # A fixed seed makes the mask a constant of the function being checked.
    f = _op(graph, kind, names, dropout=dropout, seed=1234)
    assert torch.autograd.gradcheck(f, tensors)
    # The values themselves, against the reference applying the mask the op reports.
    _, w = gnnio.ops.graph_attention(graph, kind, **ops, negative_slope=0.1, scale=0.7,
                                     dropout=dropout, seed=1234, return_weights=True)
    keep = w != 0
    assert keep.all() if dropout == 0 else not keep.all()
    ref, w_ref = reference_attention(graph, kind, **ops, negative_slope=0.1, scale=0.7,
                                     keep=keep if dropout else None, dropout=dropout)
    torch.testing.assert_close(f(*tensors), ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, w_ref.detach(), rtol=1e-10, atol=1e-12)


def test_op_return_weights_edge_order_and_shapes():
    ei, n = random_graph(30, 200)
    ei = ei[:, torch.randperm(200)]
    graph = gnnio.Graph(ei, num_nodes=n)
    ops = make_operands("dot", ("edge_key", "edge_value"), graph, 3, 4, torch.float32)
    out, w = gnnio.ops.graph_attention(graph, "dot", **ops, return_weights=True)
    assert out.shape == (n, 3, 4) and w.shape == (200, 3) and w.dtype == torch.float32
    assert not w.requires_grad
    _, w_ref = reference_attention(graph, "dot", **ops)
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=8 * EPS32)
    torch.testing.assert_close(gnnio.ops.graph_attention(graph, "dot", **ops), out, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs,error,fragment", [
    (dict(kind="softmax"), ValueError, "kind"),
    (dict(kind="gat", src_score=None), ValueError, "src_score"),
    (dict(kind="gatv2", att=None), ValueError, "att"),
    (dict(kind="dot", dropout=1.0), ValueError, "dropout"),
    (dict(kind="dot", edge_key=torch.randn(3, 2, 4)), ValueError, "edge_key"),
    (dict(kind="dot", query=torch.randn(30, 2, 4, dtype=torch.float64)), TypeError, "dtype"),
])
def test_op_bad_inputs(kwargs, error, fragment):
    ei, n = random_graph(30, 100)
    graph = gnnio.Graph(ei, num_nodes=n)
    ops = {"value": torch.randn(n, 2, 4), "src_score": torch.randn(n, 2), "query": torch.randn(n, 2, 4),
           "key": torch.randn(n, 2, 4), "att": torch.randn(2, 4)}
    kind = kwargs.pop("kind")
    keep = {"gat": ("value", "src_score"), "gatv2": ("value", "query", "key", "att"),
            "dot": ("value", "query", "key"), "softmax": ("value",)}[kind]
    ops = dict({k: ops[k] for k in keep}, **kwargs)
    with pytest.raises(error, match=fragment):
        gnnio.ops.graph_attention(graph, kind, **ops)


# -- dropout ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_graph():
    ei, n = random_graph(2_000, 20_000, generator=torch.Generator().manual_seed(0))
    return gnnio.Graph(ei, num_nodes=n)


@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
def test_dropout_seed_determinism(big_graph, kind):
    ops = make_operands(kind, ("edge_value",), big_graph, 4, 3, torch.float32,
                        torch.Generator().manual_seed(1))
    run = lambda seed: gnnio.ops.graph_attention(big_graph, kind, **ops, dropout=0.3, seed=seed,  # noqa: E731
                                                 return_weights=True)
    (o1, w1), (o2, w2), (o3, w3) = run(11), run(11), run(12)
    assert torch.equal(o1, o2) and torch.equal(w1, w2)
    assert not torch.equal(o1, o3) and not torch.equal(w1 == 0, w3 == 0)
    # seed=None draws the seed from torch's default generator.
    torch.manual_seed(5)
    a = gnnio.ops.graph_attention(big_graph, kind, **ops, dropout=0.3)
    torch.manual_seed(5)
    b = gnnio.ops.graph_attention(big_graph, kind, **ops, dropout=0.3)
    assert torch.equal(a, b)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
@pytest.mark.parametrize("kind", ["gat", "dot"])
def test_dropout_rate_and_scaling(big_graph, kind, p):
    ops = make_operands(kind, (), big_graph, 4, 3, torch.float32, torch.Generator().manual_seed(2))
    _, w0 = gnnio.ops.graph_attention(big_graph, kind, **ops, return_weights=True)
    assert (w0 > 0).all()  # so every zero below is a dropped weight
    for seed in (1, 2, 3):
        _, w = gnnio.ops.graph_attention(big_graph, kind, **ops, dropout=p, seed=seed,
                                         return_weights=True)
        dropped = w == 0
        n = dropped.numel()  # 80,000 (edge, head) draws
        # Each (edge, head) is dropped independently with probability p (24-bit draws: p to
        # within 2^-24), so the dropped count is Binomial(n, p): 6 standard deviations leave a
        # false-failure chance of ~2e-9 per seed.
        bound = 6 * math.sqrt(p * (1 - p) / n)
        assert abs(dropped.double().mean().item() - p) <= bound
        # Per head as well (masks are drawn per (edge, head), not per edge).
        per_head = dropped.double().mean(0)
        assert ((per_head - p).abs() <= 6 * math.sqrt(p * (1 - p) / dropped.size(0))).all()
        assert not (dropped[:, :1] == dropped).all()
        # Kept weights are scaled by 1 / (1 - p), as F.dropout does.
        torch.testing.assert_close(w[~dropped], w0[~dropped] / (1 - p), rtol=1e-5, atol=0)


@pytest.mark.parametrize("kind,optional", [("gat", ("dst_score", "edge_score")),
                                           ("gatv2", ("edge_key",)),
                                           ("dot", ("edge_key", "edge_value"))],
                         ids=["gat", "gatv2", "dot"])
def test_dropout_gradients_against_masked_reference(kind, optional):
    """fp32 with dropout against the float64 reference applying the same mask (read off
    return_weights == 0), no worse than the same reference in fp32."""
    ei, n = real("cora")
    graph = gnnio.Graph(ei, num_nodes=n)
    ops = make_operands(kind, optional, graph, 2, 4, torch.float32, torch.Generator().manual_seed(3))
    p = 0.35
    _, w = gnnio.ops.graph_attention(graph, kind, **ops, dropout=p, seed=99, return_weights=True)
    keep = w != 0
    assert 0.55 < keep.double().mean().item() < 0.75
    names = list(ops)
    results = []
    for impl, dtype in (("ref", torch.float32), ("ours", torch.float32), ("ref", torch.float64)):
        ts = [t.to(dtype).requires_grad_() for t in ops.values()]
        kw = dict(zip(names, ts))
        if impl == "ours":
            out = gnnio.ops.graph_attention(graph, kind, **kw, dropout=p, seed=99)
        else:
            out = reference_attention(graph, kind, **kw, keep=keep, dropout=p)[0]
        gout = torch.cos(torch.arange(out.numel(), dtype=dtype)).view_as(out)
        results.append((out, torch.autograd.grad(out, ts, gout)))
    (o_r, g_r), (o_o, g_o), (o_e, g_e) = results
    assert_no_worse_than_reference(o_o, o_r, o_e)
    for a, b, c in zip(g_o, g_r, g_e):
        assert_no_worse_than_reference(a, b, c)


class _Spy:
    """Wraps a layer module's graph_attention to record the weights (after dropout) of every
    call, whatever the layer asked for."""

    def __init__(self, real):
        self.real, self.weights = real, []

    def __call__(self, *args, **kwargs):
        want = kwargs.get("return_weights", False)
        out, w = self.real(*args, **dict(kwargs, return_weights=True))
        self.weights.append(w)
        return (out, w) if want else out


_MODULES = {"GATConv": "gat_conv", "GATv2Conv": "gatv2_conv", "TransformerConv": "transformer_conv"}


def _spy_on(monkeypatch, layer):
    import importlib
    module = importlib.import_module(f"gnnio.nn.conv.{_MODULES[layer]}")
    spy = _Spy(module.graph_attention)
    monkeypatch.setattr(module, "graph_attention", spy)
    return spy


DROPOUT_LAYERS = [("GATConv", {"heads": 2}), ("GATConv", {"heads": 2, "edge_dim": 3}),
                  ("GATv2Conv", {"heads": 2}), ("GATv2Conv", {"heads": 2, "edge_dim": 3}),
                  ("TransformerConv", {"heads": 2}),
                  ("TransformerConv", {"heads": 2, "edge_dim": 3, "beta": True})]
DROPOUT_IDS = [f"{a}-{i}" for i, (a, _) in enumerate(DROPOUT_LAYERS)]


@pytest.mark.parametrize("layer,opts", DROPOUT_LAYERS, ids=DROPOUT_IDS)
def test_layer_dropout_matches_pyg_with_the_same_mask(monkeypatch, layer, opts):
    """Training mode with dropout: forward and backward against PyG whose F.dropout is made to
    apply gnnio's mask (recorded from the op's weights: zero where dropped)."""
    ei, n = real("cora")
    pyg, ours = make_pair(layer, 7, 5, dropout=0.4, **opts)
    x, ea = torch.randn(n, 7), edge_features(opts, ei.size(1))
    spy = _spy_on(monkeypatch, layer)
    call = layer_call(x, ei, ea)
    torch.manual_seed(21)
    call(ours, torch.float32)
    keep = spy.weights[-1] != 0
    assert 0.5 < keep.double().mean().item() < 0.7

    def masked_dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        assert input.shape == keep.shape
        return input * keep.to(input.dtype) / (1 - p)

    monkeypatch.setattr(torch.nn.functional, "dropout", masked_dropout)

    def seeded_call(module, dtype):
        if module is ours:
            torch.manual_seed(21)  # the layer draws its seed from torch's default generator
        return call(module, dtype)

    run_pair(pyg, ours, seeded_call, rows=n + ei.size(1))
    assert torch.equal(spy.weights[-1] != 0, keep)


@pytest.mark.parametrize("layer,opts", DROPOUT_LAYERS, ids=DROPOUT_IDS)
def test_layer_dropout_modes(layer, opts):
    ei, n = random_graph(300, 3000)
    x, ea = torch.randn(n, 6), edge_features(opts, 3000)
    args = (x, ei) if ea is None else (x, ei, ea)
    plain = getattr(gnnio.nn, layer)(6, 4, **opts)
    drop = getattr(gnnio.nn, layer)(6, 4, dropout=0.5, **opts)
    drop.load_state_dict(plain.state_dict())
    ref = plain(*args)
    # eval mode: no dropout at all, the same bits as dropout=0.
    assert torch.equal(drop.eval()(*args), ref)
    drop.train()
    torch.manual_seed(1)
    a = drop(*args)
    torch.manual_seed(1)
    b = drop(*args)
    torch.manual_seed(2)
    c = drop(*args)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.allclose(a, ref)
    # Returned weights: after dropout for GAT / GATv2, before it for TransformerConv (as PyG).
    torch.manual_seed(1)
    out, (_, w) = drop(*args, return_attention_weights=True)
    assert torch.equal(out, a)
    _, (_, w_eval) = drop.eval()(*args, return_attention_weights=True)
    if layer == "TransformerConv":
        torch.testing.assert_close(w, w_eval, rtol=0, atol=0)
    else:
        dropped = w == 0
        assert 0.4 < dropped.double().mean().item() < 0.6
        torch.testing.assert_close(w[~dropped], w_eval[~dropped] * 2, rtol=1e-6, atol=0)


# -- hub nodes ----------------------------------------------------------------------------------

HUB_LAYERS = [("GATConv", {"heads": 2}), ("GATConv", {"heads": 2, "edge_dim": 2}),
              ("GATv2Conv", {"heads": 2, "edge_dim": 2}),
              ("TransformerConv", {"heads": 2, "edge_dim": 2, "beta": True})]


@pytest.mark.slow
@pytest.mark.parametrize("layer,opts", HUB_LAYERS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(HUB_LAYERS)])
def test_hub_of_100k_neighbours(layer, opts):
    ei, n = hub(100_000)
    pyg, ours = make_pair(layer, 8, 4, **opts)
    run_pair(pyg, ours, layer_call(torch.randn(n, 8), ei, edge_features(opts, ei.size(1))),
             rows=n + ei.size(1))


# -- unsupported arguments and bad inputs -------------------------------------------------------

@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("kwargs,fragment", [
    ({"flow": "target_to_source"}, "flow"), ({"aggr": "mean"}, "aggr"),
    ({"decomposed_layers": 2}, "decomposed_layers"), ({"in_channels": -1}, "channel"),
    ({"in_channels": (-1, 4)}, "channel"),
])
def test_unsupported_arguments(layer, kwargs, fragment):
    kwargs = dict(kwargs)
    in_channels = kwargs.pop("in_channels", 4)
    with pytest.raises(NotImplementedError, match=fragment):
        getattr(gnnio.nn, layer)(in_channels, 3, **kwargs)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_default_message_passing_arguments_accepted(layer):
    getattr(gnnio.nn, layer)(4, 3, aggr="add", flow="source_to_target", decomposed_layers=1)


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv"])
def test_bad_fill_value(layer):
    with pytest.raises(ValueError, match="fill_value"):
        getattr(gnnio.nn, layer)(4, 3, edge_dim=2, fill_value="median")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_bad_dropout(layer):
    with pytest.raises(ValueError, match="dropout"):
        getattr(gnnio.nn, layer)(4, 3, dropout=1.0)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_bad_inputs(layer):
    ei, n = random_graph(20, 60)
    x = torch.randn(n, 4)
    m = getattr(gnnio.nn, layer)(4, 3, edge_dim=2)
    with pytest.raises(ValueError, match="edge_attr"):
        m(x, ei, torch.randn(59, 2))  # one row short
    with pytest.raises(ValueError, match="edge_attr"):
        m(x, ei, torch.randn(60, 3))  # wrong width
    with pytest.raises(TypeError, match="edge_attr"):
        m(x, ei, torch.ones(60, 2, dtype=torch.long))
    with pytest.raises(IndexError):
        m(x, torch.tensor([[0, n], [1, 2]]), torch.randn(2, 2))
    with pytest.raises(IndexError):
        m(x, torch.tensor([[0, -1], [1, 2]]), torch.randn(2, 2))
    with pytest.raises(ValueError, match="integer"):
        m(x, ei.float(), torch.randn(60, 2))
    with pytest.raises(ValueError, match="2-D"):
        m(x.view(n, 2, 2), ei, torch.randn(60, 2))
    if layer != "GATConv":
        with pytest.raises(ValueError, match="destination"):
            m((x, None), ei, torch.randn(60, 2))
        with pytest.raises(ValueError, match="edge_dim"):
            getattr(gnnio.nn, layer)(4, 3)(x, ei, torch.randn(60, 2))
    if layer == "TransformerConv":
        with pytest.raises(ValueError, match="edge_attr"):
            m(x, ei)  # PyG asserts; the edge term is not optional once edge_dim is set


# -- CUDA ---------------------------------------------------------------------------------------

def _hub_graph_2e5():
    """A destination with 2*10^5 in-edges and a source with 2*10^5 out-edges (node 0 both): the
    planner splits the forward's and the backward's hub rows into chunks."""
    ei, n = hub(200_000)
    return torch.cat([ei, ei[:, :200_000].flip(0)], 1), n


CUDA_LAYERS = [("GATConv", {"heads": 2, "edge_dim": 2}), ("GATv2Conv", {"heads": 2, "edge_dim": 2}),
               ("TransformerConv", {"heads": 2, "edge_dim": 2, "beta": True})]
CUDA_IDS = [a for a, _ in CUDA_LAYERS]


def _forward_backward(module, x, ei, ea):
    x = x.detach().requires_grad_()
    ea = ea.detach().requires_grad_()
    out = module(x, ei, ea)
    gout = torch.cos(torch.arange(out.numel(), device=out.device, dtype=torch.float64)).view_as(out)
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(out, [x, ea] + [params[k] for k in sorted(params)], gout.to(out.dtype))
    return out, grads


def _module_with(layer, opts, state, device, dtype):
    m = getattr(gnnio.nn, layer)(8, 4, **opts)
    m.load_state_dict(state)
    return m.to(device=device, dtype=dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_matches_cpu_on_hub(layer, opts):
    ei, n = _hub_graph_2e5()
    state = getattr(gnnio.nn, layer)(8, 4, **opts).state_dict()
    x, ea = torch.randn(n, 8), torch.randn(ei.size(1), 2)
    plan = gnnio.plan.plan_attention(gnnio.Graph(ei, num_nodes=n), 8, backward=True)
    assert plan.heavy_rows is not None and plan.heavy_src is not None  # the split is exercised
    results = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.float32), ("cpu", torch.float64)):
        m = _module_with(layer, opts, state, device, dtype)
        results.append(_forward_backward(m, x.to(device, dtype), ei.to(device), ea.to(device, dtype)))
    (o_c, g_c), (o_g, g_g), (o_e, g_e) = results
    # The CPU kernel sums a row's 2*10^5 terms in order; the CUDA kernel in chunks merged
    # afterwards. Rounding errors of such sums grow like sqrt(L) eps typically, so the floor
    # is 2 sqrt(L) eps32 of the scale besides "no worse than twice the CPU fp32 error".
    floor = lambda t: 2 * math.sqrt(200_000) * EPS32 * max(t.abs().max().item(), 1.0)  # noqa: E731
    assert_no_worse_than_reference(o_g.cpu(), o_c, o_e, floor=floor(o_e))
    for a, b, c in zip(g_g, g_c, g_e):
        assert_no_worse_than_reference(a.cpu(), b, c, floor=floor(c))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_low_precision_on_hub(layer, opts, dtype):
    """bf16 / fp16 on CUDA against float64 on the CPU from the same rounded inputs and weights.

    Tolerance: the kernel accumulates in fp32, so over the hub's L = 2*10^5 terms its own error
    is ~sqrt(L) eps32 ~ 5e-5 of the scale, far below the dtype's eps (2^-7 bf16, 2^-10 fp16).
    What dominates is the layer's dense parts rounding to the dtype, which the float64 reference
    does not do: projections, per-node scores and the output each carry eps/2 per rounding, and
    a score error d scales each softmax weight by at most exp(+-2d), moving the output by
    <= 2d |v|max. With |scores| <~ 4 (glorot weights, unit-normal inputs) and a few roundings
    per score, d <~ 6 eps, so |error| <~ (2 * 6 + 2) eps of the scale: 32 eps leaves ~2x margin.
    Parameter gradients are sums over all 2*10^4 nodes done by torch's GEMMs, whose error
    relative to the result grows with cancellation (~sqrt(N) eps): they are checked in fp32 only.
    """
    eps = torch.finfo(dtype).eps
    ei, n = _hub_graph_2e5()
    state = {k: v.to(dtype).double() for k, v in
             getattr(gnnio.nn, layer)(8, 4, **opts).state_dict().items()}
    x, ea = torch.randn(n, 8).to(dtype), torch.randn(ei.size(1), 2).to(dtype)
    m = _module_with(layer, opts, state, "cuda", dtype)
    out, grads = _forward_backward(m, x.cuda(), ei.cuda(), ea.cuda())
    ref = _module_with(layer, opts, state, "cpu", torch.float64)
    out_e, grads_e = _forward_backward(ref, x.double(), ei, ea.double())
    assert out.dtype == dtype
    for a, c in [(out, out_e), (grads[0], grads_e[0]), (grads[1], grads_e[1])]:
        scale = c.abs().max().item()
        err = (a.cpu().double() - c).abs().max().item()
        assert err <= 32 * eps * scale, f"error {err:.3g} > 32 eps x scale {scale:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind,optional", OP_CASES, ids=OP_IDS)
def test_cuda_op_on_hub(kind, optional, dtype):
    """The op alone, on CUDA, against float64 on the CPU from the same operands: no dense parts
    round in between, so the error is the kernel's fp32 accumulation over L terms (~sqrt(L)
    eps32, 4x margin) plus one rounding of the output to the dtype (eps/2, 2x margin)."""
    ei, n = _hub_graph_2e5()
    graph = gnnio.Graph(ei, num_nodes=n)
    ops = make_operands(kind, optional, graph, 2, 4, dtype, torch.Generator().manual_seed(4))
    names = list(ops)
    gcuda = gnnio.Graph(ei.cuda(), num_nodes=n)
    ts = [t.cuda().requires_grad_() for t in ops.values()]
    out = gnnio.ops.graph_attention(gcuda, kind, **dict(zip(names, ts)), scale=0.5)
    te = [t.double().requires_grad_() for t in ops.values()]
    out_e = gnnio.ops.graph_attention(graph, kind, **dict(zip(names, te)), scale=0.5)
    gout = torch.cos(torch.arange(out.numel(), dtype=torch.float64)).view_as(out_e)
    g = torch.autograd.grad(out, ts, gout.to(dtype).cuda())
    g_e = torch.autograd.grad(out_e, te, gout.to(dtype).double())
    tol = lambda t: (4 * math.sqrt(200_000) * EPS32 + torch.finfo(dtype).eps) * max(  # noqa: E731
        t.abs().max().item(), 1e-30)
    for a, c in [(out, out_e)] + list(zip(g, g_e)):
        err = (a.cpu().double() - c).abs().max().item()
        assert err <= tol(c), f"error {err:.3g} > {tol(c):.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("kind,optional", OP_CASES[::2], ids=OP_IDS[::2])
def test_cuda_dropout_mask_equals_cpu(kind, optional):
    """The mask is a function of (seed, CSR slot, head): the same on both devices."""
    ei, n = _hub_graph_2e5()
    graph, gcuda = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    ops = make_operands(kind, optional, graph, 2, 4, torch.float32, torch.Generator().manual_seed(6))
    for seed in (0, 1, 2**40 + 3):
        out_c, w_c = gnnio.ops.graph_attention(graph, kind, **ops, dropout=0.3, seed=seed,
                                               return_weights=True)
        out_g, w_g = gnnio.ops.graph_attention(gcuda, kind, **{k: v.cuda() for k, v in ops.items()},
                                               dropout=0.3, seed=seed, return_weights=True)
        assert torch.equal(w_c == 0, w_g.cpu() == 0)
        torch.testing.assert_close(w_g.cpu(), w_c, rtol=1e-5, atol=1e-6 * w_c.abs().max().item())
        torch.testing.assert_close(out_g.cpu(), out_c, rtol=1e-4, atol=1e-4 * out_c.abs().max().item())
    # A layer draws its seed from the CPU default generator: the same on both devices too.
    m = gnnio.nn.GATConv(8, 4, heads=2, dropout=0.3)
    mc = gnnio.nn.GATConv(8, 4, heads=2, dropout=0.3)
    mc.load_state_dict(m.state_dict())
    mc = mc.cuda()
    x = torch.randn(n, 8)
    torch.manual_seed(3)
    _, (_, w_c) = m(x, ei, return_attention_weights=True)
    torch.manual_seed(3)
    _, (_, w_g) = mc(x.cuda(), ei.cuda(), return_attention_weights=True)
    assert torch.equal(w_c == 0, w_g.cpu() == 0)
