"""GAT attention on WSB tiles against float64, with error bounds derived from the roundings the
kernels make (shared by test_wsb_attention.py and test_wsb_attention_cuda.py).

Per destination i, head h, with n_i edges, P the exact softmax weights and u = 2^-24 the float32
unit roundoff of the scores, softmax and accumulation (2^-53 for a float64 run):
- a computed weight is P (1 + d), |d| <= g_i = (5 n_i + 24 + 8 Z_i) u: the score's add and slope
  product put each e and the max at most 2 u Z_i apart (Z_i = max |z| of the row), expf is
  within 2 ulp (4 u), the sum of n_i terms, a rescale expf per tile whose max grows (at most one
  per edge), the two-lane combine's two expf, the division;
- the tile product rounds its operands (u_p for P, u_v for value / dout: tf32 2^-11, float16
  2^-11 for P (scaled by 2^15 first, so subnormal only below P = 2^-29: 2^-40 absolute there),
  bfloat16 2^-8 for P, 0 where a 16-bit operand is used as it is or on the CPU) and sums at most
  (n + 16) products in float32 (the tile's stored zeros add exact zeros): (n + 16) u of the
  terms' magnitude with round-to-nearest additions (the CPU); tensor cores align their addends
  to the largest and truncate (Fasi et al. 2021, on V100 / A100), up to 2 u an addition, so
  2 (n + 16) u on CUDA;
- the output is rounded once to its dtype (u_out; float16 below 2^-14 in steps of 2^-24: an
  absolute 2^-25).
So |out - out64| <= sum_j P_ij (g_i + u_p + u_v) |v_j| + (n_i + 16) u sum_j P_ij |v_j| + u_out |out|,
and the same shape for d value (over a source's out-edges, dout in place of v). A score gradient
dz_ij = P_ij (dP_ij - D_i) LeakyReLU'(z_ij) moves by g_i P |dP - D| + P (|d dP| + |d D|), with
|d dP_ij| <= (u_p' + u_v + C u) sum_c |dout_ic v_jc| (u_p' the rounding of dout as an operand) and
|d D_i| <= sum_c |dout_ic| |d out_ic| + C u sum_c |dout_ic out_ic|, then summed over n terms.
Second-order terms (products of two u) are below 1% of the first-order ones for every u here:
the bound is multiplied by 1.01 for them. The float64 reference has its own rounding error, at
most the same bound with u = 2^-53: for a float64 run (where that is not negligible) the bound
is doubled; for the others it is below 2^-29 of theirs.
"""
import torch
import torch.nn.functional as F

import gnnio

U32 = 2.0**-24
OPERAND = {torch.float32: 2.0**-11, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # tf32 for float32
OUT = {torch.float32: 0.0, torch.float64: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# float16 outputs below 2^-14 round to a spacing of 2^-24, not relative: an absolute term.
TINY = {torch.float32: 0.0, torch.float64: 0.0, torch.float16: 2.0**-25, torch.bfloat16: 0.0}


def wsb_op(graph, slope=0.2):
    """op(value, src_score, dst_score) of check_op: graph_attention forced onto the tiles."""
    return lambda v, s, d: gnnio.ops.graph_attention(graph, "gat", v, src_score=s, dst_score=d,
                                                     negative_slope=slope, backend="wsb")


def operands(ns, nd, heads, channels, dtype, device, dst=True, seed=0, shift=0.0):
    """shift moves the values off zero mean: then sum_j P |v_j| is close to |out| and the
    forward's bound is as tight as the output (zero-mean values on a long row make out small
    against the bound, which then cannot see a missing tile)."""
    g = torch.Generator().manual_seed(seed)
    value = (torch.randn(ns, heads, channels, generator=g) + shift).to(dtype).to(device)
    src_score = torch.randn(ns, heads, generator=g).to(dtype).to(device)
    dst_score = torch.randn(nd, heads, generator=g).to(dtype).to(device) if dst else None
    return value, src_score, dst_score


def reference(ei, ns, nd, value, src_score, dst_score, slope):
    """float64 GAT attention (PyG's softmax, edge by edge): out and the per-edge P, z."""
    src, dst = ei[0].long().cpu(), ei[1].long().cpu()
    z = src_score[src] + (dst_score[dst] if dst_score is not None else 0)
    e = F.leaky_relu(z, slope)
    heads = e.size(1)
    m = torch.full((nd, heads), float("-inf"), dtype=e.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, heads), e.detach(), "amax")
    w = torch.exp(e - m[dst])
    s = torch.zeros(nd, heads, dtype=e.dtype).index_add(0, dst, w)
    p = w / (s[dst] + 1e-16)
    out = torch.zeros(nd, heads, value.size(2), dtype=value.dtype).index_add(0, dst, p[..., None] * value[src])
    return out, p, z


def bounds(ei, ns, nd, value, dst_score, gout, out64, p, z, slope, dtype, cuda, u=U32):
    """Elementwise bounds on |computed - float64| for out, d value, d src_score, d dst_score."""
    acc = 2.0 if cuda else 1.0  # tensor cores truncate their additions
    src, dst = ei[0].long().cpu(), ei[1].long().cpu()
    v, go = value.detach().cpu().double(), gout.detach().cpu().double()
    p, z = p.detach(), z.detach()
    heads, channels = v.size(1), v.size(2)
    u_p = OPERAND[dtype] if cuda else 0.0
    u_v = OPERAND[dtype] if cuda and dtype == torch.float32 else 0.0  # 16-bit rows are used as they are
    u_out, tiny = OUT[dtype], TINY[dtype]
    n_in = torch.bincount(dst, minlength=nd).double()
    n_out = torch.bincount(src, minlength=ns).double()
    zmax = torch.zeros(nd, heads, dtype=torch.float64).scatter_reduce(
        0, dst[:, None].expand(-1, heads), z.abs(), "amax")
    g = (5 * n_in[:, None] + 24 + 8 * zmax) * u  # [nd, H]
    ge = g[dst]  # per edge
    pv = p[..., None] * v[src].abs()  # [E, H, C]
    fwd_mass = torch.zeros(nd, heads, channels, dtype=torch.float64).index_add(0, dst, pv)
    # float16's P below 2^-29 (scaled: subnormal) rounds to 2^-40 absolute.
    p_tiny = 2.0**-40 if cuda and dtype == torch.float16 else 0.0
    v_sum = torch.zeros(nd, heads, channels, dtype=torch.float64).index_add(0, dst, v[src].abs())
    fwd = (torch.zeros_like(fwd_mass).index_add(0, dst, (ge + u_p + u_v)[..., None] * pv)
           + acc * (n_in[:, None, None] + 16) * u * fwd_mass + p_tiny * v_sum + u_out * out64.abs() + tiny)
    pg = p[..., None] * go[dst].abs()
    dv_mass = torch.zeros(ns, heads, channels, dtype=torch.float64).index_add(0, src, pg)
    # d value: the tile product rounds P and dout as operands (dout like value: tf32 only).
    g_sum = torch.zeros(ns, heads, channels, dtype=torch.float64).index_add(0, src, go[dst].abs())
    dv = (torch.zeros_like(dv_mass).index_add(0, src, (ge + u_p + u_v)[..., None] * pg)
          + acc * (n_out[:, None, None] + 16) * u * dv_mass + p_tiny * g_sum + tiny)
    # Score gradients.
    a = (go[dst] * v[src]).abs().sum(-1)  # [E, H]: sum_c |dout_ic v_jc|
    dp = (go[dst] * v[src]).sum(-1)
    o64 = out64.detach().double()
    D = (go * o64).sum(-1)  # [nd, H]
    d_out = fwd - (u_out * out64.abs() if dtype in (torch.float16, torch.bfloat16) and cuda else 0)  # D reads out_acc
    dD = (go.abs() * d_out).sum(-1) + channels * u * (go * o64).abs().sum(-1)  # D: CUDA cores
    u_dp = (2 * OPERAND[dtype] if dtype == torch.float32 else 0.0) if cuda else 0.0
    lam = torch.where(z > 0, torch.ones_like(z), torch.full_like(z, slope)).abs()
    dz = p * (dp - D[dst])
    ddz = lam * (ge * dz.abs() + p * ((u_dp + acc * channels * u) * a + dD[dst]) + 3 * u * dz.abs())
    dz_abs = (lam * dz).abs()
    d_dst = (torch.zeros(nd, heads, dtype=torch.float64).index_add(0, dst, ddz)
             + (n_in[:, None] + 2) * u * torch.zeros(nd, heads, dtype=torch.float64).index_add(0, dst, dz_abs))
    d_src = (torch.zeros(ns, heads, dtype=torch.float64).index_add(0, src, ddz)
             + (n_out[:, None] + 2) * u * torch.zeros(ns, heads, dtype=torch.float64).index_add(0, src, dz_abs))
    return 1.01 * fwd, 1.01 * dv, 1.01 * d_src + tiny, 1.01 * d_dst + tiny


def assert_within(what, got, ref, bound, rounding=0.0):
    """|got - ref| <= bound + rounding |ref| (rounding: the output's own rounding, for the
    gradients, whose bounds above are for the unrounded value)."""
    got, ref = got.detach().cpu().double(), ref.detach().cpu().double()
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if not got.numel():
        return
    err = (got - ref).abs()
    allowed = bound + rounding * ref.abs()
    worst = (err - allowed).argmax()
    assert bool((err <= allowed).all()), (
        f"{what}: error {err.flatten()[worst].item():.3g} > bound {allowed.flatten()[worst].item():.3g} "
        f"at flat index {worst.item()} (ref {ref.flatten()[worst].item():.3g})")


def check_op(op, ei, ns, nd, heads, channels, dtype, device, dst=True, slope=0.2, seed=0, u=U32,
             shift=0.0):
    """Runs op(value, src_score, dst_score) forward and backward and checks it against float64."""
    value, src_score, dst_score = operands(ns, nd, heads, channels, dtype, device, dst, seed, shift)
    leaves = [t.requires_grad_() for t in (value, src_score, dst_score) if t is not None]
    out = op(value, src_score, dst_score)
    assert out.shape == (nd, heads, channels) and out.dtype == dtype
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    grads = torch.autograd.grad(out, leaves, gout, allow_unused=True)
    r = [t.detach().cpu().double().requires_grad_() for t in leaves]
    v64, s64, d64 = r[0], r[1], (r[2] if dst else None)
    out64, p, z = reference(ei, ns, nd, v64, s64, d64, slope)
    g64 = torch.autograd.grad(out64, r, gout.cpu().double(), allow_unused=True)
    cuda = torch.device(device).type == "cuda"
    fwd, dv, ds, dd = bounds(ei, ns, nd, value, d64, gout, out64, p, z, slope, dtype, cuda, u)
    if dtype == torch.float64:  # the reference's own error is as large as the kernel's
        fwd, dv, ds, dd = 2 * fwd, 2 * dv, 2 * ds, 2 * dd
    u_out = OUT[dtype]
    assert_within("out", out, out64, fwd)
    assert_within("d value", grads[0], g64[0], dv, u_out)
    assert_within("d src_score", grads[1], g64[1], ds, u_out)
    if dst:
        assert_within("d dst_score", grads[2], g64[2], dd, u_out)
    return out
