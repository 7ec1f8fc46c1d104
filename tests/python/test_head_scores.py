"""gnnio.ops.head_scores (GAT's fused per-node scores) against float64 sums of the same
operands, forward and backward, on CPU and (marked cuda) on the GPU in every dtype; gradcheck;
bad input; bitwise repeatability of d att (summed per chunk of rows, then over chunks in order).

Tolerances are the standard error bound of a sum of k products in the accumulator's precision,
k * u * sum |terms| (u = 2^-24 for float32, 2^-53 for float64), plus one rounding of the result
to the output dtype: k = C for a score, A for d x, and chunk length + number of chunks for d att
(a chunk's rows are summed in order; the chunks by one reduction, bounded here by a sequential
sum), and half a subnormal spacing where a result underflows the output dtype."""
import math

import pytest
import torch

from gnnio.ops import head_scores

CHUNK = 64
UNIT = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}
SHAPES = [(1, 1, 1, 1), (130, 2, 4, 32), (64, 1, 3, 7), (200, 2, 8, 8), (65, 4, 2, 5),
          (0, 2, 4, 8), (70, 2, 4, 0), (1000, 2, 1, 64), (129, 1, 2, 40)]


def operands(n, a, h, c, dtype, device, gen):
    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
    return rand(n, h, c), rand(a, h, c), rand(a, n, h)


def exact(x, att, g):
    """float64 forward and gradients of the same (rounded) operands, and the sums of |terms|."""
    x, att, g = x.double(), att.double(), g.double()
    score = torch.einsum("nhc,ahc->anh", x, att)
    score_mag = torch.einsum("nhc,ahc->anh", x.abs(), att.abs())
    gx = torch.einsum("anh,ahc->nhc", g, att)
    gx_mag = torch.einsum("anh,ahc->nhc", g.abs(), att.abs())
    gatt = torch.einsum("anh,nhc->ahc", g, x)
    gatt_mag = torch.einsum("anh,nhc->ahc", g.abs(), x.abs())
    return (score, score_mag), (gx, gx_mag), (gatt, gatt_mag)


def check(ours, ref, terms, unit, out_dtype):
    value, mag = ref
    info = torch.finfo(out_dtype)
    out_unit = info.eps / 2
    # Rounding into the output dtype: relative out_unit for normal numbers, and at most half the
    # subnormal spacing (tiny * eps / 2) below the smallest normal (fp16: 2^-25, reached by
    # products of a few 1e-3 values).
    bound = terms * unit * mag + out_unit * value.abs() + info.tiny * out_unit + 1e-300
    err = (ours.double() - value).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.3g}x its bound"


def run(x, att, g):
    x = x.clone().requires_grad_()
    att = att.clone().requires_grad_()
    score = head_scores(x, att)
    score.backward(g.to(score.dtype))
    return score, x.grad, att.grad


def our_terms(x, att):
    """The module docstring's k for (score, d x, d att), each with one rounding to the output."""
    return x.size(2) + 1, att.size(0) + 1, CHUNK + math.ceil(x.size(0) / CHUNK) + 1


def check_all(x, att, g, unit):
    score, gx, gatt = run(x, att, g)
    (s_ref, gx_ref, gatt_ref) = exact(x, att, g.to(torch.result_type(x, att)))
    k_score, k_x, k_att = our_terms(x, att)
    check(score, s_ref, k_score, unit, score.dtype)
    check(gx, gx_ref, k_x, unit, x.dtype)
    check(gatt, gatt_ref, k_att, unit, att.dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{s[0]}-A{s[1]}-H{s[2]}-C{s[3]}" for s in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_matches_float64(shape, dtype):
    gen = torch.Generator().manual_seed(torch.seed())
    check_all(*operands(*shape, dtype, "cpu", gen), UNIT[dtype])


def test_matches_pyg_expression():
    """What GATConv computed before: (h * att).sum(-1) per vector, forward and gradients.

    Both sides round: the expression's sums (C terms for a score, A for d x, N for d att, in
    torch's order) and ours (the module docstring's k). So each pair may differ by the sum of the
    two error bounds of the same float64 value (2 u |value| covers our rounding to the output,
    with a u to spare); a fixed rtol is wrong for d att, a sum of 500 products whose terms cancel."""
    seed = torch.seed()
    gen = torch.Generator().manual_seed(seed)
    n, a, h, c = 500, 2, 4, 16
    x, att, g = operands(n, a, h, c, torch.float32, "cpu", gen)
    score, gx, gatt = run(x, att, g)
    xr, ar = x.clone().requires_grad_(), att.clone().requires_grad_()
    ref = torch.stack([(xr * ar[i]).sum(-1) for i in range(a)])
    ref.backward(g)
    u = UNIT[torch.float32]
    theirs_terms = (c, a, n)
    pairs = zip((score, gx, gatt), (ref, xr.grad, ar.grad), exact(x, att, g), our_terms(x, att),
                theirs_terms)
    for ours, theirs, (value, mag), k_ours, k_theirs in pairs:
        bound = (k_ours + k_theirs) * u * mag + 2 * u * value.abs() + 1e-300
        worst = ((ours.double() - theirs.double()).abs() / bound).max().item()
        assert worst <= 1.0, f"error {worst:.3g}x the two bounds (seed {seed})"


def test_gradcheck():
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, _ = operands(70, 2, 3, 5, torch.float64, "cpu", gen)
    assert torch.autograd.gradcheck(head_scores, (x.requires_grad_(), att.requires_grad_()))


def test_grad_of_one_input_only():
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(100, 2, 4, 8, torch.float64, "cpu", gen)
    _, (gx_ref, _), (gatt_ref, _) = exact(x, att, g)
    xg = x.clone().requires_grad_()
    head_scores(xg, att).backward(g)
    torch.testing.assert_close(xg.grad, gx_ref)
    ag = att.clone().requires_grad_()
    head_scores(x, ag).backward(g)
    torch.testing.assert_close(ag.grad, gatt_ref)


def test_dtype_follows_pyg_promotion():
    x = torch.randn(10, 2, 4, dtype=torch.float64)
    assert head_scores(x, torch.randn(1, 2, 4)).dtype == torch.float64
    assert head_scores(x.float(), torch.randn(1, 2, 4, dtype=torch.float64)).dtype == torch.float64


def test_att_grad_bitwise_repeatable():
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(5000, 2, 4, 32, torch.float32, "cpu", gen)
    first, second = run(x, att, g), run(x, att, g)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("x_shape,att_shape", [((10, 4), (1, 4)), ((10, 2, 4), (2, 4)),
                                               ((10, 2, 4), (5, 2, 4)), ((10, 2, 4), (1, 2, 3)),
                                               ((10, 2, 4), (1, 3, 4))])
def test_refuses_bad_shapes(x_shape, att_shape):
    with pytest.raises(ValueError, match="head_scores"):
        head_scores(torch.randn(x_shape), torch.randn(att_shape))


def test_refuses_integer_x_and_complex_att():
    with pytest.raises(ValueError, match="floating-point"):
        head_scores(torch.ones(3, 2, 4, dtype=torch.long), torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match="floating-point"):
        head_scores(torch.randn(3, 2, 4), torch.randn(1, 2, 4, dtype=torch.complex64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_half_types_follow_the_cuda_precision_model(dtype):
    """16-bit x on the CPU: float32 sums of the exact products, each result rounded once (to the
    promoted dtype for the scores, to x's dtype for d x), as the CUDA kernel does."""
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(300, 2, 4, 32, dtype, "cpu", gen)
    score, gx, gatt = run(x, att, g)
    assert score.dtype == dtype and gx.dtype == dtype and gatt.dtype == dtype
    ref_score, ref_gx, ref_gatt = run(x.float(), att.float(), g.float())
    assert torch.equal(score, ref_score.to(dtype))
    assert torch.equal(gx, ref_gx.to(dtype))
    assert torch.equal(gatt, ref_gatt.to(dtype))


def test_opcheck():
    x = torch.randn(70, 2, 8, requires_grad=True)
    att = torch.randn(2, 2, 8, requires_grad=True)
    torch.library.opcheck(torch.ops.gnnio.head_scores.default, (x, att))


def _backward_into_case(shape, dtype, device, gen):
    x, att, g = operands(*shape, dtype, "cpu", gen)
    if dtype != torch.float64:  # att and the score gradient in float32, as a layer's are
        att, g = att.float(), g.float()
    other = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dtype)
    return x.to(device), att.to(device), g.to(device), other.to(device)


def check_backward_into(x, att, g, other):
    # grad_x_into: d x added into another gradient of x, fl(other + fl(d x)), as autograd's sum
    # of the two would be: the same bits, no buffer for d x, and d att unchanged.
    op = torch.ops.gnnio.head_scores_backward
    gx, gatt = op(x, att, g, True, True)
    into = other.clone()
    version = into._version
    empty, gatt_into = op(x, att, g, True, True, grad_x_into=into)
    assert empty.numel() == 0 and into._version > version  # an in-place write, as autograd sees it
    assert torch.equal(into, other + gx)
    assert torch.equal(gatt_into, gatt)
    with pytest.raises(ValueError, match="grad_x_into"):
        op(x, att, g, False, True, grad_x_into=other.clone())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_into_is_the_sum(dtype):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    check_backward_into(*_backward_into_case((300, 2, 4, 8), dtype, "cpu", gen))


def test_opcheck_backward_into():
    x, att, g = torch.randn(70, 2, 8), torch.randn(2, 2, 8), torch.randn(2, 70, 2)
    torch.library.opcheck(torch.ops.gnnio.head_scores_backward.default, (x, att, g, True, True),
                          {"grad_x_into": torch.randn(70, 2, 8)})


# --- CUDA --------------------------------------------------------------------------------------

CUDA_SHAPES = SHAPES + [(300_000, 2, 4, 32), (100_003, 1, 8, 3), (4097, 2, 2, 200)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=[f"N{s[0]}-A{s[1]}-H{s[2]}-C{s[3]}" for s in CUDA_SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cuda_matches_float64(shape, dtype):
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(*shape, dtype, "cpu", gen)
    # att and the score gradient stay in float32 (as a layer's parameters and the scores are);
    # x in the dtype under test: the float64 reference uses the same rounded values.
    att, g = att.float(), g.float()
    unit = UNIT[torch.float64 if dtype == torch.float64 else torch.float32]
    if dtype == torch.float64:
        att, g = att.double(), g.double()
    check_all(x.cuda(), att.cuda(), g.cuda(), unit)


@pytest.mark.cuda
def test_cuda_many_rounds_per_group():
    """More (row, head) segments than the grid's groups: each group loops (2^23 + 1 segments)."""
    gen = torch.Generator(device="cuda").manual_seed(torch.seed())
    x = torch.randn(2 ** 23 + 1, 1, 32, device="cuda", generator=gen)
    att = torch.randn(2, 1, 32, device="cuda", generator=gen)
    g = torch.randn(2, x.size(0), 1, device="cuda", generator=gen)
    check_all(x, att, g, UNIT[torch.float32])


@pytest.mark.cuda
def test_cuda_bitwise_repeatable_and_close_to_cpu():
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(100_000, 2, 4, 32, torch.float32, "cpu", gen)
    first = run(x.cuda(), att.cuda(), g.cuda())
    second = run(x.cuda(), att.cuda(), g.cuda())
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    for a, b in zip(first, run(x, att, g)):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(300_000, 2, 4, 32), (1000, 4, 2, 16), (4097, 2, 2, 200)],
                         ids=["N300000-A2-H4-C32", "N1000-A4-H2-C16", "N4097-A2-H2-C200"])
def test_cuda_backward_paths_agree_bitwise(shape, dtype):
    """The backward's 16-byte kernel (x 16-byte aligned, channels a multiple of 16 bytes) and its
    column kernel (the same x one element off alignment) add each column's terms in the same
    order (rows of a chunk in order, vectors in order), so d x and d att are the same bits."""
    gen = torch.Generator().manual_seed(torch.seed())
    x, att, g = operands(*shape, dtype, "cpu", gen)
    if dtype != torch.float64:  # att and the score gradient in float32, as a layer's are
        att, g = att.float(), g.float()
    x, att, g = x.cuda(), att.cuda(), g.cuda()
    storage = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")
    x_off = storage[1:].view_as(x).copy_(x)
    assert x.data_ptr() % 16 == 0 and x_off.data_ptr() % 16 != 0
    grads = []
    for xs in (x, x_off):
        leaf, att_leaf = xs.detach().requires_grad_(), att.clone().requires_grad_()
        score = head_scores(leaf, att_leaf)
        grads.append(torch.autograd.grad(score, (leaf, att_leaf), g.to(score.dtype)))
    for vec, column in zip(*grads):
        assert torch.equal(vec, column)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(300_000, 2, 4, 32), (1000, 2, 3, 5)], ids=["vec", "columns"])
def test_cuda_backward_into_is_the_sum(shape, dtype):
    # Both backward kernels: 16-byte pieces (4 x 32) and the column kernel (5 channels).
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    check_backward_into(*_backward_into_case(shape, dtype, "cuda", gen))
