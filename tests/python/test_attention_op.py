"""gnnio.ops.graph_attention on the CPU (kinds 'gat', 'gatv2', 'dot': fused online softmax,
weights recomputed in the backward, dropout from a counter-based mask): a materialised reference,
gradcheck in float64, dropout statistics and masks, bad inputs, opcheck."""
import math

import pytest
import torch
import torch.nn.functional as F

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import random_graph, real

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

EPS32 = torch.finfo(torch.float32).eps



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
    (dict(kind="dot", bias=torch.randn(7)), ValueError, "bias"),
    (dict(kind="gat", bias=torch.randn(8, dtype=torch.float64)), TypeError, "bias"),
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


# -- the output bias ----------------------------------------------------------------------------

BIAS_CASES = [("gat", ("dst_score",)), ("gatv2", ()), ("dot", ("edge_value",))]


def bias_sum_bound(gout):
    """Two float32 sums of the same N terms in different orders each lie within (N - 1) u sum|g|
    of the exact sum (u = eps / 2), so they differ by at most (N - 1) eps sum|g| per column."""
    n = gout.size(0)
    return (n - 1) * torch.finfo(gout.dtype).eps * gout.abs().sum(0).reshape(-1)


def check_output_bias(graph, kind, ops, bias, grad):
    """graph_attention(bias=b) is graph_attention() + b, bit for bit: the kernel adds the bias in
    its store of out when nothing keeps out (no gradient; GATv2 on CUDA) or when out_acc keeps
    the attention output alone for D_i (bf16/fp16, and float32 on CUDA); the autograd adds it to
    a new tensor when out itself is kept (the CPU). Gradients: every operand's the same bits as the
    unbiased op's followed by ``+ b`` (the backward reads the same stats and out), d b the column
    sum of d out within two summation orders' bound."""
    heads, channels = ops["value"].shape[1:]
    with torch.set_grad_enabled(grad):
        leaves = {k: t.detach().requires_grad_(grad) for k, t in ops.items()}
        b = bias.detach().requires_grad_(grad)
        got = gnnio.ops.graph_attention(graph, kind, **leaves, bias=b)
        ref_leaves = {k: t.detach().requires_grad_(grad) for k, t in ops.items()}
        ref_b = bias.detach().requires_grad_(grad)
        want = gnnio.ops.graph_attention(graph, kind, **ref_leaves) + ref_b.view(heads, channels)
    assert torch.equal(got, want)
    if not grad:
        return
    gout = torch.randn(got.shape, generator=torch.Generator().manual_seed(11)).to(got)
    g_got = torch.autograd.grad(got, list(leaves.values()) + [b], gout)
    g_want = torch.autograd.grad(want, list(ref_leaves.values()) + [ref_b], gout)
    for name, a, w in zip(list(leaves) + ["bias"], g_got, g_want):
        if name == "bias":
            assert ((a - w).abs() <= bias_sum_bound(gout)).all()
        else:
            assert torch.equal(a, w), name


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("kind,optional", BIAS_CASES, ids=[k for k, _ in BIAS_CASES])
def test_output_bias_is_the_separate_add(kind, optional, grad):
    ei, n = random_graph(50, 400, generator=torch.Generator().manual_seed(21))
    graph = gnnio.Graph(ei, num_nodes=n + 3)  # three empty rows: out is the bias alone there
    gen = torch.Generator().manual_seed(22)
    ops = make_operands(kind, optional, graph, 3, 5, torch.float32, gen)
    check_output_bias(graph, kind, ops, torch.randn(15, generator=gen), grad)


@pytest.mark.parametrize("kind,optional", BIAS_CASES, ids=[k for k, _ in BIAS_CASES])
def test_output_bias_gradcheck_float64(kind, optional):
    gen = torch.Generator().manual_seed(23)
    ei = torch.stack([torch.randint(7, (30,), generator=gen), torch.randint(6, (30,), generator=gen)])
    graph = gnnio.Graph(ei, size=(7, 6))
    ops = make_operands(kind, optional, graph, 2, 3, torch.float64, gen)
    names = list(ops) + ["bias"]
    tensors = [t.requires_grad_() for t in ops.values()]
    bias = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_op(graph, kind, names), tensors + [bias])
    # the bias alone requiring grad: the backward returns its gradient and nothing else
    assert torch.autograd.gradcheck(lambda b: _op(graph, kind, names)(*[t.detach() for t in tensors], b),
                                    [bias])


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


@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot", "dot_shared"])
def test_opcheck_graph_attention(kind):
    # Schema, fake (meta) kernel, autograd registration and torch.compile's view of the op.
    # dot_shared: key and value rows shared by the query's heads (the fake's heads are the query's).
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    H, C, E = 2, 3, ei.size(1)
    shared = kind == "dot_shared"
    kind = "dot" if shared else kind

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    value = r(n, 1 if shared else H, C)
    scores = [r(n, H), r(n, H), r(E, H)] if kind == "gat" else [None, None, None]
    qk = [r(n, H, C), r(n, 1 if shared else H, C), r(E, H, C)] if kind != "gat" else [None, None, None]
    att = r(H, C) if kind == "gatv2" else None
    edge_value = r(E, H, C) if kind == "dot" else None
    args = (f.rowptr, f.col, {"gat": 0, "gatv2": 1, "dot": 2}[kind], value, *scores, *qk, att,
            edge_value, n, 0.2, 0.5, 0.25, 7, True, t.rowptr, t.col, g.src_slot_to_dst_slot)
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args)
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args, {"bias": r(H * C)})
    # The forward ignores backward_in_place (an instruction to the autograd, CUDA dot only).
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args, {"backward_in_place": True})


def test_backward_in_place_is_ignored_on_the_cpu():
    """backward_in_place applies to the CUDA dot kernels only: on the CPU the gradients are the
    same bits as without it, and value and key keep their contents and versions."""
    ei, n = random_graph(300, 3000, generator=torch.Generator().manual_seed(3))
    g = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    value, query, key = (torch.randn(n, 2, 8, generator=gen).requires_grad_() for _ in range(3))
    gout = torch.randn(n, 2, 8, generator=gen)
    grads = []
    for in_place in (False, True):
        v, k = value.detach().clone().requires_grad_(), key.detach().clone().requires_grad_()
        q = query.detach().clone().requires_grad_()
        v1, k1 = v * 1, k * 1  # non-leaf, as a layer's projections
        before = (v1.detach().clone(), k1.detach().clone(), v1._version, k1._version)
        out = gnnio.ops.graph_attention(g, "dot", v1, query=q, key=k1, scale=0.3,
                                        backward_in_place=in_place)
        grads.append(torch.autograd.grad(out, (v, q, k), gout))
        assert torch.equal(v1, before[0]) and torch.equal(k1, before[1])
        assert (v1._version, k1._version) == before[2:]
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("edge_key", [False, True])
def test_gatv2_key_is_value_gradient_matches_separate_tensors(edge_key, dropout):
    # GATv2 passes x_l as both key and value; the kernel then writes one gradient holding both
    # (key_grad_into_value). It must equal what autograd sums from two separate tensors.
    gen = torch.Generator().manual_seed(11)
    ei, n = random_graph(40, 300, generator=gen)
    graph = gnnio.Graph(ei, num_nodes=n + 1)
    heads, channels = 3, 5
    x = torch.randn(n + 1, heads, channels, dtype=torch.float64, generator=gen)
    query = torch.randn(n + 1, heads, channels, dtype=torch.float64, generator=gen)
    att = torch.randn(heads, channels, dtype=torch.float64, generator=gen)
    ek = torch.randn(ei.size(1), heads, channels, dtype=torch.float64, generator=gen) if edge_key else None
    dout = torch.randn(n + 1, heads, channels, dtype=torch.float64, generator=gen)

    def grads(shared):
        xs = x.clone().requires_grad_()
        q = query.clone().requires_grad_()
        key = xs if shared else x.clone().requires_grad_()
        out = gnnio.ops.graph_attention(graph, "gatv2", xs, query=q, key=key, att=att, edge_key=ek,
                                        dropout=dropout, seed=3)
        inputs = (xs, q) if shared else (xs, q, key)
        g = torch.autograd.grad(out, inputs, dout)
        return (g[0], g[1]) if shared else (g[0] + g[2], g[1])

    (gx_shared, gq_shared), (gx_sep, gq_sep) = grads(True), grads(False)
    # The same float64 sums, added once in the kernel instead of once by autograd: a few ulps.
    torch.testing.assert_close(gx_shared, gx_sep, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gq_shared, gq_sep, rtol=0, atol=0)


def test_backward_refuses_key_into_value_when_key_is_not_value():
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    H, C = 2, 3
    value, query, key = (torch.randn(n, H, C, dtype=torch.float64) for _ in range(3))
    att = torch.randn(H, C, dtype=torch.float64)
    out, stats, _, out_acc = torch.ops.gnnio.graph_attention(
        f.rowptr, f.col, 1, value, None, None, None, query, key, None, att, None, n, 0.2, 1.0, 0.0,
        0, False, t.rowptr, t.col, g.src_slot_to_dst_slot)
    assert out_acc.numel() == 0  # float64 values: out is already unrounded
    def backward(grad_out, needs):
        return torch.ops.gnnio.graph_attention_backward(
            f.rowptr, f.col, 1, value, [None, None, None, query, key, None, att, None], n,
            [0.2, 1.0, 0.0], 0, t.rowptr, t.col, g.src_slot_to_dst_slot, [None] * 4, [2**62, 2**62],
            out, stats, grad_out, needs)
    with pytest.raises(ValueError, match="key to be value"):
        backward(torch.ones_like(out), [1, 0, 0, 0, 0, 2, 0, 0, 0])
    # 2 means "into value's gradient" only for key; anything else is refused, not half-honoured.
    with pytest.raises(ValueError, match="needs entries are 0 or 1"):
        backward(torch.ones_like(out), [1, 0, 0, 0, 2, 0, 0, 0, 0])
    # grad_out is read as value's dtype by the kernels: another dtype is refused.
    with pytest.raises(TypeError, match="grad_out must have value's dtype"):
        backward(torch.ones_like(out, dtype=torch.float32), [1, 0, 0, 0, 1, 1, 0, 0, 0])
    assert len(backward(torch.ones_like(out), [1, 0, 0, 0, 1, 1, 0, 0, 0])) == 9


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # fake tensors: no GPU needed
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fake_out_acc_follows_the_kernels_rule(dtype, device):
    # The fake kernel's out_acc (torch.compile's view) when the autograd asks for it: float32
    # [N, H, C] for bf16/fp16 values, and for float32 values on CUDA (out before the bias), else
    # empty (float32 on the CPU); attention_common.h's out_acc_available, the kernels' rule.
    from torch._subclasses.fake_tensor import FakeTensorMode
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    with FakeTensorMode(allow_non_fake_inputs=True):
        value = torch.empty(n, 2, 4, dtype=dtype, device=device)
        index = [a.to(device) for a in (f.rowptr, f.col, t.rowptr, t.col, g.src_slot_to_dst_slot)]
        res = torch.ops.gnnio.graph_attention(
            index[0], index[1], 2, value, None, None, None, value, value, None, None, None, n, 0.2,
            1.0, 0.0, 0, False, *index[2:], save_out_acc=True)
    kept = dtype != torch.float32 or device == "cuda"
    assert res[3].dtype == torch.float32
    assert tuple(res[3].shape) == ((n, 2, 4) if kept else (0,))


def _saved_out_case(device):
    ei, n = random_graph(300, 3000, generator=torch.Generator().manual_seed(4))
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, 2, 8, generator=gen).to(device).requires_grad_()
    q = torch.randn(n, 2, 8, generator=gen).to(device).requires_grad_()
    att = torch.randn(2, 8, generator=gen).to(device).requires_grad_()
    return g, x, q, att


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_retain_graph_second_backward_same_gradients(device):
    """The backward may let go of out (CUDA, once D_i is formed) only when the graph is not kept:
    a second backward after retain_graph=True gives the same gradients."""
    g, x, q, att = _saved_out_case(device)
    out = gnnio.ops.graph_attention(g, "gatv2", x, query=q, key=x, att=att)
    gout = torch.randn_like(out)
    first = torch.autograd.grad(out, (x, q, att), gout, retain_graph=True)
    second = torch.autograd.grad(out, (x, q, att), gout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(out, (x, q, att), gout)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_inplace_change_of_out_is_refused(monkeypatch, device):
    # GATv2 on CUDA keeps no out by default (its pass A forms D_i): the kept-out path (the CPU's,
    # and CUDA's with GNNIO_GATV2_DELTA_IN_PASS_A=0) is tested here, the other in
    # test_attention_cuda.py.
    monkeypatch.setenv("GNNIO_GATV2_DELTA_IN_PASS_A", "0")
    g, x, q, att = _saved_out_case(device)
    out = gnnio.ops.graph_attention(g, "gatv2", x, query=q, key=x, att=att)
    loss = out.sum()
    with torch.no_grad():
        out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_saved_tensor_hooks_see_out():
    """With saved-tensor hooks active (checkpointing, offloading) out is a saved variable like
    the others, so the hooks see it; the gradients are the same as without hooks."""
    g, x, q, att = _saved_out_case("cpu")
    gout = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    out = gnnio.ops.graph_attention(g, "gatv2", x, query=q, key=x, att=att)
    plain = torch.autograd.grad(out, (x, q, att), gout)
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gnnio.ops.graph_attention(g, "gatv2", x, query=q, key=x, att=att)
    assert any(t.data_ptr() == out.data_ptr() for t in packed)
    for a, b in zip(plain, torch.autograd.grad(out, (x, q, att), gout)):
        assert torch.equal(a, b)
