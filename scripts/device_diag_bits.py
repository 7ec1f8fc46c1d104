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


def shared_rows_fp16():
    """Which of the two float16 results is the correctly rounded one, and whether the difference
    follows the data (float32 kernels on float16-representable values; subnormals zeroed)."""
    heads, channels = 4, 256
    dtype = getattr(torch, os.environ.get("DIAG_DTYPE", "float16"))  # float32: a CPU dry run
    graph, query, key, value = make("random", heads, channels, dtype, True, "diag-4-256")
    ei = torch.stack([graph._src, graph._dst]).long().cpu()
    cpu = gnnio.Graph(ei, size=(graph.num_src, graph.num_dst))
    kw = dict(scale=0.2, seed=99)

    def pair(q, v):
        with torch.no_grad():
            out = gnnio.ops.graph_attention(graph, "dot", v, query=q, key=v, **kw)
            vc = copied(v, heads)
            ref = gnnio.ops.graph_attention(graph, "dot", vc, query=q, key=vc, **kw)
        return out, ref
    q, v = query.detach(), value.detach()
    out, ref = pair(q, v)
    with torch.no_grad():
        exact = gnnio.ops.graph_attention(cpu, "dot", v.cpu().double(), query=q.cpu().double(),
                                          key=v.cpu().double(), **kw).to(DEV)
    bad = out != ref
    err = lambda t: (t.double() - exact).abs()[bad]  # noqa: E731
    print(f"fp16: {int(bad.sum())} differ; at them |out - exact| mean {err(out).mean().item():.3g}, "
          f"|ref - exact| mean {err(ref).mean().item():.3g}; out nearer in "
          f"{int((err(out) < err(ref)).sum())}, ref nearer in {int((err(ref) < err(out)).sum())}")
    o32, r32 = pair(q.float(), v.float())
    print(f"fp32 on the same (fp16-representable) values: {int((o32 != r32).sum())} differ")
    print(f"fp16 results rounded from the fp32 ones: out {int((o32.half() != out).sum())}, "
          f"ref {int((r32.half() != ref).sum())} differ")
    tiny = lambda t: t.masked_fill(t.abs() < 6.1e-5, 0)  # noqa: E731 (float16 subnormals)
    print(f"subnormals: query {int((q.abs() < 6.1e-5).sum() - (q == 0).sum())}, value "
          f"{int((v.abs() < 6.1e-5).sum() - (v == 0).sum())}")
    o, r = pair(tiny(q), tiny(v))
    print(f"fp16 with subnormals zeroed: {int((o != r).sum())} differ")


def layouts_grad():
    """test_csc_and_coo_give_the_bits_of_csr's steps (learnable values, x with a gradient), each
    tensor compared with the CSR run's."""
    torch.use_deterministic_algorithms(True)
    from layer_pairs import make_pair
    ei, n = real("cora")
    ei = coalesced_edges(ei, (n, n)).to(DEV)
    for name, opts in [("GraphConv", {}), ("SAGEConv", {}), ("GCNConv", {})]:
        torch.manual_seed(0)
        _, layer = make_pair(name, 9, 6, device=DEV, **opts)
        x = torch.randn(n, 9, device=DEV)
        w = torch.rand(ei.size(1), device=DEV) + 0.5
        runs = {}
        for lay in ("csr", "coo", "csc", "csr"):
            for learnable in (True, False):
                xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_(learnable)
                layer.zero_grad()
                out = layer(xl, adjacency(ei, (n, n), wl, lay))
                out.backward(torch.ones_like(out))
                got = {"out": out.detach(), "x.grad": xl.grad, "w.grad": wl.grad}
                got.update({p: t.grad.clone() for p, t in layer.named_parameters()})
                key = (lay, learnable)
                if key in runs:
                    key = (lay + "-again", learnable)
                runs[key] = got
        for key, got in runs.items():
            base = runs[("csr", key[1])]
            diff = [k for k in got if (got[k] is None) != (base[k] is None)
                    or (got[k] is not None and not torch.equal(got[k], base[k]))]
            print(f"{name} {key}: differs from csr in {diff}")


def scales():
    """The score's product pinned (scaled_score): per-head float16 against its own float32 result
    rounded, and the shared-row kernel against both, at scales whose product is inexact (0.2,
    0.3) and exact (powers of two). All 0 once no build fuses e * scale into e - m."""
    graph, query, _, value = make("random", 4, 256, torch.float16, True, "diag-4-256")
    q, v = query.detach(), value.detach()
    vc = copied(v, 4)
    with torch.no_grad():
        for s in (0.2, 0.3, 0.25, 0.5, 1.0):
            a16 = gnnio.ops.graph_attention(graph, "dot", vc, query=q, key=vc, scale=s, seed=99)
            a32 = gnnio.ops.graph_attention(graph, "dot", vc.float(), query=q.float(), key=vc.float(),
                                            scale=s, seed=99).half()
            b16 = gnnio.ops.graph_attention(graph, "dot", v, query=q, key=v, scale=s, seed=99)
            print(f"scale {s}: per-head fp16 vs its fp32 rounded {int((a16 != a32).sum())}, "
                  f"shared vs per-head fp16 {int((b16 != a16).sum())}, shared vs fp32 rounded "
                  f"{int((b16 != a32).sum())}")


if __name__ == "__main__":
    steps = {"shared_rows": shared_rows, "layouts": layouts, "fp16": shared_rows_fp16,
             "layouts_grad": layouts_grad, "scales": scales}
    for step in [steps[a] for a in sys.argv[1:]] or steps.values():
        try:
            step()
        except Exception as e:  # one failing diagnostic must not hide the other
            print(f"{step.__name__}: {type(e).__name__}: {e}")
