"""Where graph_attention's time goes by dtype: the benchmark's op operands (gnnio.bench's
graph_attention(kind) rows: 4 heads x 32, random inputs needing gradients) on one graph, one
forward and one forward+backward under torch.profiler per kind and dtype, CUDA kernels by total
time. With ``--ncu`` there is no profiler: each measured forward is bracketed by
cudaProfilerStart/Stop for ``ncu --profile-from-start off``. For NOTES.md (why a dtype is slower
than another), not a benchmark (the benchmark protocol is gnnio.bench's)."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import gnnio
from gnnio.bench.cases import attention_operands


def short(name, width=110):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="powerlaw-1M-16M")
    p.add_argument("--kinds", default="gat,gatv2,dot")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--ncu", action="store_true")
    args = p.parse_args()
    data = gnnio.datasets.load(args.graph)
    graph = gnnio.Graph(data.edge_index.cuda(), num_nodes=data.num_nodes)
    for kind in args.kinds.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            gen = torch.Generator(device="cuda").manual_seed(1)
            value, ops, _ = attention_operands(
                kind, data.num_nodes, 4, 32,
                lambda *shape: torch.randn(*shape, generator=gen, device="cuda", dtype=dtype))
            gout = torch.randn(data.num_nodes, 4, 32, generator=gen, device="cuda", dtype=dtype)

            def fwd():
                return gnnio.ops.graph_attention(graph, kind, value, **ops)
            for _ in range(3):
                fwd().backward(gout)
            torch.cuda.synchronize()
            if args.ncu:
                torch.cuda.cudart().cudaProfilerStart()
                fwd()
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
                continue
            for what, call in (("forward", fwd), ("forward+backward", lambda: fwd().backward(gout))):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    call()
                    torch.cuda.synchronize()
                totals = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        totals[e.name] = totals.get(e.name, 0.0) + e.device_time_total / 1e3
                print(f"== {kind} {dtype_name} {what}: {sum(totals.values()):.3f} ms on the GPU")
                for name, ms in sorted(totals.items(), key=lambda t: -t[1])[:args.top]:
                    print(f"  {ms:8.3f} ms  {short(name)}")


if __name__ == "__main__":
    main()
