"""Where TransformerConv's forward spends its time, form by form (bench/NOTES.md v21): the
layer's forward (128 -> 4 x 32, float32, the benchmark's inputs) in the direct and fused forms,
timed with CUDA events, then every kernel's time by the profiler. Diagnostics, not benchmark
rows (the rows come from `python -m gnnio.bench --layers TransformerConv` with
GNNIO_TRANSFORMER_FORM set).

    python3 scripts/device_diag_fused.py [graph ...]
    DIAG_BACKWARD=1 python3 scripts/device_diag_fused.py  # also one forward+backward's kernels
    python3 scripts/device_diag_fused.py --ncu [graph]  # one fused forward, for ncu -k fused_kernel
"""
import os
import sys

import torch

import gnnio
from cuda_timing import timed  # scripts/, the script's own folder
from gnnio import datasets


def main():
    args = sys.argv[1:]
    ncu = "--ncu" in args
    args = [a for a in args if a != "--ncu"]
    for name in args or ["powerlaw-1M-16M"]:
        d = datasets.load(name)
        graph = gnnio.Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
        print(name, graph.stats())
        torch.manual_seed(0)
        conv = gnnio.nn.TransformerConv(128, 32, heads=4).cuda()
        x = torch.randn(d.num_nodes, 128, device="cuda")
        if ncu:
            os.environ["GNNIO_TRANSFORMER_FORM"] = "fused"
            with torch.no_grad():
                conv(x, graph)
            torch.cuda.synchronize()
            continue
        for form in ("direct", "fused"):
            os.environ["GNNIO_TRANSFORMER_FORM"] = form

            def fwd():
                with torch.no_grad():
                    return conv(x, graph)

            # as the benchmark's forward+backward (gnnio.bench.timing.bench_module): the
            # gradients of x and the parameters for a dense output gradient, not accumulated
            xg = x.clone().requires_grad_()
            inputs = [xg] + [p for p in conv.parameters() if p.requires_grad]
            gout = torch.randn(d.num_nodes, 128, device="cuda")

            def both():
                torch.autograd.grad(conv(xg, graph), inputs, gout)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fwd()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - before) / 2**20  # with out, held after
            print(f"{form}: forward {timed(fwd):.3f} ms, forward+backward {timed(both):.3f} ms, "
                  f"forward's peak above its inputs {peak:.0f} MiB")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fwd()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8,
                                            max_name_column_width=90))
            if os.environ.get("DIAG_BACKWARD") == "1":
                # the training step's kernels (for the forward+backward bar): one call, all rows
                with torch.profiler.profile(
                        activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    both()
                    torch.cuda.synchronize()
                print(f"{form}: one forward+backward")
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                                max_name_column_width=90))


if __name__ == "__main__":
    main()
