"""Where GAT attention on WSB tiles spends its time (bench/NOTES.md, WSB attention): the
forward and the backward of graph_attention(kind='gat') on the tiles and on the fused CSR kernels,
the operands of the `graph_attention(wsb)` benchmark rows (4 heads x 32, each input needing a
gradient), timed with CUDA events, then every kernel's time by the profiler. Diagnostics, not
benchmark rows (the rows come from `python -m gnnio.bench --layers "graph_attention(wsb)"`).

    python3 scripts/device_diag_wsb_attention.py [graph] [dtype ...]
    python3 scripts/device_diag_wsb_attention.py --ncu [graph] [dtype]  # one tiles fwd+bwd, under ncu
"""
import sys

import torch

import gnnio
from cuda_timing import timed  # scripts/, the script's own folder
from gnnio import datasets
from gnnio.bench.cases import attention_operands


def main():
    args = sys.argv[1:]
    ncu = "--ncu" in args
    args = [a for a in args if a != "--ncu"]
    name = args[0] if args else "blockdiag-1M-16M"
    dtypes = args[1:] or (["float32"] if ncu else ["float32", "bfloat16"])
    d = datasets.load(name)
    graph = gnnio.Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
    graph.wsb_counts(), graph.wsb_counts(transpose=True)
    print(name, graph.wsb_stats())
    for dt in dtypes:
        dtype = getattr(torch, dt)
        gen = torch.Generator(device="cuda").manual_seed(1)
        rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)  # noqa: E731
        value, operands, _ = attention_operands("gat", d.num_nodes, 4, 32, rand)
        inputs = [value, operands["src_score"], operands["dst_score"]]
        for t in inputs:
            t.requires_grad_(True)
        gout = rand(d.num_nodes, 4, 32)

        if ncu:  # the profiler picks the tile kernels by name; one forward and backward
            out = gnnio.ops.graph_attention(graph, "gat", value, backend="wsb", **operands)
            torch.autograd.grad(out, inputs, gout)
            torch.cuda.synchronize()
            continue
        for backend in ("wsb", "csr"):
            def fwd():
                with torch.no_grad():
                    return gnnio.ops.graph_attention(graph, "gat", value, backend=backend, **operands)

            def both():
                out = gnnio.ops.graph_attention(graph, "gat", value, backend=backend, **operands)
                torch.autograd.grad(out, inputs, gout)

            print(f"{dt} {backend}: forward {timed(fwd):.3f} ms, forward+backward {timed(both):.3f} ms")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    both()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10,
                                            max_name_column_width=90))


if __name__ == "__main__":
    main()
