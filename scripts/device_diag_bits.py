"""Diagnostics for two bit-equality claims that failed on the H200 (2026-12-05), run on the device:
(1) float16 shared-row forward against the per-head kernel on rows copied per head (4 x 256,
2 x 200); (2) a sparse adj_t in CSR, COO and CSC giving different layer outputs on CUDA under
torch.use_deterministic_algorithms. Prints where the results differ, not a verdict."""
import os
import sys

import torch

DEV = os.environ.get("DIAG_DEVICE", "cuda")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import gnnio  # noqa: E402
import gnnio.nn  # noqa: E402
from gnnio.adjacency import adjacency_values  # noqa: E402
from graphs import real  # noqa: E402
from test_attention_shared_kv_cuda import copied, make  # noqa: E402
from test_sparse_adjacency import adjacency, coalesced_edges  # noqa: E402


def ulps(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs() / torch.finfo(torch.float16).eps / b.abs().clamp_min(1e-30)).max().item()


def shared_rows():
    for heads, channels in [(4, 256), (2, 200), (4, 128)]:
        for dtype in (torch.float16, torch.bfloat16):
            graph, query, key, value = make("random", heads, channels, dtype, True, f"diag-{heads}-{channels}")
            kw = dict(scale=0.2, seed=99)
            with torch.no_grad():
                out = gnnio.ops.graph_attention(graph, "dot", value, query=query, key=key, **kw)
                vc = copied(value, heads)
                ref = gnnio.ops.graph_attention(graph, "dot", vc, query=query, key=vc, **kw)
                ref_sep = gnnio.ops.graph_attention(graph, "dot", vc, query=query, key=vc.clone(), **kw)
            bad = out != ref
            print(f"{heads}x{channels} {dtype}: out!=ref {int(bad.sum())}/{bad.numel()}, "
                  f"ref!=ref_separate_key {int((ref != ref_sep).sum())}, "
                  f"max |d| {(out.float() - ref.float()).abs().max().item():.3g}")
            if bad.any():
                idx = bad.nonzero()
                rows = idx[:, 0].unique()
                print("  rows", rows[:10].tolist(), "of", rows.numel(), "| heads", idx[:, 1].unique().tolist(),
                      "| channel lanes", (idx[:, 2] // 8).unique()[:12].tolist(),
                      "| degrees", graph.in_degree()[rows[:10].long()].tolist())
                r = rows[0]
                print("  row", int(r), "out", out[r, idx[0, 1], :6].tolist(), "ref", ref[r, idx[0, 1], :6].tolist())


def layouts():
    torch.use_deterministic_algorithms(True)
    ei, n = real("cora")
    ei = coalesced_edges(ei, (n, n)).to(DEV)
    torch.manual_seed(0)
    w = torch.rand(ei.size(1), device=DEV) + 0.5
    x = torch.randn(n, 6, device=DEV)
    adjs = {lay: adjacency(ei, (n, n), w, lay) for lay in ("csr", "coo", "csc")}
    graphs = {lay: gnnio.Graph(a) for lay, a in adjs.items()}
    base = graphs["csr"]
    for lay, g in graphs.items():
        d = g.csr_by_dst
        same = [torch.equal(d.rowptr, base.csr_by_dst.rowptr), torch.equal(d.col, base.csr_by_dst.col)]
        vals = adjacency_values(adjs[lay])
        slot_w = vals[d.perm.long()]
        same.append(torch.equal(slot_w, adjacency_values(adjs["csr"])[base.csr_by_dst.perm.long()]))
        print(f"{lay}: rowptr/col/slot weights equal to csr's: {same}; index dtype {d.rowptr.dtype}, "
              f"CUDA backend: {g.plan('spmm', features=6).backend}")
    outs = {}
    for lay, g in graphs.items():
        outs[lay] = gnnio.ops.spmm(g, x, adjacency_values(adjs[lay]))
        outs[lay + "-csr"] = gnnio.ops.spmm(g, x, adjacency_values(adjs[lay]), backend="csr")
    for k, v in outs.items():
        print(f"spmm {k}: equal to csr's {torch.equal(v, outs['csr'])}, max |d| {(v - outs['csr']).abs().max().item():.3g}")
    layer = gnnio.nn.GraphConv(9, 6).to(DEV)
    x9 = torch.randn(n, 9, device=DEV)
    lo = {lay: layer(x9, a) for lay, a in adjs.items()}
    lo["csr-again"] = layer(x9, adjs["csr"])
    lo["edge_index"] = layer(x9, ei, w)
    for k, v in lo.items():
        print(f"GraphConv {k}: equal to csr's {torch.equal(v, lo['csr'])}, max |d| {(v - lo['csr']).abs().max().item():.3g}")


if __name__ == "__main__":
    for step in (shared_rows, layouts):
        try:
            step()
        except Exception as e:  # one failing diagnostic must not hide the other
            print(f"{step.__name__}: {type(e).__name__}: {e}")
