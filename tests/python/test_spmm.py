import pytest
import torch

import gnnio
from graphs import adversarial, hub, random_graph, real


def reference(ei, num_src, num_dst, x, w=None, reduce="sum"):
    """Plain float64 on the CPU: out[i] = reduce over edges (j -> i) of w * x[j], one edge at a
    time with index_add (differentiable, so it also gives the float64 gradients)."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    x = x.cpu().double()
    w = torch.ones(src.numel(), dtype=torch.float64) if w is None else w.cpu().double()
    if reduce == "mean":
        w = w / torch.bincount(dst, minlength=num_dst).clamp(min=1).double()[dst]
    out = torch.zeros(num_dst, x.size(1), dtype=torch.float64)
    return out.index_add(0, dst, w[:, None] * x[src])


EPS32 = torch.finfo(torch.float32).eps


def assert_within_summation_bound(out, ref, mass, terms):
    """Higham's bound for recursive float32 summation: |err| <= (n + 2) eps sum|terms| per
    element, with n the number of terms (the +2 covers rounding of the inputs and the output).
    `mass` is sum|terms| computed in float64; no tolerance is picked by hand."""
    err = (out.detach().double().cpu() - ref.detach()).abs()
    bound = (terms.double() + 2) * EPS32 * mass + 1e-30
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error reaches {worst:.2f}x the float32 summation bound"


def masses(ei, num_src, num_dst, x, gout, w=None, reduce="sum"):
    """sum|terms| of the forward (per output row) and of dx = Aᵀ dout (per input row)."""
    fwd = reference(ei, num_src, num_dst, x.detach().abs(), None if w is None else w.detach().abs(), reduce)
    bwd = None
    if gout is not None:
        src, dst = ei[0].cpu(), ei[1].cpu()
        a = torch.ones(src.numel(), dtype=torch.float64) if w is None else w.detach().cpu().double().abs()
        if reduce == "mean":
            a = a / torch.bincount(dst, minlength=num_dst).clamp(min=1).double()[dst]
        bwd = torch.zeros(num_src, gout.size(1), dtype=torch.float64).index_add(
            0, src, a[:, None] * gout.cpu().double().abs()[dst])
    return fwd, bwd


def cases():
    out = [("cora",) + real("cora"), ("as20000102",) + real("as20000102")]
    out += adversarial()
    return out


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_forward_backward_against_float64(device, name, ei, n, reduce, weighted):
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 7, device=device, requires_grad=True)
    w = torch.rand(ei.size(1), device=device, requires_grad=True) if weighted else None
    out = gnnio.ops.spmm(g, x, w, reduce)
    ref = reference(ei, n, n, x.detach(), None if w is None else w.detach(), reduce)
    in_deg = torch.bincount(ei[1], minlength=n)[:, None]
    out_deg = torch.bincount(ei[0], minlength=n)[:, None]
    xa = x.detach().cpu().double().abs()
    gout = torch.randn_like(out)
    mass_fwd, mass_bwd = masses(ei, n, n, x, gout, w, reduce)
    assert_within_summation_bound(out, ref, mass_fwd, in_deg)
    out.backward(gout)
    x64 = x.detach().cpu().double().requires_grad_()
    w64 = w.detach().cpu().double().requires_grad_() if weighted else None
    reference(ei, n, n, x64, w64, reduce).backward(gout.cpu().double())
    ga = gout.cpu().double().abs()
    assert_within_summation_bound(x.grad, x64.grad, mass_bwd, out_deg)
    if weighted:
        scale = 1.0 / torch.bincount(ei[1], minlength=n).clamp(min=1).double() if reduce == "mean" else 1.0
        mass = (ga[ei[1]] * xa[ei[0]]).sum(1) * (scale[ei[1]] if reduce == "mean" else 1.0)
        assert_within_summation_bound(w.grad, w64.grad, mass, torch.full((ei.size(1),), x.size(1)))


def test_bipartite_both_ways(device):
    for ns, nd in [(13, 40), (40, 13)]:
        ei = torch.stack([torch.randint(ns, (200,)), torch.randint(nd, (200,))])
        g = gnnio.Graph(ei.to(device), size=(ns, nd))
        x = torch.randn(ns, 5, device=device, requires_grad=True)
        out = gnnio.ops.spmm(g, x, reduce="mean")
        assert out.shape == (nd, 5)
        torch.testing.assert_close(out.double().cpu(), reference(ei, ns, nd, x.detach(), reduce="mean"),
                                   rtol=1e-5, atol=1e-5)
        out.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gradcheck_float64(reduce):
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(40, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: gnnio.ops.spmm(g, x, w, reduce), (x, w))


def test_opcheck():
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    x = torch.randn(n, 4, requires_grad=True)
    value = torch.rand(30, requires_grad=True)
    value_t = value.detach()[t.perm.long()]
    torch.library.opcheck(torch.ops.gnnio.spmm.default,
                          (f.rowptr, f.col, value, x, n, n, -1, t.rowptr, t.col, value_t, -1))
    torch.library.opcheck(torch.ops.gnnio.sddmm.default, (f.rowptr, f.col, torch.randn(n, 4), torch.randn(n, 4)))


@pytest.mark.slow
def test_hub_of_100k_neighbours(device):
    ei, n = hub(100_000)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 16, device=device)
    out = gnnio.ops.spmm(g, x, reduce="sum")
    mass, _ = masses(ei, n, n, x, None)
    assert_within_summation_bound(out, reference(ei, n, n, x), mass, torch.bincount(ei[1], minlength=n)[:, None])


def test_non_contiguous_features(device):
    ei, n = random_graph(20, 80)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(8, n, device=device).t()  # feature stride != 1
    torch.testing.assert_close(gnnio.ops.spmm(g, x), gnnio.ops.spmm(g, x.contiguous()))


def test_bad_inputs(device):
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    with pytest.raises(ValueError, match="rows"):
        gnnio.ops.spmm(g, torch.randn(n + 1, 4, device=device))
    with pytest.raises(ValueError, match="2-D"):
        gnnio.ops.spmm(g, torch.randn(n, device=device))
    with pytest.raises(TypeError, match="floating point"):
        gnnio.ops.spmm(g, torch.ones(n, 4, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="edge_weight"):
        gnnio.ops.spmm(g, torch.randn(n, 4, device=device), torch.rand(29, device=device))
    with pytest.raises(ValueError, match="reduce"):
        gnnio.ops.spmm(g, torch.randn(n, 4, device=device), reduce="max")
    if device.type == "cuda":
        with pytest.raises(ValueError, match="graph is on"):
            gnnio.ops.spmm(g, torch.randn(n, 4))


def test_raw_op_rejects_wrong_sizes():
    ei, n = random_graph(10, 30)
    f = gnnio.Graph(ei, num_nodes=n).csr_by_dst
    e = f.rowptr.new_empty(0)
    with pytest.raises(ValueError, match="source nodes"):
        torch.ops.gnnio.spmm(f.rowptr, f.col, None, torch.randn(n + 2, 3), n, n, -1, e, e, None, -1)
    with pytest.raises(ValueError, match="num_rows"):
        torch.ops.gnnio.spmm(f.rowptr, f.col, None, torch.randn(n, 3), n + 1, n, -1, e, e, None, -1)
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.gnnio.spmm(f.rowptr, f.col, torch.rand(30, dtype=torch.float64), torch.randn(n, 3),
                             n, n, -1, e, e, None, -1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_cuda_dtypes_and_plan_cache(dtype, tol):
    ei, n = random_graph(3000, 40_000)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    x = torch.randn(n, 33, device="cuda", dtype=dtype)
    ref = reference(ei, n, n, x.float(), reduce="mean")
    for _ in range(2):  # second call reuses the cached cuSPARSE plan
        out = gnnio.ops.spmm(g, x, reduce="mean")
        # float32 accumulation of `dtype` inputs: the error is the rounding of the output and of
        # the 1/deg weights to `dtype` (unit roundoff 2^-11 fp16, 2^-8 bf16), relative to the
        # row's mass (the mean of |x| over <= ~40 neighbours, O(1)).
        torch.testing.assert_close(out.double().cpu(), ref, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_hub_accuracy_and_deterministic_mode(deterministic):
    ei, n = hub(200_000)
    x = torch.randn(n, 64, requires_grad=True)
    w = torch.rand(ei.size(1))
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    xc = x.detach().cuda().requires_grad_()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        a = gnnio.ops.spmm(g, xc, w.cuda())
        b = gnnio.ops.spmm(g, xc, w.cuda())
        gout = torch.randn_like(a)
        ga = torch.autograd.grad(a, xc, gout)[0]
        gb = torch.autograd.grad(b, xc, gout)[0]
    finally:
        torch.use_deterministic_algorithms(previous)
    if deterministic:  # cuSPARSE splits the hub row across blocks; the row-warp kernel does not
        assert torch.equal(a, b) and torch.equal(ga, gb)
    mass, _ = masses(ei, n, n, x, None, w)
    assert_within_summation_bound(a, reference(ei, n, n, x.detach(), w), mass,
                                  torch.bincount(ei[1], minlength=n)[:, None])


@pytest.mark.cuda
def test_cuda_million_neighbour_hub_with_gradients():
    ei, n = hub(1_000_000)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    x = torch.randn(n, 32, device="cuda", requires_grad=True)
    out = gnnio.ops.spmm(g, x, reduce="mean")
    mass, _ = masses(ei, n, n, x, None, reduce="mean")
    deg = torch.bincount(ei[1], minlength=n)[:, None]
    assert_within_summation_bound(out, reference(ei, n, n, x.detach(), reduce="mean"), mass, deg)
    out.sum().backward()
    expected = torch.bincount(ei[0], weights=1.0 / torch.bincount(ei[1], minlength=n).clamp(min=1)[ei[1]].double(),
                              minlength=n)
    torch.testing.assert_close(x.grad[:, 0].double().cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("width", [1, 3, 33])
def test_cuda_row_warp_kernel_shapes(width):
    # 900 edges in an 11 x 70 bipartite graph: more slots than matrix entries, which cuSPARSE
    # rejects, so gnnio's row-warp kernel runs (width 1 always goes there too).
    ns, nd = 70, 11
    ei = torch.stack([torch.randint(ns, (900,)), torch.randint(nd, (900,))])
    g = gnnio.Graph(ei.cuda(), size=(ns, nd))
    x = torch.randn(ns, width, device="cuda", requires_grad=True)
    w = torch.rand(900, device="cuda", requires_grad=True)
    out = gnnio.ops.spmm(g, x, w)
    assert torch.equal(out, gnnio.ops.spmm(g, x, w))
    gout = torch.randn_like(out)
    mass_fwd, mass_bwd = masses(ei, ns, nd, x, gout, w)
    assert_within_summation_bound(out, reference(ei, ns, nd, x.detach(), w.detach()), mass_fwd,
                                  torch.bincount(ei[1], minlength=nd)[:, None])
    out.backward(gout)
    x64 = x.detach().cpu().double().requires_grad_()
    reference(ei, ns, nd, x64, w.detach()).backward(gout.cpu().double())
    assert_within_summation_bound(x.grad, x64.grad, mass_bwd, torch.bincount(ei[0], minlength=ns)[:, None])
