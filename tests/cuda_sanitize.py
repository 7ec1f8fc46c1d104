"""Exercises every CUDA kernel (SpMM, SDDMM, WSB SpMM, segment reduce, graph attention) once on awkward shapes, for compute-sanitizer (memcheck):
empty graph, isolated nodes, a hub, bipartite, odd widths, half types. Run on a GPU machine."""
import torch

import gnnio

assert torch.cuda.is_available()
torch.manual_seed(0)
cases = [
    (torch.empty(2, 0, dtype=torch.long), (4, 4)),
    (torch.tensor([[0, 1], [1, 1]]), (6, 6)),
    (torch.stack([torch.randint(3000, (50_000,)), torch.zeros(50_000, dtype=torch.long)]), (3000, 3000)),
    (torch.stack([torch.zeros(50_000, dtype=torch.long), torch.randint(3000, (50_000,))]), (3000, 3000)),
    (torch.stack([torch.randint(70, (900,)), torch.randint(11, (900,))]), (70, 11)),
]
failures = 0
for ei, size in cases:
    g = gnnio.Graph(ei.cuda(), size=size)
    for width in (1, 3, 33, 130):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            try:
                x = torch.randn(size[0], width, device="cuda", dtype=dtype, requires_grad=True)
                w = torch.rand(ei.size(1), device="cuda", dtype=dtype, requires_grad=True)
                out = gnnio.ops.spmm(g, x, w, "mean")
                out.backward(torch.randn_like(out))
                for reduce in ("max", "min"):
                    for degree_aware in (True, False):
                        out = gnnio.ops.segment_reduce(g, x, reduce, degree_aware=degree_aware)
                        out.backward(torch.randn_like(out))
                torch.cuda.synchronize()
            except RuntimeError as e:
                failures += 1
                print(f"FAILED size={size} E={ei.size(1)} width={width} {dtype}: {str(e)[:300]}")

for ei, size in cases:
    g = gnnio.Graph(ei.cuda(), size=size)
    for width in (1, 3, 33, 130):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            try:  # tensor-core WSB SpMM, its transpose and the tile gradient
                x = torch.randn(size[0], width, device="cuda", dtype=dtype, requires_grad=True)
                w = torch.rand(ei.size(1), device="cuda", dtype=dtype, requires_grad=True)
                out = gnnio.ops.spmm(g, x, w, "mean", backend="wsb")
                out.backward(torch.randn_like(out))
                torch.cuda.synchronize()
            except RuntimeError as e:
                failures += 1
                print(f"FAILED wsb size={size} E={ei.size(1)} width={width} {dtype}: {str(e)[:300]}")


def attention_operands(kind, ns, nd, e, heads, channels, dtype):
    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    if kind == "gat":
        return dict(src_score=r(ns, heads), dst_score=r(nd, heads), edge_score=r(e, heads))
    ops = dict(key=r(ns, heads, channels), query=r(nd, heads, channels), edge_key=r(e, heads, channels))
    if kind == "gatv2":
        ops["att"] = r(heads, channels)
    else:
        ops["edge_value"] = r(e, heads, channels)
    return ops


for ei, size in cases:
    g = gnnio.Graph(ei.cuda(), size=size)
    for channels in (1, 3, 33, 130):
        for dtype in (torch.float32, torch.bfloat16):
            for kind in ("gat", "gatv2", "dot"):
                try:
                    v = torch.randn(size[0], 2, channels, device="cuda", dtype=dtype, requires_grad=True)
                    ops = attention_operands(kind, size[0], size[1], ei.size(1), 2, channels, dtype)
                    out, w = gnnio.ops.graph_attention(g, kind, v, **ops, dropout=0.2, seed=1,
                                                       return_weights=True)
                    out.backward(torch.randn_like(out))
                    torch.cuda.synchronize()
                except RuntimeError as e:
                    failures += 1
                    print(f"FAILED attention {kind} size={size} C={channels} {dtype}: {str(e)[:300]}")
print(f"sanitize cases ran, {failures} failed")
raise SystemExit(1 if failures else 0)
