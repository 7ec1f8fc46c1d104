"""Where a layer's time goes on the GPU: one forward+backward of each attention layer on a
standard graph under torch.profiler, the top CUDA kernels by total time; with ``--train``, one
training step of the examples' 3-layer GATv2 (the ``GATv2x3-train`` row: forward, cross entropy,
backward, Adam). For NOTES.md, not a benchmark (the benchmark protocol is gnnio.bench's)."""
import argparse
import contextlib

import torch
from torch.profiler import ProfilerActivity, profile

import gnnio
from gnnio.bench.cases import LAYERS


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="powerlaw-1M-16M")
    p.add_argument("--layers", default="GATConv,GATv2Conv,TransformerConv")
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--train", action="store_true",
                   help="profile the GATv2x3-train step instead of the layers")
    p.add_argument("--forward", action="store_true",
                   help="profile the forward alone, as gnnio.bench times it (autograd on), with CPU "
                        "activity and the GPU's busy time against the wall time; warn on syncs")
    p.add_argument("--ncu", action="store_true",
                   help="no torch.profiler: mark the measured call with cudaProfilerStart/Stop, "
                        "for `ncu --profile-from-start off` (scripts/device_session.sh's NCU)")
    args = p.parse_args()
    data = gnnio.datasets.load(args.graph)
    ei = data.edge_index.cuda()
    torch.manual_seed(0)
    if args.train:
        return profile_train_step(args, ei, data.num_nodes)
    x = torch.randn(data.num_nodes, 128, device="cuda", requires_grad=True)
    for name in args.layers.split(","):
        layer = LAYERS[name].make_gnnio(128).cuda()
        gout = None
        for _ in range(3):  # warm-up: graph caches, plans, cuBLAS handles
            out = layer(x, ei)
            gout = torch.randn_like(out) if gout is None else gout
            out.backward(gout)
        torch.cuda.synchronize()
        if args.forward:
            profile_forward(args, name, lambda: layer(x, ei))
            continue
        with measured(args) as prof:
            out = layer(x, ei)
            out.backward(gout)
            torch.cuda.synchronize()
        print_top(prof, f"{name} on {args.graph}: one forward + backward", args.top)


def profile_forward(args, name, forward):
    """One forward under torch.profiler (CPU and CUDA), after a pass under sync debug mode
    (a host sync inside the forward would leave the GPU idle while Python catches up)."""
    torch.cuda.set_sync_debug_mode("warn")
    forward()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start.record()
        forward()
        end.record()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e3
    print(f"=== {name} on {args.graph}: one forward, events {start.elapsed_time(end):.3f} ms, "
          f"GPU busy {busy:.3f} ms in {len(kernels)} kernels")
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        print(f"  {e.time_range.start / 1e3:9.3f} ms  {e.device_time / 1e3:7.3f} ms  {e.name[:100]}")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.top,
                                    max_name_column_width=80))


@contextlib.contextmanager
def measured(args):
    """torch.profiler around the measured call, or (--ncu) the CUDA profiler range ncu waits for."""
    if not args.ncu:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            yield prof
        return
    torch.cuda.profiler.start()
    yield None
    torch.cuda.profiler.stop()


def profile_train_step(args, ei, n):
    from gnnio.bench import training
    step = training.example_step(ei, n, ei.device)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with measured(args) as prof:
        step()
        torch.cuda.synchronize()
    print_top(prof, f"{training.LAYER} on {args.graph}: one training step", args.top)


def print_top(prof, title, top):
    """The top CUDA kernels by total time (nothing under --ncu, where ncu holds the counters)."""
    if prof is None:
        return
    print(f"=== {title}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=110))


if __name__ == "__main__":
    main()
