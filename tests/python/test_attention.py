"""The attention layers gnnio.nn.GATConv / GATv2Conv / TransformerConv against PyG 2.8 on the
same weights: every option, real and adversarial graphs, bipartite inputs, return_attention_weights,
dropout with the kernel's mask, refused arguments. The op itself: test_attention_op.py; CUDA:
test_attention_cuda.py and test_attention_cuda_hub.py (the layers on CUDA)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real
from layer_pairs import clear_of_kink, leaky_relu_inputs

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


def kink_clear(pyg, call) -> bool:
    """Whether no LeakyReLU input of PyG's float64 forward of ``call`` is too close to 0
    (layer_pairs.KINK: such a draw is drawn again)."""
    z32 = leaky_relu_inputs(lambda: call(pyg, torch.float32))
    z64 = leaky_relu_inputs(lambda: call(copy.deepcopy(pyg).double(), torch.float64))
    return clear_of_kink(z32, z64)


@pytest.mark.parametrize("layer,opt", LAYER_CASES, ids=[f"{a}-{b}" for a, b in LAYER_CASES])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_layer_matches_pyg(layer, opt, name, ei, n):
    opts = LAYERS[layer][opt]
    pyg, ours = make_pair(layer, 7, 5, **opts)
    for _ in range(50):
        x = torch.randn(n, 7)
        call = layer_call(x, ei, edge_features(opts, ei.size(1)))
        if kink_clear(pyg, call):
            break
    else:
        pytest.fail("no draw of 50 kept every score clear of LeakyReLU's kink")
    run_pair(pyg, ours, call, rows=n + ei.size(1))


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


@pytest.mark.parametrize("inputs", ["shared", "pair", "bipartite"])
@pytest.mark.parametrize("heads,channels", [(2, 3), (3, 4)])
def test_gat_conv_gradcheck_float64(inputs, heads, channels):
    """GATConv in float64 against finite differences, in x (both sides) and every parameter:
    the projection, both scores (head_scores), the attention op and the output bias."""
    ei, n = random_graph(8, 30, generator=torch.Generator().manual_seed(41))
    in_channels = (4, 3) if inputs == "bipartite" else 4
    layer = gnnio.nn.GATConv(in_channels, channels, heads=heads).double()
    names = [k for k, p in layer.named_parameters()]
    gen = torch.Generator().manual_seed(42)
    params = [(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
              for p in layer.parameters()]
    xs = torch.randn(n, 4, generator=gen, dtype=torch.float64).requires_grad_()
    xd = torch.randn(n, 3 if inputs == "bipartite" else 4, generator=gen,
                     dtype=torch.float64).requires_grad_()

    def f(xs, xd, *ps):
        x = xs if inputs == "shared" else (xs, xd)
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x, ei))
    assert torch.autograd.gradcheck(f, [xs, xd] + params)


# -- the op: reference, gradcheck ---------------------------------------------------------------

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
    ({"decomposed_layers": 2}, "decomposed_layers"),
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


@pytest.mark.parametrize("layer,opts", [("GATConv", {"heads": 2}), ("GATv2Conv", {"heads": 2}),
                                        ("TransformerConv", {"heads": 2}),
                                        ("GATConv", {"heads": 2, "edge_dim": 3})])
def test_loss_on_returned_attention_weights_has_pyg_gradients(layer, opts):
    # PyG's returned weights are differentiable: a loss on them must give the same gradients.
    ei, n = real("cora")
    pyg, ours = make_pair(layer, 6, 4, **opts)
    exact = copy.deepcopy(pyg).double()
    x = torch.randn(n, 6)
    ea = torch.randn(ei.size(1), 3) if "edge_dim" in opts else None
    results = []
    for module, dtype in ((pyg, torch.float32), (ours, torch.float32), (exact, torch.float64)):
        xi = x.to(dtype).requires_grad_()
        args = (xi, ei) if ea is None else (xi, ei, ea.to(dtype))
        out, (_, alpha) = module(*args, return_attention_weights=True)
        g_alpha = torch.cos(torch.arange(alpha.numel(), dtype=dtype)).view_as(alpha)
        loss = (out * 0.1).sum() + (alpha * g_alpha).sum()
        results.append(torch.autograd.grad(loss, [xi] + list(module.parameters())))
    for g_ours, g_pyg, g_exact in zip(results[1], results[0], results[2]):
        assert_no_worse_than_reference(g_ours, g_pyg, g_exact)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("concat", [True, False])
def test_layer_output_may_be_changed_in_place(layer, concat):
    """A layer's output is the caller's (as PyG's is): an in-place activation on it (F.elu(...,
    inplace=True), as the examples' models do) leaves the backward intact, with the gradients
    of the out-of-place call. (A fused output bias made the output the buffer the op keeps for
    D_i, and this backward then refused the modified tensor: stop 14's training step.)"""
    ei, n = random_graph(40, 300, generator=torch.Generator().manual_seed(3))
    _, ours = make_pair(layer, 8, 4, heads=2, concat=concat)
    with torch.no_grad():
        for p in ours.parameters():  # no zero bias: a bias is what made the output the op's out
            p.normal_()
    x = torch.randn(n, 8, requires_grad=True)
    want = torch.autograd.grad(F.elu(ours(x, ei)).sum(), [x] + list(ours.parameters()))
    got = torch.autograd.grad(F.elu(ours(x, ei), inplace=True).sum(), [x] + list(ours.parameters()))
    # ELU's in-place backward reads exp(x) - 1 + 1, not exp(x): one rounding apart, carried
    # through sums over the edges; some gradients (a key bias under softmax) are 0 up to those.
    scale = max(b.abs().max().item() for b in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=4 * EPS32, atol=4 * math.sqrt(ei.size(1)) * EPS32 * scale)
