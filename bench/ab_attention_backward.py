"""A/B of the GATv2 op's backward choices on one graph (for NOTES.md, not a benchmark row): the
per-block d att sums (GNNIO_ATT_BLOCKS: 1, 2 with the least shared-memory carveout, 0) and the key==value single gradient (GNNIO_KEY_MERGE),
each on and off, op-level fwd+bwd median (gnnio.bench.timing) and the top CUDA kernels of one
fwd+bwd under torch.profiler, peak extra memory."""
import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

import gnnio
from gnnio.bench.timing import median_ms, peak_extra_gib


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="powerlaw-1M-16M")
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    data = gnnio.datasets.load(args.graph)
    dev = torch.device("cuda")
    graph = gnnio.Graph(data.edge_index.to(dev), num_nodes=data.num_nodes)
    gen = torch.Generator(device=dev).manual_seed(0)
    n, H, C = data.num_nodes, 4, 32
    x_l = torch.randn(n, H, C, device=dev, generator=gen).requires_grad_()
    x_r = torch.randn(n, H, C, device=dev, generator=gen).requires_grad_()
    att = torch.randn(H, C, device=dev, generator=gen).requires_grad_()
    gout = torch.randn(n, H, C, device=dev, generator=gen)

    def step():
        out = gnnio.ops.graph_attention(graph, "gatv2", x_l, query=x_r, key=x_l, att=att)
        return torch.autograd.grad(out, (x_l, x_r, att), gout)

    ref = None
    # "2" last: the carveout it sets stays on pass A's kernel for the rest of the process.
    for blocks, merge in [("1", "1"), ("0", "1"), ("0", "0"), ("2", "1")]:
        os.environ["GNNIO_ATT_BLOCKS"], os.environ["GNNIO_KEY_MERGE"] = blocks, merge
        grads = step()
        if ref is None:
            ref = grads
        diff = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(grads, ref))
        ms = median_ms(step, dev, 3, 10)
        mem = peak_extra_gib(step, dev)
        print(f"=== att_blocks={blocks} key_merge={merge}: fwd+bwd {ms:.3f} ms, peak extra "
              f"{mem:.3f} GiB, max rel diff to the first {diff:.2e}")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
