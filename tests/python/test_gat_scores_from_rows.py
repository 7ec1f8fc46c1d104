"""graph_attention(kind='gat') with ``att [2, H, C]`` in place of its scores: the scores are
a[0] . value_j and a[1] . value_i, which the CUDA forward forms inside the attention kernel from
the rows it gathers, and the binding (CPU, and CUDA where the kernel's lane layout does not
match head_scores') with gnnio.ops.head_scores first. Either way they must be head_scores' bits,
so the op must give exactly what the caller got by passing head_scores' scores itself: forward,
stats, and the gradients of value and att (which the autograd carries through head_scores'
backward). Also against float64 (gradcheck and a materialised reference) and bad inputs."""
import pytest
import torch

import gnnio
from graphs import adversarial, hub, random_graph
from test_attention_op import reference_attention

H, C = 4, 32


def _graphs(device):
    cases = [(name, ei, (n, n)) for name, ei, n in adversarial()]
    ei, n = random_graph(400, 4000)
    cases.append(("random", ei, (n, n)))
    # Fewer destinations than sources: value's first num_dst rows score the destinations.
    cases.append(("fewer_dst", torch.stack([torch.randint(300, (3000,)), torch.randint(100, (3000,))]),
                  (300, 100)))
    if device.type == "cuda":  # a 2*10^5-neighbour destination: the forward's super-node split
        big, nb = hub(200_000)
        cases.append(("hub_in", big, (nb, nb)))
    return cases


def _draw(graph, dtype, device, gen, channels=C):
    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype).to(device)
    value = rand(graph.num_src, H, channels)
    att = rand(2, H, channels, scale=0.3)
    return value, att


def _both_ways(graph, value, att, **kw):
    """(out, grads) of the op with att, and of the op with head_scores' scores passed in."""
    results = []
    for with_att in (True, False):
        v = value.detach().clone().requires_grad_()
        a = att.detach().clone().requires_grad_()
        if with_att:
            out = gnnio.ops.graph_attention(graph, "gat", v, att=a, **kw)
        else:
            s = gnnio.ops.head_scores(v, a)
            out = gnnio.ops.graph_attention(graph, "gat", v, src_score=s[0],
                                            dst_score=s[1, :graph.num_dst], **kw)
        gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3),
                           dtype=torch.float64).to(out.dtype).to(out.device)
        out.backward(gout)
        results.append((out.detach(), v.grad, a.grad))
    return results


def _dtypes(device):
    if device.type == "cpu":
        return [torch.float32, torch.float64]
    return [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("bias", [False, True])
def test_att_gives_the_head_scores_path_bits(device, dropout, bias):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    for name, ei, size in _graphs(device):
        graph = gnnio.Graph(ei.to(device), size=size)
        for dtype in _dtypes(device):
            value, att = _draw(graph, dtype, device, gen)
            b = torch.randn(H * C, generator=gen).to(dtype).to(device) if bias else None
            (out, gv, ga), (out_ref, gv_ref, ga_ref) = _both_ways(
                graph, value, att, dropout=dropout, seed=11, bias=b, negative_slope=0.15)
            what = f"{name} {dtype}"
            assert torch.equal(out, out_ref), what
            assert torch.equal(gv, gv_ref), what
            assert torch.equal(ga, ga_ref), what


@pytest.mark.parametrize("channels", [6, 42, 132])
def test_att_where_the_kernel_cannot_form_the_scores(device, channels):
    # 6 and 42 channels are not whole pieces of 4 (head_scores_piece), 132 is more than 32 of
    # them in float32 and not whole pieces of 8 in bfloat16: the binding forms the scores with
    # head_scores (on CUDA too); the bits are the same.
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    ei, n = random_graph(300, 3000, generator=gen)
    graph = gnnio.Graph(ei.to(device), num_nodes=n)
    dtypes = [torch.float32] if device.type == "cpu" else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        value, att = _draw(graph, dtype, device, gen, channels=channels)
        (out, gv, ga), (out_ref, gv_ref, ga_ref) = _both_ways(graph, value, att)
        assert torch.equal(out, out_ref) and torch.equal(gv, gv_ref) and torch.equal(ga, ga_ref)


def test_att_with_edge_terms_and_weights(device):
    # Edge scores and edge values: the message is value_j + edge_value_k, not the row the
    # kernel scores, so these take head_scores' scores (a review found edge_value dropped).
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    ei, n = random_graph(200, 2000, generator=gen)
    graph = gnnio.Graph(ei.to(device), num_nodes=n)
    value, att = _draw(graph, torch.float32, device, gen)
    edge_score = torch.randn(graph.num_edges, H, generator=gen).to(device)
    edge_value = torch.randn(graph.num_edges, H, C, generator=gen).to(device)
    s = gnnio.ops.head_scores(value, att)
    for kw in (dict(edge_score=edge_score), dict(edge_value=edge_value), dict(return_weights=True),
               dict(edge_score=edge_score, edge_value=edge_value, return_weights=True)):
        got = gnnio.ops.graph_attention(graph, "gat", value, att=att, **kw)
        ref = gnnio.ops.graph_attention(graph, "gat", value, src_score=s[0], dst_score=s[1], **kw)
        for g, r in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)):
            assert torch.equal(g, r), kw


def test_att_against_float64():
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    ei = torch.stack([torch.randint(9, (40,), generator=gen), torch.randint(7, (40,), generator=gen)])
    graph = gnnio.Graph(ei, size=(9, 8))  # one destination without edges, fewer than the sources
    value = torch.randn(9, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    att = torch.randn(2, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)

    def f(v, a):
        return gnnio.ops.graph_attention(graph, "gat", v, att=a, negative_slope=0.1, dropout=0.3,
                                         seed=5)
    assert torch.autograd.gradcheck(f, (value, att))
    src, dst = (value * att[0]).sum(-1), (value * att[1]).sum(-1)[:8]
    _, w = gnnio.ops.graph_attention(graph, "gat", value, att=att, negative_slope=0.1, dropout=0.3,
                                     seed=5, return_weights=True)
    ref, _ = reference_attention(graph, "gat", value, src_score=src, dst_score=dst,
                                 negative_slope=0.1, keep=w != 0, dropout=0.3)
    torch.testing.assert_close(f(value, att), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(att=torch.randn(H, C)), r"att as \[2, heads"),
    (dict(att=torch.randn(2, H, C), src_score=torch.randn(50, H)), "in their place"),
    (dict(att=torch.randn(2, H, C), dst_score=torch.randn(50, H)), "no dst_score"),
])
def test_att_bad_inputs(kwargs, fragment):
    ei, n = random_graph(50, 300)
    graph = gnnio.Graph(ei, num_nodes=n)
    with pytest.raises(ValueError, match=fragment):
        gnnio.ops.graph_attention(graph, "gat", torch.randn(n, H, C), **kwargs)
    wide = gnnio.Graph(torch.tensor([[0, 1], [5, 6]]), size=(3, 7))
    with pytest.raises(ValueError, match="must not exceed num_src"):
        gnnio.ops.graph_attention(wide, "gat", torch.randn(3, H, C), att=torch.randn(2, H, C))


@pytest.mark.cuda
def test_cuda_forward_forms_the_scores_in_the_kernel(monkeypatch):
    # The point of att: no head_scores pass in the forward (and the knob that turns it off
    # brings the pass back, so that this check can see it).
    ei, n = random_graph(1000, 10_000)
    graph = gnnio.Graph(ei.cuda(), num_nodes=n)
    value, att = torch.randn(n, H, C, device="cuda"), torch.randn(2, H, C, device="cuda")

    def kernels():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            gnnio.ops.graph_attention(graph, "gat", value, att=att)
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = kernels()
    assert any("forward_kernel" in k for k in names), names
    assert not any("head_scores" in k for k in names), names
    monkeypatch.setenv("GNNIO_GAT_SCORES_FROM_ROWS", "0")
    assert any("head_scores" in k for k in kernels())


@pytest.mark.cuda
@pytest.mark.parametrize("heads,channels,dtype", [
    (4, 32, torch.bfloat16),   # 8 lanes of 4 (8 bytes each) a head, one row per warp
    (2, 36, torch.float16),    # 9 pieces: 16 lanes, 7 without channels
    (3, 4, torch.bfloat16),    # one lane a head
    (1, 160, torch.bfloat16),  # above 128: 20 pieces of 8 (16 bytes) on 32 lanes
    (2, 128, torch.float32),   # 32 pieces of 4
])
def test_cuda_kernel_forms_the_bits_at_every_piece_layout(heads, channels, dtype):
    # Each layout the forward kernel forms the scores in (dispatch_layout) against head_scores'
    # piece kernel of the same width: the kernel path is taken (no head_scores in the forward),
    # and output and gradients are the bits of the op given head_scores' scores.
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    ei, n = random_graph(500, 6000, generator=gen)
    graph = gnnio.Graph(ei.cuda(), num_nodes=n)
    value = torch.randn(n, heads, channels, generator=gen).to(dtype).cuda()
    att = (0.3 * torch.randn(2, heads, channels, generator=gen)).to(dtype).cuda()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        gnnio.ops.graph_attention(graph, "gat", value, att=att)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not any("head_scores" in k for k in names), names
    (out, gv, ga), (out_ref, gv_ref, ga_ref) = _both_ways(graph, value, att, dropout=0.2, seed=3)
    assert torch.equal(out, out_ref) and torch.equal(gv, gv_ref) and torch.equal(ga, ga_ref)


def test_opcheck_with_att():
    # Schema, fake kernel, and the autograd's backward (head_scores inside it) as torch.compile
    # sees them.
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    args = (f.rowptr, f.col, 0, r(n, 2, 3), None, None, None, None, None, None, r(2, 2, 3), None,
            n, 0.2, 0.5, 0.25, 7, True, t.rowptr, t.col, g.src_slot_to_dst_slot)
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args)
    torch.library.opcheck(torch.ops.gnnio.graph_attention.default, args, {"bias": r(6)})
