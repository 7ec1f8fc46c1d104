"""gnnio::transformer_fused_forward on the CPU (what CI runs of TransformerConv's fused form):
the op against the direct form computed here in float64 (keys and values projected, PyG's
softmax), its registration (opcheck), and bad input; gnnio::transformer_fused_inference (out
written into residual, no stats) against it. The layer's fused form against PyG is in
test_transformer_forms.py; the CUDA kernel's tests in test_transformer_fused_cuda.py."""
import math
import zlib

import pytest
import torch

import gnnio
from graphs import adversarial, real

OP = torch.ops.gnnio.transformer_fused_forward
INFERENCE = torch.ops.gnnio.transformer_fused_inference


def operands(ns, nd, heads, channels, features, gen, dtype=torch.float64):
    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * s).to(dtype)
    return (r(ns, features), r(nd, heads, channels, s=0.5), r(heads * channels, features, s=0.3),
            r(features, heads * channels, s=0.3), r(heads * channels), r(nd, heads * channels))


def direct(graph, x, q, w_key, w_value_t, b_value, residual):
    """PyG's form in float64: k = W_k x, v = W_v x per source, softmax of q . k / sqrt(C)."""
    nd, H, C = q.shape
    src, dst = graph.edge_index.long()
    k = (x @ w_key.t()).view(-1, H, C)[src]
    v = (x @ w_value_t).view(-1, H, C)[src]
    e = (q[dst] * k).sum(-1) / math.sqrt(C)
    m = torch.full((nd, H), -math.inf, dtype=e.dtype).scatter_reduce(0, dst[:, None].expand_as(e), e, "amax")
    p = (e - m[dst]).exp()
    s = torch.zeros(nd, H, dtype=e.dtype).index_add_(0, dst, p) + 1e-16
    out = torch.zeros(nd, H, C, dtype=e.dtype).index_add_(0, dst, (p / s[dst])[..., None] * v)
    has = (torch.bincount(dst, minlength=nd) > 0).to(e.dtype)[:, None]
    return out.view(nd, -1) + has * b_value + residual


@pytest.mark.parametrize("heads,channels,features", [(4, 32, 128), (2, 5, 7), (3, 4, 33)])
@pytest.mark.parametrize("name,ei,n", [("cora",) + real("cora")] + adversarial(),
                         ids=lambda c: c if isinstance(c, str) else "")
def test_op_matches_direct_float64(name, ei, n, heads, channels, features):
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(hash((name, heads)) % 2**31)
    x, q, wk, wvt, bv, res = operands(n, n, heads, channels, features, gen)
    csr = graph.csr_by_dst
    out, stats = OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, channels ** -0.5)
    ref = direct(graph, x, q, wk, wvt, bv, res)
    # out [N_dst, H, C] (not a view of [N_dst, H C]: the layer's autograd node returns it as is)
    assert out.shape == (n, heads, channels) and not out._is_view()
    # float64 in two orders: ~1e-15 relative apart; 1e-10 still fails any slip of the algorithm
    torch.testing.assert_close(out.view(n, -1), ref, rtol=1e-10, atol=1e-10)
    deg = graph.in_degree()
    assert torch.equal(stats[deg == 0], torch.tensor([0.0, 1e-16], dtype=torch.float64).expand(
        int((deg == 0).sum()), heads, 2))


def test_key_bias_shifts_the_stats_max():
    """b_key leaves out alone and adds scale q_h . b_k,h to stats' max (the direct scores')."""
    gen = torch.Generator().manual_seed(5)
    ei = torch.randint(30, (2, 200), generator=gen)
    ei = ei[:, ei[1] != 3]  # an empty row gets the shift too
    graph = gnnio.Graph(ei, num_nodes=30)
    csr = graph.csr_by_dst
    x, q, wk, wvt, bv, res = operands(30, 30, 2, 3, 5, gen)
    b_key = torch.randn(6, generator=gen, dtype=torch.float64)
    out0, stats0 = OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.5)
    out1, stats1 = OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.5, b_key=b_key)
    assert torch.equal(out0, out1) and torch.equal(stats0[..., 1], stats1[..., 1])
    shift = 0.5 * (q * b_key.view(2, 3)).sum(-1)
    torch.testing.assert_close(stats1[..., 0], stats0[..., 0] + shift, rtol=1e-14, atol=1e-14)


def test_op_float32_no_worse_than_twice_the_direct_float32():
    from conftest import assert_no_worse_than_reference
    ei, n = real("cora")
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(3)
    ops64 = operands(n, n, 4, 32, 128, gen)
    csr = graph.csr_by_dst
    out32, _ = OP(csr.rowptr, csr.col, *[t.float() for t in ops64], 32 ** -0.5)
    ref32 = direct(graph, *[t.float() for t in ops64])
    ref64 = direct(graph, *ops64)
    assert_no_worse_than_reference(out32.view(n, -1), ref32, ref64,
                                   floor=8 * torch.finfo(torch.float32).eps * ref64.abs().max().item())


def test_opcheck_transformer_fused_forward():
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(12, (2, 50), generator=gen)
    graph = gnnio.Graph(ei, num_nodes=12)
    csr = graph.csr_by_dst
    x, q, wk, wvt, bv, res = operands(12, 12, 2, 3, 5, gen)
    torch.library.opcheck(OP.default, (csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.5))
    torch.library.opcheck(OP.default, (csr.rowptr, csr.col, x, q, wk, wvt, None, None, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name,ei,n", [("cora",) + real("cora")] + adversarial(),
                         ids=lambda c: c if isinstance(c, str) else "")
def test_inference_op_writes_the_forward_ops_out_into_residual(name, ei, n, bias, dtype):
    """The inference op leaves in residual the forward op's out, bit for bit (the same kernel,
    the store's residual + v read from and written to one place), rows without edges included."""
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(zlib.crc32(repr((name, bias, dtype)).encode()))
    x, q, wk, wvt, bv, res = operands(n, n, 2, 3, 5, gen, dtype)
    bv = bv if bias else None
    csr = graph.csr_by_dst
    out, _ = OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.5)
    into = res.clone()
    assert INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, into, 0.5) is None
    assert torch.equal(into, out.view(n, -1))


def test_inference_op_bipartite_and_int32():
    gen = torch.Generator().manual_seed(8)
    ns, nd = 40, 15
    ei = torch.stack([torch.randint(ns, (120,), generator=gen), torch.randint(nd, (120,), generator=gen)])
    graph = gnnio.Graph(ei.int(), size=(ns, nd))
    csr = graph.csr_by_dst
    assert csr.rowptr.dtype == torch.int32
    x, q, wk, wvt, bv, res = operands(ns, nd, 4, 2, 9, gen)
    out, _ = OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.7)
    INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.7)
    assert torch.equal(res, out.view(nd, -1))


def test_opcheck_transformer_fused_inference():
    gen = torch.Generator().manual_seed(1)
    ei = torch.randint(12, (2, 50), generator=gen)
    graph = gnnio.Graph(ei, num_nodes=12)
    csr = graph.csr_by_dst
    x, q, wk, wvt, bv, res = operands(12, 12, 2, 3, 5, gen)
    torch.library.opcheck(INFERENCE.default, (csr.rowptr, csr.col, x, q, wk, wvt, bv, res, 0.5))
    torch.library.opcheck(INFERENCE.default, (csr.rowptr, csr.col, x, q, wk, wvt, None, res, 0.5))


def test_inference_op_bad_residual():
    """residual is where out goes: a non-contiguous one (which the op would have to copy, and
    the copy would get out) is refused, as a wrong shape or dtype is, and one sharing memory
    with an operand (other threads read it while it is written)."""
    gen = torch.Generator().manual_seed(0)
    graph = gnnio.Graph(torch.randint(6, (2, 20), generator=gen), num_nodes=6)
    csr = graph.csr_by_dst
    x, q, wk, wvt, bv, res = operands(6, 6, 2, 3, 5, gen)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, torch.randn(6, 12, dtype=torch.float64)[:, ::2], 0.5)
    with pytest.raises(ValueError, match="residual must be"):
        INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, res[:3], 0.5)
    with pytest.raises(TypeError, match="every operand must be"):
        INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, res.float(), 0.5)
    x, q, wk, wvt, bv, res = operands(6, 6, 2, 3, 6, gen)  # F = H C: x could be the residual
    with pytest.raises(RuntimeError, match="single memory location"):
        INFERENCE(csr.rowptr, csr.col, x, q, wk, wvt, bv, x, 0.5)


def test_bad_input():
    gen = torch.Generator().manual_seed(0)
    graph = gnnio.Graph(torch.randint(6, (2, 20), generator=gen), num_nodes=6)
    csr = graph.csr_by_dst
    x, q, wk, wvt, bv, res = operands(6, 6, 2, 3, 5, gen)
    with pytest.raises(ValueError, match="w_key must be"):
        OP(csr.rowptr, csr.col, x, q, wk[:, :4], wvt, bv, res, 0.5)
    with pytest.raises(ValueError, match="w_value_t must be"):
        OP(csr.rowptr, csr.col, x, q, wk, wvt.t(), bv, res, 0.5)
    with pytest.raises(ValueError, match="query must be"):
        OP(csr.rowptr, csr.col, x, q.view(6, -1), wk, wvt, bv, res, 0.5)
    with pytest.raises(ValueError, match="rowptr must have"):
        OP(csr.rowptr[:-1], csr.col, x, q, wk, wvt, bv, res, 0.5)
    with pytest.raises(ValueError, match="residual must be"):
        OP(csr.rowptr, csr.col, x, q, wk, wvt, bv, res[:3], 0.5)
    with pytest.raises(TypeError, match="every operand must be"):
        OP(csr.rowptr, csr.col, x, q.float(), wk, wvt, bv, res, 0.5)
    with pytest.raises(TypeError, match="float32 and float64"):
        OP(csr.rowptr, csr.col, *[t.bfloat16() for t in (x, q, wk, wvt, bv, res)], 0.5)
