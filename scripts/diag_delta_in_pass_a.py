"""Stress check of GATv2's online pass A (the CUDA default, GNNIO_GATV2_DELTA_IN_PASS_A unset):
the inputs of tests/python/test_attention_cuda.py::test_cuda_delta_in_pass_a drawn afresh many
times; each draw's gradients against float64 on the CPU with that test's bound. On a miss it
prints where: the worst entry, its row's degree, whether a second run of the same call gives
the same bits (a race would not), and the error of the path that forms D_i from out (=0) on the
same inputs. Usage (device): python3 scripts/diag_delta_in_pass_a.py [draws] [graph ...]"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from test_attention_cuda import EPS32, GRAPHS, H, C, operands  # noqa: E402

import gnnio  # noqa: E402

KNOB = "GNNIO_GATV2_DELTA_IN_PASS_A"
NAMES = ["value", "query", "key", "att"]


def run(g, value, ops, edge_ops, dout, dropout, knob, device, dtype):
    if knob is None:
        os.environ.pop(KNOB, None)
    else:
        os.environ[KNOB] = knob
    cast = (lambda t: t.to(device)) if dtype is None else (lambda t: t.to(device, dtype))
    leaves = [cast(value).requires_grad_()] + [cast(ops[k]).requires_grad_() for k in NAMES[1:]]
    out = gnnio.ops.graph_attention(g, "gatv2", leaves[0], dropout=dropout, seed=5,
                                    **{k: cast(t) for k, t in edge_ops.items()},
                                    **dict(zip(NAMES[1:], leaves[1:])))
    return [t.cpu().double() for t in torch.autograd.grad(out, leaves, cast(dout))]


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    graphs = sys.argv[2:] or ["random", "hub_out"]
    misses = 0
    for name in graphs:
        ei, (ns, nd) = GRAPHS[name]
        g, ge = gnnio.Graph(ei.cuda(), size=(ns, nd)), gnnio.Graph(ei, size=(ns, nd))
        in_deg = torch.bincount(ei[1], minlength=nd)
        out_deg = torch.bincount(ei[0], minlength=ns)
        degrees = [torch.bincount(ei[r], minlength=1).max().item() for r in (0, 1)]
        for draw in range(draws):
            dropout = 0.3 if draw % 2 else 0.0
            seed = 1000 * draw + 17
            gen = torch.Generator().manual_seed(seed)
            value, ops = operands("gatv2", ns, nd, ei.size(1), True, torch.float32, gen)
            dout = torch.randn(nd, H, C, generator=gen)
            edge_ops = {k: t for k, t in ops.items() if k.startswith("edge_")}
            want = run(ge, value, ops, edge_ops, dout, dropout, None, "cpu", torch.float64)
            got = run(g, value, ops, edge_ops, dout, dropout, None, "cuda", None)
            for n, a, w in zip(NAMES, got, want):
                terms = ei.size(1) if n == "att" else max(degrees)
                shifted = 3 if n in ("query", "att") else 1
                bound = shifted * 4 * math.sqrt(terms) * EPS32 + EPS32
                err = (a - w).abs()
                scale = w.abs().max().item()
                if err.max().item() <= bound * scale:
                    continue
                misses += 1
                idx = torch.nonzero(err > bound * scale)
                worst = tuple(int(x) for x in (err == err.max()).nonzero()[0])
                again = run(g, value, ops, edge_ops, dout, dropout, None, "cuda", None)
                kept = run(g, value, ops, edge_ops, dout, dropout, "0", "cuda", None)
                names = dict(zip(NAMES, range(4)))
                print(f"MISS {name} draw {draw} seed {seed} dropout {dropout}: d {n} error "
                      f"{err.max().item():.3g} > {bound:.2g} x {scale:.3g}; {idx.size(0)} entries "
                      f"over, rows {sorted(set(idx[:, 0].tolist()))[:12]}; worst {worst} got "
                      f"{a[worst].item():.5g} want {w[worst].item():.5g}")
                if n == "query":  # rows are destinations
                    print(f"  worst row's in-degree {in_deg[worst[0]].item()}")
                elif n != "att":  # rows are sources
                    print(f"  worst row's out-degree {out_deg[worst[0]].item()}")
                print(f"  second run same bits: {all(torch.equal(x, y) for x, y in zip(got, again))}; "
                      f"=0 path error {(kept[names[n]] - w).abs().max().item():.3g}; "
                      f"second run error {(again[names[n]] - w).abs().max().item():.3g}")
        print(f"{name}: {draws} draws done, {misses} misses so far", flush=True)
    print(f"total misses: {misses}")


if __name__ == "__main__":
    main()
