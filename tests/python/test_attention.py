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
    if mode == "src_only":  # PyG needs x_dst to add loops on (x_src, None); no residual then
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


def make_operands(kind, optional, graph, heads, channels, dtype, generator=None, signed=False):
    """Random operands of ``kind`` with the ``optional`` ones.

    ``signed``: the source's term inside the LeakyReLU (``src_score``, ``key``) is
    +-(0.5 + |N(0,1)|) with a random sign and the other terms lie in [-0.1, 0.1], so every
    pre-activation is >= 0.3 away from the kink, on the branch its source picks. No rounding can
    then flip a branch (whose derivative jumps by 1 - slope, an O(1) change of a gradient that
    per-element tolerances cannot absorb), while the branch still varies between a destination's
    edges, so destination-side gradients are not trivially 0 (with one branch per row they are:
    a per-row shift of the scores leaves the softmax unchanged)."""
    ns, nd, e = graph.num_src, graph.num_dst, graph.num_edges

    def r(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def source_term(*shape):
        if not signed:
            return r(*shape).to(dtype)
        sign = torch.randint(0, 2, shape, generator=generator).double() * 2 - 1
        return (sign * (0.5 + r(*shape).abs())).to(dtype)

    def other_term(*shape):
        if not signed:
            return r(*shape).to(dtype)
        return (0.2 * torch.rand(*shape, generator=generator, dtype=torch.float64) - 0.1).to(dtype)

    ops = {"value": r(ns, heads, channels).to(dtype)}
    if kind == "gat":
        ops["src_score"] = source_term(ns, heads)
        if "dst_score" in optional:
            ops["dst_score"] = other_term(nd, heads)
        if "edge_score" in optional:
            ops["edge_score"] = other_term(e, heads)
    elif kind == "gatv2":
        ops["query"], ops["key"] = other_term(nd, heads, channels), source_term(ns, heads, channels)
        ops["att"] = r(heads, channels).to(dtype)
        if "edge_key" in optional:
            ops["edge_key"] = other_term(e, heads, channels)
    else:
        ops["query"], ops["key"] = r(nd, heads, channels).to(dtype), r(ns, heads, channels).to(dtype)
        if "edge_key" in optional:
            ops["edge_key"] = r(e, heads, channels).to(dtype)
    if "edge_value" in optional:
        ops["edge_value"] = r(e, heads, channels).to(dtype)
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
    """Node 0 receives 2*10^5 edges and sends 2*10^5 (to ~10^4 nodes, many duplicates): the
    planner splits the forward's hub row and the backward's hub source into chunks."""
    ei, n = hub(200_000)
    return torch.cat([ei, ei[:, :200_000].flip(0)], 1), n


L_HUB = 200_000  # the longest reduction: the hub row (and the hub source in the backward)
CUDA_LAYERS = [("GATConv", {"heads": 2, "edge_dim": 2}), ("GATv2Conv", {"heads": 2, "edge_dim": 2}),
               ("TransformerConv", {"heads": 2, "edge_dim": 2, "beta": True})]
CUDA_IDS = [a for a, _ in CUDA_LAYERS]


def _sign_controlled_state(layer, module):
    """Weights that, with node features x_j = s_j (0.5 + U[0, 0.5]) (random sign s_j per node)
    and edge features in [0, 1], keep every LeakyReLU pre-activation of GATConv / GATv2Conv
    >= ~0.5 away from the kink on the branch its source picks (as ``make_operands(signed=True)``):
    the source's term is a sum of non-negative weights times x_j (a_src >= 0 and W >= 0; the rows
    of W_l >= 0, its bias small), the destination's and edge's terms are scaled down to a few
    hundredths. TransformerConv has no kink and keeps its weights."""
    state = {k: v.clone() for k, v in module.state_dict().items()}
    if layer == "GATConv":
        state["lin.weight"] = state["lin.weight"].abs()
        state["att_src"] = state["att_src"].abs()
        for k in ("att_dst", "lin_edge.weight"):
            state[k] = 0.05 * state[k]
    elif layer == "GATv2Conv":
        state["lin_l.weight"] = state["lin_l.weight"].abs()
        for k in ("lin_l.bias", "lin_r.weight", "lin_r.bias", "lin_edge.weight"):
            state[k] = 0.02 * state[k]
    return state


def _hub_inputs(layer, opts):
    ei, n = _hub_graph_2e5()
    state = _sign_controlled_state(layer, getattr(gnnio.nn, layer)(8, 4, **opts))
    sign = torch.randint(0, 2, (n, 1)).float() * 2 - 1
    x, ea = sign * (0.5 + 0.5 * torch.rand(n, 8)), torch.rand(ei.size(1), 2)
    return ei, n, state, x, ea


def _forward_backward(module, x, ei, ea):
    x = x.detach().requires_grad_()
    ea = ea.detach().requires_grad_()
    out = module(x, ei, ea)
    gout = torch.cos(torch.arange(out.numel(), device=out.device, dtype=torch.float64)).view_as(out)
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(out, [x, ea] + [params[k] for k in sorted(params)],
                                gout.to(out.dtype))
    return out, grads


def _module_with(layer, opts, state, device, dtype):
    m = getattr(gnnio.nn, layer)(8, 4, **opts)
    m.load_state_dict(state)
    return m.to(device=device, dtype=dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_matches_cpu_on_hub(layer, opts):
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    plan = gnnio.plan.plan_attention(gnnio.Graph(ei, num_nodes=n), 8, backward=True)
    assert plan.heavy_rows is not None and plan.heavy_src is not None  # the split is exercised
    results = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.float32), ("cpu", torch.float64)):
        m = _module_with(layer, opts, state, device, dtype)
        results.append(_forward_backward(m, x.to(device, dtype), ei.to(device), ea.to(device, dtype)))
    (o_c, g_c), (o_g, g_g), (o_e, g_e) = results
    # The CPU kernel accumulates a row in float64; the CUDA kernel in float32, in chunks merged
    # afterwards. Float32 rounding of a sum of L terms grows like sqrt(L) eps32 typically: the
    # floor is 2 sqrt(L) eps32 of the scale, besides "no worse than twice the CPU's error".
    # Parameter gradients are sums over all nodes / edges (torch's GEMMs): floor as run_pair's.
    rows = n + ei.size(1)

    def floor(t, param=False):
        k = max(8.0, 4 * math.sqrt(rows)) if param else 2 * math.sqrt(L_HUB)
        return k * EPS32 * max(t.abs().max().item(), 1.0)

    assert_no_worse_than_reference(o_g.cpu(), o_c, o_e, floor=floor(o_e))
    for i, (a, b, c) in enumerate(zip(g_g, g_c, g_e)):
        assert_no_worse_than_reference(a.cpu(), b, c, floor=floor(c, param=i >= 2))


def _emulate_low_precision(monkeypatch, layer):
    """Makes the layer run its op in float32 on fp16 / bf16 operands, rounding the results back:
    the CUDA kernel's precision model (fp32 inside, each result rounded once), on the CPU."""
    import importlib
    module = importlib.import_module(f"gnnio.nn.conv.{_MODULES[layer]}")
    real = module.graph_attention

    def emulated(graph, kind, value, **kwargs):
        dtype = value.dtype
        if dtype not in (torch.float16, torch.bfloat16):
            return real(graph, kind, value, **kwargs)
        kwargs = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        result = real(graph, kind, value.float(), **kwargs)
        return result.to(dtype) if isinstance(result, torch.Tensor) else \
            tuple(t.to(dtype) for t in result)

    monkeypatch.setattr(module, "graph_attention", emulated)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_low_precision_on_hub(monkeypatch, layer, opts, dtype):
    """bf16 / fp16 on CUDA against float64 on the CPU from the same rounded inputs and weights,
    no worse than twice a CPU emulation of the same precision model (dense parts in the dtype,
    the op in fp32, each result rounded once), plus a floor of one rounding to the dtype and the
    fp32 accumulation over the hub's L = 2*10^5 terms: (eps + 4 sqrt(L) eps32) of the scale.

    Why an emulation and not eps alone: the dtype's roundings of the layer's dense parts (the
    projections, scores, the incoming gradient) enter every one of the hub row's 2*10^5 terms
    with random signs, so that row's error grows like sqrt(L) eps of a term while the row itself
    can be much smaller than sqrt(L) terms (cancellation): up to ~30 eps of the scale for the
    input gradient of the hub here, data-dependent. The emulation carries the same roundings of
    the same numbers, so it measures that part, and the floor bounds what the kernel adds.
    Parameter gradients (sums over all nodes by torch's GEMMs) are checked in fp32 only."""
    eps = torch.finfo(dtype).eps
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    state = {k: v.to(dtype).double() for k, v in state.items()}
    x, ea = x.to(dtype), ea.to(dtype)
    out, grads = _forward_backward(_module_with(layer, opts, state, "cuda", dtype), x.cuda(),
                                   ei.cuda(), ea.cuda())
    assert out.dtype == dtype
    _emulate_low_precision(monkeypatch, layer)
    out_t, grads_t = _forward_backward(_module_with(layer, opts, state, "cpu", dtype), x, ei, ea)
    out_e, grads_e = _forward_backward(_module_with(layer, opts, state, "cpu", torch.float64),
                                       x.double(), ei, ea.double())
    rel = eps + 4 * math.sqrt(L_HUB) * EPS32
    for a, b, c in [(out, out_t, out_e), (grads[0], grads_t[0], grads_e[0]),
                    (grads[1], grads_t[1], grads_e[1])]:
        assert_no_worse_than_reference(a.cpu(), b, c, floor=rel * c.abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind,optional", OP_CASES, ids=OP_IDS)
def test_cuda_op_on_hub(kind, optional, dtype):
    """The op alone, CUDA against float64 on the CPU from the same operands (``signed``: no
    LeakyReLU branch can flip): nothing rounds in between, so the error is the kernel's fp32
    accumulation over up to L terms (~sqrt(L) eps32 of the scale; 4x margin) plus one rounding
    of the result to the dtype (eps/2; 2x margin), per element."""
    ei, n = _hub_graph_2e5()
    graph, gcuda = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    ops = make_operands(kind, optional, graph, 2, 4, dtype, torch.Generator().manual_seed(4),
                        signed=True)
    names = list(ops)
    ts = [t.cuda().requires_grad_() for t in ops.values()]
    out = gnnio.ops.graph_attention(gcuda, kind, **dict(zip(names, ts)), scale=0.5)
    te = [t.double().requires_grad_() for t in ops.values()]
    out_e = gnnio.ops.graph_attention(graph, kind, **dict(zip(names, te)), scale=0.5)
    assert out.dtype == dtype
    gout = torch.cos(torch.arange(out.numel(), dtype=torch.float64)).view_as(out_e).to(dtype)
    g = torch.autograd.grad(out, ts, gout.cuda())
    g_e = torch.autograd.grad(out_e, te, gout.double())
    rel = 4 * math.sqrt(L_HUB) * EPS32 + torch.finfo(dtype).eps
    for what, a, c in [("out", out, out_e)] + list(zip([f"d{k}" for k in names], g, g_e)):
        err, scale = (a.cpu().double() - c).abs().max().item(), c.abs().max().item()
        assert err <= rel * scale, f"{what}: error {err:.3g} > {rel:.2g} x scale {scale:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_dropout_masks_equal_cpu(monkeypatch, layer, opts):
    """The mask is a function of (seed, CSR slot, head) and a layer draws its seed from the CPU
    default generator: the same seed gives the same mask on both devices, layer and op."""
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    spy = _spy_on(monkeypatch, layer)
    for device in ("cpu", "cuda"):
        m = _module_with(layer, dict(opts, dropout=0.3), state, device, torch.float32)
        torch.manual_seed(3)
        m(x.to(device), ei.to(device), ea.to(device))
    w_c, w_g = spy.weights
    assert torch.equal(w_c == 0, w_g.cpu() == 0)
    assert 0.25 < (w_c == 0).double().mean().item() < 0.35
    graph, gcuda = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    ops = make_operands("gatv2", ("edge_key",), graph, 2, 4, torch.float32,
                        torch.Generator().manual_seed(6))
    for seed in (0, 1, 2**40 + 3):
        _, w_c = gnnio.ops.graph_attention(graph, "gatv2", **ops, dropout=0.5, seed=seed,
                                           return_weights=True)
        _, w_g = gnnio.ops.graph_attention(gcuda, "gatv2", **{k: v.cuda() for k, v in ops.items()},
                                           dropout=0.5, seed=seed, return_weights=True)
        assert torch.equal(w_c == 0, w_g.cpu() == 0)


@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
def test_opcheck_graph_attention(kind):
    # Schema, fake (meta) kernel, autograd registration and torch.compile's view of the op.
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    H, C, E = 2, 3, ei.size(1)

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    value = r(n, H, C)
    scores = [r(n, H), r(n, H), r(E, H)] if kind == "gat" else [None, None, None]
    qk = [r(n, H, C), r(n, H, C), r(E, H, C)] if kind != "gat" else [None, None, None]
    att = r(H, C) if kind == "gatv2" else None
    edge_value = r(E, H, C) if kind == "dot" else None
    args = (f.rowptr, f.col, {"gat": 0, "gatv2": 1, "dot": 2}[kind], value, *scores, *qk, att,
            edge_value, n, 0.2, 0.5, 0.25, 7, True, t.rowptr, t.col, g.src_slot_to_dst_slot)
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args)
