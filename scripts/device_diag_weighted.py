"""Where the weighted reduction's time goes (powerlaw-1M-16M, 128 float32 features): the op
with and without weights, the weights' preparation, and the kernels by the profiler."""
import torch

import gnnio
from cuda_timing import timed  # scripts/, the script's own folder
from gnnio import datasets


d = datasets.load("powerlaw-1M-16M")
g = gnnio.Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
x = torch.randn(d.num_nodes, 128, device="cuda")
w = torch.rand(d.edge_index.size(1), device="cuda") + 0.5
perm = g.csr_by_dst.perm
print("op unweighted", timed(lambda: gnnio.ops.segment_reduce(g, x, "max")))
print("op weighted", timed(lambda: gnnio.ops.segment_reduce(g, x, "max", edge_weight=w)))
print("perm.long()", timed(lambda: perm.long()))
print("w[perm]", timed(lambda: w[perm.long()]))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        gnnio.ops.segment_reduce(g, x, "max")
        gnnio.ops.segment_reduce(g, x, "max", edge_weight=w)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
