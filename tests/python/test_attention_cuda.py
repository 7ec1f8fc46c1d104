"""The fused attention op on CUDA (gnnio.ops.graph_attention): every score kind, with and
without edge terms and dropout, on graphs whose hubs exercise the super-node split in both
directions, against a plain PyTorch computation that materialises every score (at the same
precision and in float64), forward and backward. Skipped without a GPU."""
import pytest
import torch
import torch.nn.functional as F

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import hub, random_graph

pytestmark = pytest.mark.cuda
H, C = 4, 32


def graphs():
    ei, n = random_graph(2000, 20_000)
    big, nb = hub(200_000)
    return {
        "random": (ei, (n, n)),
        "hub_in": (big, (nb, nb)),  # a 2*10^5-neighbour destination: split forward and pass A
        "hub_out": (big.flip(0), (nb, nb)),  # the same node as a source: split pass B
        "bipartite": (torch.stack([torch.randint(300, (3000,)), torch.randint(100, (3000,))]), (300, 100)),
        "no_edges": (torch.empty(2, 0, dtype=torch.long), (5, 5)),
    }


GRAPHS = graphs()


def operands(kind, ns, nd, e, edge_terms, dtype, gen):
    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    ops = {}
    if kind == "gat":
        ops.update(src_score=rand(ns, H), dst_score=rand(nd, H))
        if edge_terms:
            ops["edge_score"] = rand(e, H)
    else:
        ops.update(key=rand(ns, H, C) * 0.3, query=rand(nd, H, C) * 0.3)
        if kind == "gatv2":
            ops["att"] = rand(H, C) * 0.3
        if edge_terms:
            ops["edge_key"] = rand(e, H, C) * 0.3
    if edge_terms and kind == "dot":
        ops["edge_value"] = rand(e, H, C)
    return rand(ns, H, C), ops


def reference(ei, ns, nd, kind, value, ops, slope, scale, keep):
    """Every score materialised, softmax by scatter (the max is a constant shift: detached)."""
    src, dst = ei[0].long(), ei[1].long()
    if kind == "gat":
        raw = ops["src_score"][src] + ops["dst_score"][dst] + ops.get("edge_score", 0)
        e = F.leaky_relu(raw, slope)
    elif kind == "gatv2":
        z = ops["key"][src] + ops["query"][dst] + ops.get("edge_key", 0)
        e = (ops["att"] * F.leaky_relu(z, slope)).sum(-1)
    else:
        e = (ops["query"][dst] * (ops["key"][src] + ops.get("edge_key", 0))).sum(-1) * scale
    m = torch.full((nd, H), float("-inf"), dtype=e.dtype, device=e.device)
    m = m.scatter_reduce(0, dst[:, None].expand(-1, H), e.detach(), "amax")
    w = torch.exp(e - m[dst])
    s = torch.zeros(nd, H, dtype=e.dtype, device=e.device).index_add(0, dst, w) + 1e-16
    p = w / s[dst] * keep
    v = value[src] + ops.get("edge_value", 0)
    return torch.zeros(nd, H, C, dtype=e.dtype, device=e.device).index_add(0, dst, p[..., None] * v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("edge_terms", [False, True])
@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_matches_materialised_reference(graph_name, kind, edge_terms, dropout, dtype):
    ei, (ns, nd) = GRAPHS[graph_name]
    gen = torch.Generator().manual_seed(hash((graph_name, kind, edge_terms)) % 2**31)
    value, ops = operands(kind, ns, nd, ei.size(1), edge_terms, dtype, gen)
    slope, scale = 0.2, C ** -0.5
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    leaves = {k: v.cuda().requires_grad_() for k, v in ops.items()}
    v_cuda = value.cuda().requires_grad_()
    out, weights = gnnio.ops.graph_attention(graph, kind, v_cuda, **leaves, negative_slope=slope,
                                             scale=scale, dropout=dropout, seed=1234,
                                             return_weights=True)
    # The mask the kernel drew, as the reference applies it (a dropped weight is exactly 0).
    keep = (weights != 0).to(torch.float64).cuda() / (1 - dropout) if dropout else 1.0
    if dropout and ei.size(1) > 10_000:
        dropped = 1 - (weights != 0).double().mean().item()
        # Binomial: E * H draws, sd = sqrt(p (1 - p) / (E H)) < 0.002 here; 5 sd.
        assert abs(dropped - dropout) < 5 * (dropout * (1 - dropout) / weights.numel()) ** 0.5
    gout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    results = {}
    for label, prec in (("theirs", dtype), ("exact", torch.float64)):
        ref_leaves = {k: v.detach().to(prec).requires_grad_() for k, v in leaves.items()}
        ref_v = v_cuda.detach().to(prec).requires_grad_()
        k = keep if isinstance(keep, float) else keep.to(prec)
        ref = reference(graph.edge_index.cuda(), ns, nd, kind, ref_v, ref_leaves, slope, scale, k)
        grads = torch.autograd.grad(ref, [ref_v] + list(ref_leaves.values()), gout.cuda().to(prec),
                                    allow_unused=True)
        results[label] = (ref, grads)
    ours_grads = torch.autograd.grad(out, [v_cuda] + list(leaves.values()), gout.cuda().to(dtype))
    assert_no_worse_than_reference(out, results["theirs"][0], results["exact"][0])
    for a, b, c in zip(ours_grads, results["theirs"][1], results["exact"][1]):
        if c is None:  # the reference never read this operand (no edges)
            assert a.abs().max().item() == 0 if a.numel() else True
            continue
        assert_no_worse_than_reference(a, b, c)


@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
def test_cuda_matches_cpu_and_masks_agree(kind):
    # The CPU kernel is the same algorithm in float64 accumulation: with float32 inputs the two
    # differ by float32 accumulation error only, and the dropout masks are the same bits.
    ei, (ns, nd) = GRAPHS["hub_in"]
    gen = torch.Generator().manual_seed(7)
    value, ops = operands(kind, ns, nd, ei.size(1), True, torch.float32, gen)
    cpu_out, cpu_w = gnnio.ops.graph_attention(gnnio.Graph(ei, size=(ns, nd)), kind, value, **ops,
                                               dropout=0.25, seed=99, return_weights=True)
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    out, w = gnnio.ops.graph_attention(g, kind, value.cuda(), **{k: v.cuda() for k, v in ops.items()},
                                       dropout=0.25, seed=99, return_weights=True)
    assert torch.equal((w != 0).cpu(), cpu_w != 0)
    scale = cpu_out.abs().max().item()
    # float32 accumulation over up to 2*10^5 terms: a few hundred ulp of the output scale.
    assert (out.cpu() - cpu_out).abs().max().item() <= 1e-4 * max(scale, 1.0)


def test_deterministic_bitwise():
    ei, (ns, nd) = GRAPHS["hub_in"]
    gen = torch.Generator().manual_seed(3)
    value, ops = operands("gatv2", ns, nd, ei.size(1), True, torch.float32, gen)
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    runs = []
    for _ in range(2):
        v = value.cuda().requires_grad_()
        leaves = {k: t.cuda().requires_grad_() for k, t in ops.items()}
        out = gnnio.ops.graph_attention(g, "gatv2", v, **leaves, dropout=0.1, seed=5)
        grads = torch.autograd.grad(out, [v] + list(leaves.values()), torch.ones_like(out))
        runs.append([out] + list(grads))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_float64_and_wide_heads_are_refused_clearly():
    g = gnnio.Graph(torch.tensor([[0], [1]]).cuda(), num_nodes=2)
    with pytest.raises(ValueError, match="float64"):
        gnnio.ops.graph_attention(g, "gat", torch.randn(2, 1, 4, device="cuda", dtype=torch.float64),
                                  src_score=torch.randn(2, 1, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="256 channels"):
        gnnio.ops.graph_attention(g, "gat", torch.randn(2, 1, 300, device="cuda"),
                                  src_score=torch.randn(2, 1, device="cuda"))
