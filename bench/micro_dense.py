"""Times the dense pieces around the attention kernels on the GPU, to choose between ways of
computing the same thing before writing any of them into a layer (bench/NOTES.md, v11):

- column sums of a [N, F] gradient (the bias gradients): ``g.sum(0)``, ``ones[1, N] @ g`` and
  ``torch.mv(g.t(), ones)``, each also run twice to check that it gives the same bits;
- GATv2's two forward linears of one input: two ``F.linear`` against one with the weights
  concatenated (a [N, 2F] output), and the backward's d x and d W the same two ways;
- the output bias add ``out + bias``.

    python bench/micro_dense.py [--nodes 1000000] [--features 128] [--out FILE.json]

Each case: CUDA-event time of a loop of calls long enough to take >= 5 ms, median of 15.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def median_ms(fn, min_ms: float = 5.0, samples: int = 15) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 1
    while True:  # reps per sample so that one sample takes >= min_ms
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= min_ms:
            break
        reps *= 2
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def same_bits(fn) -> bool:
    a, b = fn(), fn()
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    n, f = args.nodes, args.features
    rows = []

    def record(name, fn, check=None):
        ms = median_ms(fn)
        row = {"case": name, "ms": round(ms, 4)}
        if check is not None:
            row["deterministic"] = same_bits(check)
        rows.append(row)
        print(f"{name:48s} {ms:8.4f} ms" + (f"  same bits: {row['deterministic']}" if check else ""),
              flush=True)

    for width in (f, 2 * f):
        g = torch.randn(n, width, device=dev)
        ones_row = torch.ones(1, n, device=dev)
        ones = torch.ones(n, device=dev)
        ref = g.double().sum(0)
        for name, fn in (("sum(0)", lambda: g.sum(0)),
                         ("ones[1,N] @ g", lambda: (ones_row @ g).view(-1)),
                         ("mv(g.t(), ones)", lambda: torch.mv(g.t(), ones))):
            record(f"column sum [{n}, {width}] {name}", fn, fn)
            err = (fn().double() - ref).abs().max().item()
            print(f"{'':48s} max |err| vs float64 {err:.3e}", flush=True)
            rows[-1]["max_abs_err"] = err
        del g

    x = torch.randn(n, f, device=dev)
    w1, w2 = torch.randn(f, f, device=dev) / f ** 0.5, torch.randn(f, f, device=dev) / f ** 0.5
    b1, b2 = torch.randn(f, device=dev), torch.randn(f, device=dev)
    w_cat, b_cat = torch.cat([w1, w2]), torch.cat([b1, b2])
    record("forward: two F.linear [N,F]->[N,F]", lambda: (F.linear(x, w1, b1), F.linear(x, w2, b2)))
    record("forward: one F.linear [N,F]->[N,2F]", lambda: F.linear(x, w_cat, b_cat))
    g1, g2 = torch.randn(n, f, device=dev), torch.randn(n, f, device=dev)
    g_cat = torch.cat([g1, g2], 1)
    record("backward d x: mm + addmm_", lambda: torch.mm(g1, w1).addmm_(g2, w2))
    record("backward d x: one mm [N,2F]@[2F,F]", lambda: torch.mm(g_cat, w_cat))
    record("backward d W: two g.t() @ x", lambda: (g1.t().mm(x), g2.t().mm(x)))
    record("backward d W: one g_cat.t() @ x", lambda: g_cat.t().mm(x))
    out, bias = torch.randn(n, f, device=dev), torch.randn(f, device=dev)
    record("out + bias [N,F]", lambda: out + bias)
    record("copy [N,F] (read + write floor)", lambda: out.clone())

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "nodes": n, "features": f,
            "allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
