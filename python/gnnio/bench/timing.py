"""Timers and memory probes shared by every benchmark row."""
import statistics
import time

import torch


def median_ms(fn, device: torch.device, warmup: int, repeat: int, min_sample_ms: float = 5.0) -> float:
    """Median time of one fn() in milliseconds: CUDA events on a GPU, perf_counter on a CPU.

    A call shorter than `min_sample_ms` is repeated back to back inside each sample (and the
    time divided), so launch-bound calls on small graphs are measured as a stream of calls
    rather than as one timer pair's jitter. Every implementation gets the same treatment. 5 ms:
    with 1 ms samples (3 calls of a 0.3 ms layer) one row in each of two reduction runs came
    out 10-15% off between runs (bench/NOTES.md, reduction v2). On a CPU, one call per sample
    with 2 warm-up calls put Cora's gnnio spmm at 0.67 ms against 0.18-0.21 ms in a steady
    loop: the first calls after loading a graph are not the steady state."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    one = sample_ms(fn, 1, device)
    inner = max(1, min(200, int(min_sample_ms / max(one, 1e-3))))
    times = [sample_ms(fn, inner, device) for _ in range(repeat)]
    return statistics.median(times)


def sample_ms(fn, inner: int, device: torch.device) -> float:
    """One timing sample: ``inner`` calls back to back, ms per call (CUDA events on a GPU,
    perf_counter on a CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) * 1e3 / inner


def peak_extra_gib(fn, device: torch.device):
    """Peak memory allocated while fn() runs, above what was allocated before (GiB); None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**30


def copy_rate_tbps(device: torch.device, gib: float = 2.0) -> float:
    """Device-to-device copy rate in TB/s counting bytes read plus written (the ceiling every
    gather-bound kernel is compared with); on a CPU, a memcpy of a smaller buffer."""
    n = int((gib if device.type == "cuda" else 0.25) * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup=3, repeat=10)
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def rel_diff(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item() if b.numel() else 0.0


def bench_module(fn_fwd, outputs_grad, inputs, device, args):
    """(fwd_ms, fwd_bwd_ms, peak_extra_gib) of a forward callable and its backward."""
    def fwd_bwd():
        out = fn_fwd()
        torch.autograd.grad(out, inputs, outputs_grad)

    fwd = median_ms(fn_fwd, device, args.warmup, args.repeat)
    both = median_ms(fwd_bwd, device, args.warmup, args.repeat)
    return fwd, both, peak_extra_gib(fwd_bwd, device)
