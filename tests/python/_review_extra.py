import time, traceback
import torch
import gnnio
from gnnio.ops import _split_args
from gnnio.plan import plan_reduce
from graphs import hub, random_graph

torch.manual_seed(0)
results = []


def rep(name, ok, extra=""):
    results.append((name, ok))
    print(f"[{'OK ' if ok else 'BAD'}] {name} {extra}", flush=True)


def run(dev, ei, n, x, w, reduce, degree_aware=None, gout=None, xg=True, wg=True):
    g = gnnio.Graph(ei.to(dev), num_nodes=n)
    xd = x.to(dev).detach().requires_grad_(xg)
    wd = w.to(dev).detach().requires_grad_(wg)
    kw = {} if dev == "cpu" else {"degree_aware": degree_aware}
    out, arg = gnnio.ops.segment_reduce(g, xd, reduce, return_arg=True, edge_weight=wd, **kw)
    if gout is None:
        gout = torch.randn(out.shape, dtype=out.dtype)
    inputs = [t for t, r in ((xd, xg), (wd, wg)) if r]
    grads = torch.autograd.grad(out, inputs, gout.to(dev).to(out.dtype)) if inputs else ()
    return [out.cpu(), arg.long().cpu()] + [t.cpu() for t in grads]


def same(a, b):
    return all(torch.equal(x, y) or (x.dtype.is_floating_point and torch.allclose(x, y, equal_nan=True, rtol=0, atol=0))
               for x, y in zip(a, b)) and len(a) == len(b)


def close(a, b, rtol=1e-5):
    return all(torch.allclose(x.double(), y.double(), rtol=rtol, atol=rtol) for x, y in zip(a, b))


def strided(x, pad):
    big = torch.randn(x.size(0), x.size(1) + pad, dtype=x.dtype)
    big[:, :x.size(1)] = x
    return big[:, :x.size(1)]


def guard(name, fn):
    try:
        fn()
    except Exception:
        rep(name, False, traceback.format_exc()[-1500:])


# A: non-contiguous x rows (x_row_stride != width), light (V>1 and V=1) and heavy, both grads
def A():
    for (ei, n), F, pad, da in [(random_graph(500, 8000), 8, 8, True), (random_graph(500, 8000), 7, 3, True),
                                (hub(100_000), 8, 8, True), (hub(100_000), 5, 3, True), (hub(100_000), 8, 8, False)]:
        x = torch.randn(n, F)
        w = torch.randn(ei.size(1))
        gout = torch.randn(n, F)
        cpu = run("cpu", ei, n, x, w, "max", gout=gout)
        # CUDA with a strided x: build the strided view on the device
        g = gnnio.Graph(ei.cuda(), num_nodes=n)
        big = torch.randn(n, F + pad, device="cuda")
        big[:, :F] = x.cuda()
        xs = big[:, :F].detach().requires_grad_()
        assert xs.stride(0) == F + pad
        wd = w.cuda().requires_grad_()
        out, arg = gnnio.ops.segment_reduce(g, xs, "max", return_arg=True, edge_weight=wd, degree_aware=da)
        gx, gw = torch.autograd.grad(out, (xs, wd), gout.cuda())
        cu = [out.cpu(), arg.long().cpu(), gx.cpu(), gw.cpu()]
        ok_fwd = same(cpu[:2], cu[:2])
        ok_bwd = close(cpu[2:], cu[2:])
        ok_gw_bits = torch.equal(cpu[3], cu[3])
        rep(f"A strided x F={F} pad={pad} E={ei.size(1)} da={da}", ok_fwd and ok_bwd,
            f"fwd={ok_fwd} bwd_close={ok_bwd} gw_bitwise={ok_gw_bits} gx_bitwise={torch.equal(cpu[2], cu[2])}")
guard("A", A)


# B: width 1 hub both sides, heavy and forced node-parallel
def B():
    ei, n = hub(300_000)
    for flip in (False, True):
        e = ei.flip(0) if flip else ei
        x = torch.randn(n, 1)
        w = torch.randn(e.size(1))
        gout = torch.randn(n, 1)
        cpu = run("cpu", e, n, x, w, "min", gout=gout)
        for da in (True, False):
            cu = run("cuda", e, n, x, w, "min", degree_aware=da, gout=gout)
            rep(f"B width1 flip={flip} da={da}", same(cpu[:2], cu[:2]) and close(cpu[2:], cu[2:]))
guard("B", B)


# C: empty graph / no edges with weights needing grad
def C():
    ei = torch.empty(2, 0, dtype=torch.long)
    for n in (5, 0):
        x = torch.randn(n, 4)
        w = torch.randn(0)
        cu = run("cuda", ei, n, x, w, "max", gout=torch.randn(n, 4))
        ok = cu[0].eq(0).all() and cu[1].eq(-1).all() and cu[2].eq(0).all() and cu[3].numel() == 0
        rep(f"C empty n={n}", bool(ok))
guard("C", C)


# D: 16-bit gradients against float64 over the fp-rounded messages (relative error)
def D():
    ei, n = hub(200_000)
    ei = torch.cat([ei, ei.flip(0)], 1)
    for dt in (torch.float16, torch.bfloat16):
        x = torch.randn(n, 19).to(dt)
        w = torch.randn(ei.size(1)).to(dt)
        gout = torch.randn(n, 19).to(dt)
        cu = run("cuda", ei, n, x, w, "max", degree_aware=True, gout=gout)
        # float64 reference with the CUDA winners
        arg = cu[1]
        g = gnnio.Graph(ei, num_nodes=n)
        perm = g.csr_by_dst.perm.long()
        rows, feats = (arg >= 0).nonzero(as_tuple=True)
        e = perm[arg[rows, feats]]
        src = ei[0][e]
        msg = (w.double()[e] * x.double()[src, feats]).to(dt)
        ok_out = torch.equal(cu[0][rows, feats], msg)
        gx = torch.zeros(n, 19, dtype=torch.float64).index_put_((src, feats), w.double()[e] * gout.double()[rows, feats], accumulate=True)
        gw = torch.zeros(ei.size(1), dtype=torch.float64).index_add_(0, e, gout.double()[rows, feats] * x.double()[src, feats])
        eps = torch.finfo(dt).eps
        ex = ((cu[2].double() - gx).abs() / gx.abs().clamp(min=1e-3)).max().item()
        ew = ((cu[3].double() - gw).abs() / gw.abs().clamp(min=1e-3)).max().item()
        rep(f"D {dt} out exact, grads rel err x={ex:.2e} w={ew:.2e} (eps {eps:.1e})", ok_out and ex <= eps and ew <= eps)
guard("D", D)


# E: int64 indices with the heavy split (op called directly), vs int32
def E():
    ei, n = hub(300_000)
    ei = torch.cat([ei, ei.flip(0)], 1)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    x = torch.randn(n, 21, device="cuda")
    w = torch.randn(ei.size(1), device="cuda")[f.perm.long()]
    gout = torch.randn(n, 21, device="cuda")
    split = _split_args(plan_reduce(g, x.dtype, True, backward=True))
    assert split[0] is not None
    runs = []
    for idx in (torch.int32, torch.int64):
        xd, wd = x.clone().requires_grad_(), w.clone().requires_grad_()
        out, arg = torch.ops.gnnio.segment_reduce(*(a.to(idx) for a in (f.rowptr, f.col)), xd, n, n, "min",
                                                  *(a.to(idx) for a in (t.rowptr, t.col, g.src_slot_to_dst_slot)),
                                                  *split, weight=wd)
        runs.append([out, arg.long()] + list(torch.autograd.grad(out, (xd, wd), gout)))
    rep("E int64 vs int32 with heavy split", same([a.cpu() for a in runs[0]], [a.cpu() for a in runs[1]]))
guard("E", E)


# F: float64 weighted on a hub with degree_aware (planner keeps float64 light), vs CPU bitwise fwd
def F():
    ei, n = hub(100_000)
    x = torch.randn(n, 6, dtype=torch.float64)
    w = torch.randn(ei.size(1), dtype=torch.float64)
    gout = torch.randn(n, 6, dtype=torch.float64)
    cpu = run("cpu", ei, n, x, w, "max", gout=gout)
    cu = run("cuda", ei, n, x, w, "max", degree_aware=True, gout=gout)
    rep("F float64 hub", same(cpu, cu), f"per-output {[torch.equal(a, b) for a, b in zip(cpu, cu)]}")
guard("F", F)


# H: inf * 0 = NaN messages, NaN wins; CPU vs CUDA light and heavy
def H():
    ei, n = hub(100_000)
    x = torch.randn(n, 9)
    x[::7, 3] = float("inf")
    x[::11, 4] = float("-inf")
    w = torch.randn(ei.size(1))
    w[::13] = 0
    gout = torch.randn(n, 9)
    cpu = run("cpu", ei, n, x, w, "max", gout=gout)
    for da in (True, False):
        cu = run("cuda", ei, n, x, w, "max", degree_aware=da, gout=gout)
        fwd = torch.equal(cpu[1], cu[1]) and torch.allclose(cpu[0], cu[0], equal_nan=True, rtol=0, atol=0)
        rep(f"H nan/inf da={da}", fwd, f"arg={torch.equal(cpu[1], cu[1])}")
guard("H", H)


# I: timings (float32, powerlaw-ish random graph)
def I():
    from gnnio import datasets
    d = datasets.load("powerlaw-200K-4M")
    ei, n = d.edge_index, d.num_nodes
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    F = 64
    x = torch.randn(n, F, device="cuda", requires_grad=True)
    w = torch.randn(ei.size(1), device="cuda", requires_grad=True)
    gout = torch.randn(n, F, device="cuda")

    def t(fn, reps=10):
        fn(); torch.cuda.synchronize()
        s = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - s) / reps * 1e3
    out, arg = gnnio.ops.segment_reduce(g, x, "max", return_arg=True, edge_weight=w)
    f = g.csr_by_dst
    fw = t(lambda: gnnio.ops.segment_reduce(g, x.detach(), "max", edge_weight=w.detach()))
    fu = t(lambda: gnnio.ops.segment_reduce(g, x.detach(), "max"))
    wb = t(lambda: torch.ops.gnnio.segment_reduce_weight_backward(f.col, x.detach(), arg, gout))
    full = t(lambda: torch.autograd.grad(gnnio.ops.segment_reduce(g, x, "max", edge_weight=w), (x, w), gout))
    print(f"[TIME] n={n} E={ei.size(1)} F={F}: fwd unweighted {fu:.3f} ms, fwd weighted {fw:.3f} ms, "
          f"weight_backward {wb:.3f} ms, fwd+bwd(x,w) {full:.3f} ms", flush=True)
guard("I", I)

print("SUMMARY", sum(ok for _, ok in results), "/", len(results), "ok;", [n for n, ok in results if not ok])
