"""The device diagnostics' timer (scripts/device_diag_*.py): the median of CUDA-event times of
`repeat` calls after one untimed call. Diagnostics only; benchmark rows come from gnnio.bench."""
import torch


def timed(fn, repeat=10):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]
