"""The WSB format built on CUDA and the tensor-core SpMM (forward and backward) against float64.

Tolerances come from the precision of the operands, relative to each output's mass (the sum
over its edges of |w| |x|, in float64); u is the unit roundoff of the operand type:
- float32 inputs run as tf32 (10 explicit mantissa bits, round to nearest, u = 2^-11): both
  operands of each product are rounded, |err| <= 2u mass plus float32 accumulation (< 2^-20).
- float16 (u = 2^-11) and bfloat16 (u = 2^-8) inputs are exact; what is rounded to them is the
  output (u), each tile entry when duplicates are summed into it (u), an edge weight when cast
  to the dtype (u) and, for mean, 1/deg and its product with the weight (2u), as on the CSR
  path: |err| <= (2 + weighted + 2 mean) u mass.
So ~1e-3 relative for tf32 and fp16, ~1e-2 for bf16. The edge-weight gradient is a float32
dot product per tile entry (not on tensor cores), rounded once to the dtype (u), times the
rounded 1/deg for mean (2u): |err| <= ((1 + 2 mean) u + F 2^-23) sum_f |dout| |x|.

Below the dtype's normal range a rounding is off by up to half the subnormal spacing
(`TINY`: 2^-25 for float16), not by u times the value. An edge weight from torch.rand falls
below float16's 2^-14 with probability 6e-5 (cora's 10,556 edges: 0.6 such edges per draw), and
w / deg more often, so each of a tile entry's roundings (the weight's cast, 1/deg and its
product for mean, the packing) adds TINY per edge to the bound, and the output's rounding one
more: + TINY (k sum_edges |x| + 1) with k = weighted + 2 mean + 1. Without it a float16 output
whose mass is one subnormal-weight edge fails by up to 1 / (3.5 u) (the CPU emulation of
these roundings, cora, weighted mean: 36 of 40 draws over the u-only bound, 0 of 200 over this).
"""
import pytest
import torch

import gnnio
from graphs import random_graph
from test_spmm import masses, reference
from test_wsb import CASES, IDS

pytestmark = pytest.mark.cuda

U = {torch.float32: 2.0**-11, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # tf32 for float32
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Half the subnormal spacing: the absolute error of a rounding below the normal range.
TINY = {torch.float32: 2.0**-137, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}  # tf32: 10 bits


def forward_rel(dtype, weighted=True, mean=False):
    """Bound on |out - exact| / mass for the forward (and the x gradient), per the docstring."""
    u = U[dtype]
    if dtype == torch.float32:
        return 2 * u + 2.0**-20
    return (2 + weighted + 2 * mean + 0.5) * u  # + u/2 for the products of roundings (u^2 terms)


def weight_grad_rel(dtype, width, mean):
    u = 2.0**-24 if dtype == torch.float32 else U[dtype]  # the tile gradient is not tf32
    return (1 + 2 * mean + 0.5) * u + width * 2.0**-23


def tiny_term(dtype, count_mass, weighted=True, mean=False):
    """The subnormal part of the bound: TINY per rounding of each edge's tile entry (k of them)
    times sum_edges |operand| (count_mass), plus one for the output's rounding."""
    return TINY[dtype] * ((weighted + 2 * mean + 1) * count_mass + 1)


def assert_within(out, ref, mass, rel, what, tiny=0.0):
    err = (out.detach().double().cpu() - ref.detach().double()).abs()
    bound = rel * mass + tiny + 1e-30
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: error reaches {worst:.2f}x the bound {rel:.2g} x mass"


@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_cuda_build_matches_cpu_build(name, ei, ns, nd):
    cpu, gpu = gnnio.Graph(ei, size=(ns, nd)), gnnio.Graph(ei.cuda(), size=(ns, nd))
    for transpose in (False, True):
        for a, b in zip(cpu.wsb(transpose), gpu.wsb(transpose)):
            assert a.dtype == b.dtype and torch.equal(a, b.cpu())
    assert cpu.wsb_stats() == gpu.wsb_stats()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce,weighted", [("sum", False), ("sum", True), ("mean", True)])
@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_cuda_forward_backward_against_float64(name, ei, ns, nd, reduce, weighted, dtype):
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    width = 33  # neither a multiple of 16 (partial fragment) nor of a 16-byte vector
    x = torch.randn(ns, width, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.rand(ei.size(1), device="cuda", requires_grad=True) if weighted else None
    out = gnnio.ops.spmm(g, x, w, reduce, backend="wsb")
    assert out.dtype == dtype and out.shape == (nd, width)
    gout = torch.randn_like(out)
    x64 = x.detach().cpu().double().requires_grad_()
    w64 = w.detach().cpu().double().requires_grad_() if weighted else None
    ref = reference(ei, ns, nd, x64, w64, reduce)
    mass_fwd, mass_bwd = masses(ei, ns, nd, x, gout, w, reduce)
    count_fwd, count_bwd = masses(ei, ns, nd, x, gout)
    mean = reduce == "mean"
    rel = forward_rel(dtype, weighted, mean)
    assert_within(out, ref, mass_fwd, rel, "forward", tiny_term(dtype, count_fwd, weighted, mean))
    out.backward(gout)
    ref.backward(gout.cpu().double())
    assert_within(x.grad, x64.grad, mass_bwd, rel, "grad x", tiny_term(dtype, count_bwd, weighted, mean))
    if weighted:
        src, dst = ei[0], ei[1]
        scale = 1.0 / torch.bincount(dst, minlength=nd).clamp(min=1).double()[dst] if reduce == "mean" else 1.0
        mass = (gout.cpu().double().abs()[dst] * x.detach().cpu().double().abs()[src]).sum(1) * scale
        assert_within(w.grad, w64.grad, mass, weight_grad_rel(dtype, width, mean),
                      "grad edge_weight", TINY[dtype] * (1 + 2 * mean))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1, 7, 16, 64, 128, 130, 256, 264])
def test_cuda_widths_against_float64(width, dtype):
    # 16-byte staging (widths a multiple of 4 / 8 elements), element staging (1, 7, 130 fp32),
    # one and several 128-feature chunks, and fragments cut by the width.
    ei, n = random_graph(300, 4000)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    x = torch.randn(n, width, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.rand(ei.size(1), device="cuda")
    out = gnnio.ops.spmm(g, x, w, backend="wsb")
    gout = torch.randn_like(out)
    out.backward(gout)
    x64 = x.detach().cpu().double().requires_grad_()
    ref = reference(ei, n, n, x64, w.cpu())
    ref.backward(gout.cpu().double())
    mass_fwd, mass_bwd = masses(ei, n, n, x, gout, w)
    count_fwd, count_bwd = masses(ei, n, n, x, gout)
    assert_within(out, ref, mass_fwd, forward_rel(dtype), "forward", tiny_term(dtype, count_fwd))
    assert_within(x.grad, x64.grad, mass_bwd, forward_rel(dtype), "grad x", tiny_term(dtype, count_bwd))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_blockdiag_matches_csr(dtype):
    ei = gnnio.datasets.blockdiag(20_000, 320_000, seed=1)
    g = gnnio.Graph(ei.cuda(), num_nodes=20_000)
    x = torch.randn(20_000, 128, device="cuda", dtype=dtype)
    w = torch.rand(ei.size(1), device="cuda")
    ref = reference(ei, 20_000, 20_000, x.cpu(), w.cpu())
    mass, _ = masses(ei, 20_000, 20_000, x, None, w)
    tiny = tiny_term(dtype, masses(ei, 20_000, 20_000, x, None)[0])
    assert_within(gnnio.ops.spmm(g, x, w, backend="wsb"), ref, mass, forward_rel(dtype), "wsb", tiny)
    assert_within(gnnio.ops.spmm(g, x, w, backend="csr"), ref, mass, forward_rel(dtype), "csr", tiny)


def test_cuda_int64_indices_unaligned_rows_and_determinism():
    ei, n = random_graph(200, 3000)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    f = g.wsb()
    values, _ = g.wsb_values(torch.float32, need_transpose=False)
    e = f.block_rowptr.new_empty(0)
    wide = torch.randn(n, 130, device="cuda")
    x = wide[:, 1:129]  # rows 520 bytes apart, base 4 bytes off 16: the element-staging kernel
    op = torch.ops.gnnio.wsb_spmm
    a = op(f.block_rowptr, f.block_col, values, x.contiguous(), n, n, e, e, None)
    # Same tiles and operands, so the same MMAs in the same order: bitwise equal.
    assert torch.equal(a, op(f.block_rowptr, f.block_col, values, x, n, n, e, e, None))
    assert torch.equal(a, op(f.block_rowptr.long(), f.block_col.long(), values, x.contiguous(), n, n,
                             e.long(), e.long(), None))
    assert torch.equal(a, gnnio.ops.spmm(g, x.contiguous(), backend="wsb"))  # repeatable


def test_cuda_empty_graphs():
    for ei, size in [(torch.empty(2, 0, dtype=torch.long), (5, 5)), (torch.empty(2, 0, dtype=torch.long), (0, 0)),
                     (torch.tensor([[0], [40]]), (3, 41))]:
        g = gnnio.Graph(ei.cuda(), size=size)
        x = torch.randn(size[0], 20, device="cuda", requires_grad=True)
        out = gnnio.ops.spmm(g, x, backend="wsb")
        expected = torch.zeros(size[1], 20, device="cuda")
        if ei.numel():
            expected[40] = x[0].detach()
        torch.testing.assert_close(out, expected, rtol=forward_rel(torch.float32), atol=0)
        out.sum().backward()
        assert x.grad.shape == x.shape


def test_cuda_float64_is_refused_with_a_clear_error():
    ei, n = random_graph(20, 60)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    with pytest.raises(ValueError, match="float64.*CSR backend"):
        gnnio.ops.spmm(g, torch.randn(n, 4, device="cuda", dtype=torch.float64), backend="wsb")
    with pytest.raises(IndexError, match="must lie in"):
        torch.ops.gnnio.wsb_from_coo(torch.tensor([0, 20], device="cuda"), torch.tensor([1, 2], device="cuda"), 20, 20)


def test_cuda_opcheck():
    ei, n = random_graph(37, 200)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    f, t = g.wsb(), g.wsb(transpose=True)
    values, values_t = g.wsb_values(torch.float32, edge_weight=torch.rand(200, device="cuda"))
    x = torch.randn(n, 16, device="cuda", requires_grad=True)
    torch.library.opcheck(torch.ops.gnnio.wsb_spmm.default,
                          (f.block_rowptr, f.block_col, values.detach().requires_grad_(), x, n, n,
                           t.block_rowptr, t.block_col, values_t.detach()))
    torch.library.opcheck(torch.ops.gnnio.wsb_sddmm.default,
                          (f.block_rowptr, f.block_col, torch.randn(n, 5, device="cuda"),
                           torch.randn(n, 5, device="cuda")))
