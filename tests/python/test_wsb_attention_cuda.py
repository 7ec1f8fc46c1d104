"""GAT attention on WSB tiles, CUDA (tensor cores: float32 as tf32, float16, bfloat16): forward
and every gradient against float64 with the bounds of wsb_attention_checks.py, on the awkward
shapes, every channel count a fragment can cut, more heads than a CTA's warps, a 10^5-neighbour
hub, the block-diagonal graph; determinism and both index types; empty graphs; refusals."""
import pytest
import torch

import gnnio
from gnnio._ops import HAS_CUDA_KERNELS
from graphs import hub
from test_wsb import CASES, IDS
from wsb_attention_checks import check_op, wsb_op

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_CUDA_KERNELS),
                                reason="needs CUDA and gnnio's CUDA kernels")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dst", [True, False], ids=["dst_score", "no_dst_score"])
@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_cuda_against_float64(name, ei, ns, nd, dst, dtype):
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    check_op(wsb_op(g), ei, ns, nd, 3, 20, dtype, "cuda", dst=dst)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_cuda_wide_build_against_float64(name, ei, ns, nd, dtype):
    # 40 channels a head: the wide build (policy.h kNarrowChannels) on the same awkward shapes
    # (empty block rows, partial tiles, bipartite), with 16-bit rows staged as vectors that end
    # in zero-filled channels (40 = 5 vectors of 8).
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    check_op(wsb_op(g), ei, ns, nd, 2, 40, dtype, "cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels", [32, 40])
def test_cuda_misaligned_value_rows(channels, dtype):
    # value one element off 16-byte alignment: its rows are staged element by element while dout's
    # go through cp.async (the two paths in one call), in both builds.
    ei = torch.randint(0, 300, (2, 6000))
    g = gnnio.Graph(ei.cuda(), num_nodes=300)
    op = wsb_op(g)

    def misaligned(value, src_score, dst_score):
        shifted = torch.cat([value.new_zeros(1), value.flatten()])[1:].view_as(value)
        assert shifted.data_ptr() % 16 != 0
        return op(shifted, src_score, dst_score)

    check_op(misaligned, ei, 300, 300, 2, channels, dtype, "cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,channels", [(1, 1), (4, 16), (5, 7), (3, 24), (9, 32), (3, 33),
                                             (2, 40), (2, 100), (2, 128)])
def test_cuda_heads_and_channels(heads, channels, dtype):
    # Channels a fragment cuts (1, 7, 24, 33, 40, 100; 24 and 40 are whole 16-bit vectors, staged
    # by cp.async with zero-filled channels), whole fragments (16, 32, 128: the most a head may
    # have), and more heads than the forward's 4 and the backward's 2 warps (5, 9). The narrow
    # build (policy.h kNarrowChannels) runs up to 32 channels, the wide one from 33.
    ei = torch.randint(0, 300, (2, 6000))
    g = gnnio.Graph(ei.cuda(), num_nodes=300)
    check_op(wsb_op(g, 0.3), ei, 300, 300, heads, channels, dtype, "cuda", slope=0.3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_hub_of_100k_neighbours(dtype):
    ei, n = hub(100_000)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    check_op(wsb_op(g), ei, n, n, 2, 32, dtype, "cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_blockdiag(dtype):
    ei = gnnio.datasets.blockdiag(20_000, 320_000, seed=1)
    g = gnnio.Graph(ei.cuda(), num_nodes=20_000)
    check_op(wsb_op(g), ei, 20_000, 20_000, 4, 32, dtype, "cuda")


@pytest.mark.parametrize("index", [torch.int32, torch.int64], ids=str)
def test_cuda_deterministic_and_index_types(index):
    ei = torch.randint(0, 500, (2, 20000))
    outs = []
    for idx in (index, index):
        g = gnnio.Graph(ei.to(idx).cuda(), num_nodes=500)
        v = torch.randn(500, 4, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        s, d = v[:, :, 0].clone(), v[:, :, 1].clone()
        leaves = [t.requires_grad_() for t in (v, s, d)]
        out = wsb_op(g)(*leaves)
        outs.append((out, *torch.autograd.grad(out, leaves, torch.ones_like(out))))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_cuda_empty_graphs():
    for ns, nd in ((0, 0), (5, 0), (0, 7), (9, 9)):
        g = gnnio.Graph(torch.empty(2, 0, dtype=torch.long, device="cuda"), size=(ns, nd))
        v = torch.randn(ns, 2, 8, device="cuda", requires_grad=True)
        s = torch.randn(ns, 2, device="cuda", requires_grad=True)
        out = wsb_op(g)(v, s, None)
        assert out.shape == (nd, 2, 8) and not out.any()
        out.sum().backward()
        assert v.grad is not None and not v.grad.any() and not s.grad.any()


def test_cuda_refusals():
    g = gnnio.Graph(torch.randint(0, 20, (2, 100), device="cuda"), num_nodes=20)
    v, s = torch.randn(20, 2, 4, device="cuda", dtype=torch.float64), torch.randn(20, 2, device="cuda", dtype=torch.float64)
    with pytest.raises(ValueError, match="float64 on CUDA"):
        gnnio.ops.graph_attention(g, "gat", v, src_score=s, backend="wsb")
    w = g.wsb()
    with pytest.raises(ValueError, match="float64"):  # the kernel's own refusal, below the Python check
        torch.ops.gnnio.wsb_gat_attention(w.block_rowptr, w.block_col, g.wsb_counts(), s, None, v, 20, 20, 0.2, False)
    wide = torch.randn(20, 1, 129, device="cuda")
    with pytest.raises(ValueError, match="129"):
        torch.ops.gnnio.wsb_gat_attention(w.block_rowptr, w.block_col, g.wsb_counts(),
                                          torch.randn(20, 1, device="cuda"), None, wide, 20, 20, 0.2, False)


def test_cuda_16bit_keeps_out_acc_only_for_training():
    g = gnnio.Graph(torch.randint(0, 50, (2, 400), device="cuda"), num_nodes=50)
    w = g.wsb()
    v = torch.randn(50, 2, 16, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(50, 2, device="cuda", dtype=torch.bfloat16)
    for save in (False, True):
        out, stats, out_acc = torch.ops.gnnio.wsb_gat_attention(
            w.block_rowptr, w.block_col, g.wsb_counts(), s, None, v, 50, 50, 0.2, save)
        assert stats.dtype == torch.float32
        assert out_acc.numel() == (out.numel() if save else 0)
        if save:
            assert torch.equal(out_acc.to(torch.bfloat16), out)


def test_cuda_opcheck():
    g = gnnio.Graph(torch.randint(0, 40, (2, 300), device="cuda"), num_nodes=40)
    w, wt = g.wsb(), g.wsb(True)
    v, s, d = (torch.randn(40, 2, 8, device="cuda"), torch.randn(40, 2, device="cuda"),
               torch.randn(40, 2, device="cuda"))
    args = (w.block_rowptr, w.block_col, g.wsb_counts(), s, d, v, 40, 40, 0.2, True)
    torch.library.opcheck(torch.ops.gnnio.wsb_gat_attention, args)
    out, stats, _ = torch.ops.gnnio.wsb_gat_attention(*args)
    torch.library.opcheck(torch.ops.gnnio.wsb_gat_attention_backward,
                          (w.block_rowptr, w.block_col, g.wsb_counts(), wt.block_rowptr, wt.block_col,
                           g.wsb_counts(True), s, d, v, out, stats, torch.randn_like(out), 0.2, [1, 1, 1]))


def _op_with_stats(g, v, s):
    w = g.wsb()
    return torch.ops.gnnio.wsb_gat_attention(w.block_rowptr, w.block_col, g.wsb_counts(), s, None, v,
                                             g.num_src, g.num_dst, 0.2, False)


def test_cuda_minus_inf_rows_in_either_half_of_a_tile_match_the_cpu():
    # A lane pair shares a tile row: one lane holds columns 0..7, the other 8..15. Row 1's edges
    # all come from columns 8..15 with -inf scores (only the odd lane sees them), row 3's from
    # columns 0..7; row 2 has a finite edge, row 4 none. out and stats (NaN sums for rows 1
    # and 3, as on the CPU and in PyG) and the backward's NaN / 0 pattern are the CPU's.
    ei = torch.tensor([[9, 12, 2, 0, 5], [1, 1, 2, 3, 3]])
    v = torch.randn(16, 1, 3)
    s = torch.zeros(16, 1)
    s[[9, 12, 0, 5]] = -float("inf")
    runs = []
    for dev in ("cpu", "cuda"):
        g = gnnio.Graph(ei.to(dev), num_nodes=16)
        out, stats, _ = _op_with_stats(g, v.to(dev), s.to(dev))
        vg, sg = v.to(dev).clone().requires_grad_(), s.to(dev).clone().requires_grad_()
        grads = torch.autograd.grad(wsb_op(g)(vg, sg, None).sum(), (vg, sg))
        runs.append([t.cpu() for t in (out, stats, *grads)])
    (out_c, stats_c, *grads_c), (out_g, stats_g, *grads_g) = runs
    assert torch.isnan(stats_c[[1, 3], 0, 1]).all() and torch.isnan(stats_g[[1, 3], 0, 1]).all()
    assert torch.equal(stats_g[:, :, 0], stats_c[:, :, 0])
    assert torch.equal(stats_g.isnan(), stats_c.isnan())
    assert torch.isnan(out_g[[1, 3]]).all() and not out_g[[0, 4]].any()
    for a, b in zip(grads_g, grads_c):
        assert torch.equal(a.isnan(), b.isnan())


def test_cuda_rows_whose_scores_are_all_minus_inf_are_nan_as_in_pyg():
    ei = torch.tensor([[0, 1, 2], [1, 1, 2]], device="cuda")
    g = gnnio.Graph(ei, num_nodes=4)
    v = torch.randn(4, 1, 3, device="cuda")
    s = torch.tensor([[-float("inf")], [-float("inf")], [0.5], [0.0]], device="cuda")
    out = wsb_op(g)(v, s, None)
    assert torch.isnan(out[1]).all()
    assert not out[[0, 3]].any() and torch.allclose(out[2], v[2], rtol=2.0**-10)
