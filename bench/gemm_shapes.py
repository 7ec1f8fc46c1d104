"""The layers' projection GEMM alone (x [N, F] @ W^T, float32, no TF32, as PyG's Linear), timed
in the forms PyTorch can issue it, with the cuBLAS kernel each one runs: which form of the same
product is fastest on this card. A micro-benchmark for bench/NOTES.md (v16), not a results row.

    python3 bench/gemm_shapes.py --rows 1000000 --in 128 --out 128
"""
import argparse

import torch
import torch.nn.functional as F


def timed(fn, warmup=5, repeat=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name[:90], e.device_time_total / 1e3) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--in", dest="fin", type=int, default=128)
    ap.add_argument("--out", dest="fout", type=int, default=128)
    a = ap.parse_args()
    assert not torch.backends.cuda.matmul.allow_tf32
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(a.rows, a.fin, device="cuda", generator=gen)
    w = torch.randn(a.fout, a.fin, device="cuda", generator=gen)
    wt = w.t().contiguous()
    ref = F.linear(x, w)
    forms = {
        "F.linear(x, W)": lambda: F.linear(x, w),
        "x @ W^T (W^T contiguous)": lambda: x @ wt,
        "(W @ x^T)^T, then contiguous": lambda: (w @ x.t()).t().contiguous(),
        "torch.addmm(0, x, W^T)": lambda: torch.addmm(torch.zeros(a.fout, device="cuda"), x, wt),
    }
    print(f"x [{a.rows}, {a.fin}] @ W^T [{a.fin}, {a.fout}], float32, allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    for lib in ("default", "cublaslt"):
        if lib == "cublaslt":
            try:
                torch.backends.cuda.preferred_blas_library("cublaslt")
            except Exception as err:  # noqa: BLE001 - report and stop
                print(f"cublaslt: {err}")
                break
        for name, fn in forms.items():
            err = (fn() - ref).abs().max().item()
            ms = timed(fn)
            ks = "; ".join(f"{k} {t:.3f}" for k, t in kernels(fn))
            print(f"{lib:9s} {name:32s} {ms:7.3f} ms  max|diff| {err:.2e}  {ks}")


if __name__ == "__main__":
    main()
