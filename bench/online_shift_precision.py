"""How precise GATv2's online pass A (D_i formed on the walk, GNNIO_GATV2_DELTA_IN_PASS_A=1)
can be, simulated in numpy float32 for one output of one row: d = sum_k p_k (rg_k - D) f_k.

- default: D summed first (delta_kernel), then the sum of p (rg - D) f;
- first: the kernel's way until v10, sums relative to the first slot's rg, corrected at the
  row's end;
- mean_first_step: the shift is the p-weighted mean of the first step's slots (U of them);
- rebase: after every step of U slots the shift moves to the running estimate of D
  (A -= (s' - s) B, R -= (s' - s) W);
- mean_rebase: the first shift is the plain mean of the first step's rg, then rebase (the kernel
  since v10).

Prints, per row length and rg offset, the largest and the rms error over random rows,
relative to the largest |d|. A planning tool for bench/NOTES.md (v9, v10), not a kernel test.

`--cuda` measures the kernel instead: GATv2's gradients on the GPU with the online pass A
(GNNIO_GATV2_DELTA_IN_PASS_A=1) and with D_i from out (=0), each against float64 on the CPU
from the same operands, on the CUDA tests' graphs, fresh seeds; prints each mode's largest
error relative to the gradient's scale and their ratio. (Its first run, at 74339e1, drew the
operands in float64 without rounding them to float32 first: its uniform_deg16 rows' 1e-3 /
1e-2 errors, equal in both modes, were LeakyReLU's kink, not D_i: see NOTES v10.)"""
import os
import sys

import numpy as np

rng = np.random.default_rng(0)
f32 = np.float32


def errors(length, trials=2000, steps=4, offset=0.0):
    modes = ("default", "first", "mean_first_step", "rebase", "mean_rebase")
    errs = {m: [] for m in modes}
    scales = []
    for _ in range(trials):
        e = rng.normal(size=length)
        p = np.exp(e - e.max())
        p /= p.sum()
        rg = rng.normal(size=length) + offset
        fv = rng.normal(size=length)
        d_exact = np.sum(p * rg)
        exact = np.sum(p * (rg - d_exact) * fv)
        scales.append(abs(exact))
        p32, rg32, fv32 = p.astype(f32), rg.astype(f32), fv.astype(f32)
        d32 = f32(0)
        for k in range(length):
            d32 = f32(d32 + p32[k] * rg32[k])
        acc = f32(0)
        for k in range(length):
            acc = f32(acc + f32(p32[k] * f32(rg32[k] - d32)) * fv32[k])
        errs["default"].append(abs(acc - exact))
        for mode in modes[1:]:
            if mode == "mean_first_step":
                w = m = f32(0)
                for k in range(min(steps, length)):
                    w, m = f32(w + p32[k]), f32(m + p32[k] * rg32[k])
                s = f32(m / w)
            elif mode == "mean_rebase":
                m = f32(0)
                for k in range(min(steps, length)):
                    m = f32(m + rg32[k])
                s = f32(m / f32(min(steps, length)))
            else:
                s = rg32[0]
            a = b = w = r = f32(0)
            for b0 in range(0, length, steps):
                for k in range(b0, min(length, b0 + steps)):
                    x = f32(p32[k] * f32(rg32[k] - s))
                    w, r = f32(w + p32[k]), f32(r + x)
                    a, b = f32(a + x * fv32[k]), f32(b + p32[k] * fv32[k])
                if mode in ("rebase", "mean_rebase") and w > 0:
                    moved = f32(f32(s + r / w) - s)
                    a, r, s = f32(a - moved * b), f32(r - moved * w), f32(s + moved)
            d_rel = f32(r + s * f32(w - 1))
            errs[mode].append(abs(f32(a - d_rel * b) - exact))
    scale = max(scales)
    return {m: (max(v) / scale, float(np.sqrt(np.mean(np.square(v)))) / scale) for m, v in errs.items()}


def kernel_errors(seeds=3, heads=4, channels=32):
    from unittest import mock

    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
    from graphs import hub, random_graph

    graphs = {"random": (random_graph(2000, 20_000)[0], 2000, 2000),
              "hub_in": (lambda h: (h[0], h[1], h[1]))(hub(200_000)),
              "bipartite": (torch.stack([torch.randint(300, (3000,)), torch.randint(100, (3000,))]), 300, 100),
              "uniform_deg16": (random_graph(100_000, 1_600_000)[0], 100_000, 100_000)}
    names = ("value=key", "query", "att")
    with mock.patch.dict(os.environ):  # the knob as the caller had it, afterwards
        _kernel_rows(graphs, names, seeds, heads, channels)


def _kernel_rows(graphs, names, seeds, heads, channels):
    import torch

    import gnnio
    print(f"{'graph':14s} {'dropout':>7s} {'grad':>9s} {'D from out':>10s} {'online':>10s} {'ratio':>6s}")
    for graph_name, (ei, ns, nd) in graphs.items():
        for dropout in (0.0, 0.3):
            worst = {n: [0.0, 0.0] for n in names}
            for _ in range(seeds):
                gen = torch.Generator().manual_seed(torch.seed())
                # Operands rounded to float32 first, as the CUDA tests do: the float64 reference
                # then sees the kernel's inputs (unrounded, a z = k + q within float32's rounding
                # of 0 takes the other side of LeakyReLU's kink: bench/large_graph_check.py).
                def rand(*shape, scale=1.0):
                    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).float().double()
                value = rand(ns, heads, channels)
                query, att = rand(nd, heads, channels, scale=0.3), rand(heads, channels, scale=0.3)
                dout = rand(nd, heads, channels)
                ref = [t.clone().requires_grad_() for t in (value, query, att)]
                out = gnnio.ops.graph_attention(gnnio.Graph(ei, size=(ns, nd)), "gatv2", ref[0], key=ref[0],
                                                query=ref[1], att=ref[2], dropout=dropout, seed=3)
                exact = torch.autograd.grad(out, ref, dout)
                g = gnnio.Graph(ei.cuda(), size=(ns, nd))
                for mode, knob in enumerate(("0", "1")):
                    os.environ["GNNIO_GATV2_DELTA_IN_PASS_A"] = knob
                    leaves = [t.float().cuda().requires_grad_() for t in (value, query, att)]
                    out = gnnio.ops.graph_attention(g, "gatv2", leaves[0], key=leaves[0], query=leaves[1],
                                                    att=leaves[2], dropout=dropout, seed=3)
                    got = torch.autograd.grad(out, leaves, dout.float().cuda())
                    for n, a, e in zip(names, got, exact):
                        err = (a.cpu().double() - e).abs().max().item() / e.abs().max().item()
                        worst[n][mode] = max(worst[n][mode], err)
            for n, (d, o) in worst.items():
                print(f"{graph_name:14s} {dropout:7.1f} {n:>9s} {d:10.2e} {o:10.2e} {o / d:6.2f}")


if __name__ == "__main__" and "--cuda" in sys.argv:
    kernel_errors()
elif __name__ == "__main__":
    for length in (4, 8, 30, 200):
        for offset in (0.0, 3.0):
            res = errors(length, offset=offset)
            print(f"L={length:4d} offset={offset}: " +
                  ", ".join(f"{m} {mx:.2e}/{rms:.2e}" for m, (mx, rms) in res.items()))
