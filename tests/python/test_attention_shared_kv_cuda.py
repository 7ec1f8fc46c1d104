"""Shared key and value rows on CUDA (params.h's shared_kv; shared_rows_forward_kernel reads a
source's one row per edge for all heads): its forward against the per-head kernel on the rows
copied per head (the same sums in the same order: the same bits, split rows included), its
backward (the copied rows' per-head backward, summed over heads) against float64, the
fallbacks to copying, and TransformerConv's reassociated form on CUDA against PyG. Skipped
without a GPU."""
import zlib

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import random_graph
from test_attention_cuda import GRAPHS  # random, hub_in / hub_out (2*10^5 slots: split), bipartite, no_edges

pytestmark = pytest.mark.cuda


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (heads, channels): the kernel's layouts (4 channels a lane up to 128, 8 up to 256; 2, 4 or 8
# heads held), heads below the held count, channels that are not a multiple of a lane's.
SHAPES = [(4, 128), (3, 128), (8, 128), (2, 64), (5, 16), (4, 256), (2, 200), (4, 30)]


def make(graph_name, heads, channels, dtype, same_rows, seed_text):
    ei, (ns, nd) = GRAPHS[graph_name]
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    gen = torch.Generator().manual_seed(zlib.crc32(seed_text.encode()))

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * s).to(dtype).cuda().requires_grad_()
    query = r(nd, heads, channels, s=0.3)
    value = r(ns, 1, channels)
    key = value if same_rows else r(ns, 1, channels, s=0.3)
    return graph, query, key, value


def copied(t, heads):
    return t.expand(-1, heads, -1).contiguous()


@pytest.mark.parametrize("dropout", [0.0, 0.25], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("same_rows", [True, False], ids=["key_is_value", "key_and_value"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads,channels", SHAPES, ids=[f"{h}x{c}" for h, c in SHAPES])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_cuda_shared_rows_are_the_copied_rows_bits(graph_name, heads, channels, dtype, same_rows,
                                                   dropout):
    """Forward out and d query are the per-head kernel's bits on the rows copied per head (the
    same sums, the same stats, the same dropout mask); d key and d value sum its per-head
    gradients over heads. key_is_value runs the shared-row kernel; a separate key is copied per
    head by the binding (the kernel reads one row)."""
    graph, query, key, value = make(graph_name, heads, channels, DTYPES[dtype], same_rows,
                                    f"{graph_name}-{heads}-{channels}-{dtype}-{same_rows}")
    bias = torch.randn(heads * channels, dtype=query.dtype, device="cuda")
    kw = dict(scale=0.2, bias=bias, dropout=dropout, seed=99)
    out = gnnio.ops.graph_attention(graph, "dot", value, query=query, key=key, **kw)
    value_c = copied(value, heads)
    key_c = value_c if same_rows else copied(key, heads)
    ref = gnnio.ops.graph_attention(graph, "dot", value_c, query=query, key=key_c, **kw)
    assert torch.equal(out, ref)
    gout = torch.randn_like(out)
    tensors = [query, value] if same_rows else [query, key, value]
    ours = torch.autograd.grad(out, tensors, gout)
    theirs = torch.autograd.grad(ref, tensors, gout)
    assert torch.equal(ours[0], theirs[0])
    for a, b in zip(ours[1:], theirs[1:]):  # the same per-head values, summed over heads
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dropout", [0.0, 0.25], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("rows", ["shared", "per_head"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("heads,channels", [(4, 128), (4, 256), (2, 200), (4, 30)],
                         ids=["4x128", "4x256", "2x200", "4x30"])
@pytest.mark.parametrize("graph_name", ["random", "hub_in", "bipartite"])
def test_cuda_16bit_dot_is_float32_rounded(graph_name, heads, channels, dtype, rows, dropout):
    """A 16-bit forward converts its inputs to float32 exactly and then does the float32 build's
    arithmetic, every rounding pinned (score.cuh): its output is the float32 forward's on the same
    values, rounded once (no bias: PyG rounds out before adding it). What caught ptxas fusing
    e * scale into e - m in one build only (bench/NOTES.md v20). Split hub rows included."""
    graph, query, key, value = make(graph_name, heads, channels, DTYPES[dtype], True,
                                    f"rounded-{graph_name}-{heads}-{channels}-{dtype}")
    q, v = query.detach(), value.detach()
    if rows == "per_head":
        v = copied(v, heads)
    kw = dict(scale=0.2, dropout=dropout, seed=17)
    with torch.no_grad():
        low = gnnio.ops.graph_attention(graph, "dot", v, query=q, key=v, **kw)
        wide = gnnio.ops.graph_attention(graph, "dot", v.float(), query=q.float(), key=v.float(), **kw)
    assert torch.equal(low, wide.to(low.dtype))


@pytest.mark.parametrize("heads_per_warp", ["2", "4"])
@pytest.mark.parametrize("heads,channels", [(4, 128), (3, 128), (8, 64), (4, 256)],
                         ids=["4x128", "3x128", "8x64", "4x256"])
@pytest.mark.parametrize("graph_name", ["random", "hub_in"])
def test_cuda_shared_rows_head_groups_are_the_same_bits(monkeypatch, graph_name, heads, channels,
                                                        heads_per_warp):
    """GNNIO_SHARED_ROWS_HEADS splits a row's heads over warps (head groups): a head's sums do not
    depend on its group, so out is the same bits as with all heads in one warp."""
    graph, query, key, value = make(graph_name, heads, channels, torch.float32, True,
                                    f"groups-{graph_name}-{heads}-{channels}")
    kw = dict(query=query, key=key, scale=0.2, dropout=0.25, seed=5)
    whole = gnnio.ops.graph_attention(graph, "dot", value, **kw)
    monkeypatch.setenv("GNNIO_SHARED_ROWS_HEADS", heads_per_warp)
    grouped = gnnio.ops.graph_attention(graph, "dot", value, **kw)
    assert torch.equal(whole, grouped)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("graph_name", ["random", "hub_in", "hub_out", "bipartite"])
def test_cuda_shared_rows_against_float64(graph_name, dtype, dropout):
    """Against the CPU float64 kernel with the same dropout mask: no worse than the copied rows
    through the per-head kernel at the same precision (the rule of the attention CUDA tests)."""
    heads, channels = 4, 128
    graph, query, key, value = make(graph_name, heads, channels, DTYPES[dtype], False,
                                    f"f64-{graph_name}-{dtype}-{dropout}")
    gout = torch.randn(graph.num_dst, heads, channels, device="cuda").to(query.dtype)
    kw = dict(scale=0.2, dropout=dropout, seed=123)

    def run(q, k, v, copy):
        kk, vv = (copied(k, heads), copied(v, heads)) if copy else (k, v)
        out = gnnio.ops.graph_attention(graph if q.is_cuda else cpu_graph, "dot", vv, query=q, key=kk, **kw)
        return [out] + list(torch.autograd.grad(out, [q, k, v], gout.to(out.device, out.dtype)))
    ei, size = GRAPHS[graph_name]
    cpu_graph = gnnio.Graph(ei, size=size)
    exact = run(*(t.detach().cpu().double().requires_grad_() for t in (query, key, value)), copy=False)
    ours = run(query, key, value, copy=False)
    theirs = run(query, key, value, copy=True)
    for a, b, c in zip(ours, theirs, exact):
        assert_no_worse_than_reference(a.cpu(), b.cpu(), c)


@pytest.mark.parametrize("case", ["weights", "edge_key", "heads16", "channels512"])
def test_cuda_shared_rows_fallbacks(case):
    """Operands the shared-row kernel does not take are copied per head: the CPU kernel's results
    (float64 on both sides: the same contract, to rounding)."""
    heads = 16 if case == "heads16" else 2
    channels = 512 if case == "channels512" else 8
    ei, n = random_graph(200, 2000)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, h, channels, generator=gen, dtype=torch.float64) for h in (heads, 1, 1))
    extra = dict(edge_key=torch.randn(ei.size(1), heads, channels, generator=gen, dtype=torch.float64))\
        if case == "edge_key" else {}
    if case == "channels512":
        with pytest.raises(ValueError, match="up to 256 channels"):
            gnnio.ops.graph_attention(gnnio.Graph(ei.cuda(), num_nodes=n), "dot", v.float().cuda(),
                                      query=q.float().cuda(), key=k.float().cuda())
        return
    results = []
    for device, dtype in (("cpu", torch.float64), ("cuda", torch.float32)):
        graph = gnnio.Graph(ei.to(device), num_nodes=n)
        to = dict(device=device, dtype=dtype)
        res = gnnio.ops.graph_attention(graph, "dot", v.to(**to), query=q.to(**to), key=k.to(**to),
                                        return_weights=case == "weights",
                                        **{name: t.to(**to) for name, t in extra.items()})
        results.append(res if isinstance(res, tuple) else (res,))
    for a, b in zip(*results):
        torch.testing.assert_close(b.double().cpu(), a, rtol=1e-4, atol=1e-5)


def test_cuda_transformer_reassociated_matches_pyg(monkeypatch):
    """The layer's reassociated form on CUDA, on the 2*10^5-neighbour hub, against PyG's layer in
    float64 (CPU): no worse than twice PyG's own float32 error on CUDA, with the hub tests' floors
    (a row of L terms rounds like sqrt(L) eps32; a parameter's gradient sums over every row)."""
    import math

    from test_attention import make_pair

    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "reassociated")
    ei, (n, _) = GRAPHS["hub_in"]
    pyg, ours = make_pair("TransformerConv", 32, 8, heads=4)
    x = torch.randn(n, 32)
    results = []
    for module, device, dtype in ((ours, "cuda", torch.float32), (pyg, "cuda", torch.float32),
                                  (pyg, "cpu", torch.float64)):
        m = __import__("copy").deepcopy(module).to(device=device, dtype=dtype)
        xi = x.to(device, dtype).requires_grad_()
        out = m(xi, ei.to(device))
        gout = torch.cos(torch.arange(out.numel(), device=device, dtype=torch.float64)).view_as(out)
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(out, [xi] + [params[k] for k in sorted(params)], gout.to(dtype))
        results.append([out.cpu()] + [g.cpu() for g in grads])
    eps = torch.finfo(torch.float32).eps
    rows = n + ei.size(1)
    for i, (a, b, c) in enumerate(zip(*results)):
        k = max(8.0, 4 * math.sqrt(rows)) if i >= 2 else 2 * math.sqrt(200_000)
        assert_no_worse_than_reference(a, b, c, floor=k * eps * max(c.abs().max().item(), 1.0))
