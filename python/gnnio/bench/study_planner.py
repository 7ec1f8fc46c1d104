"""The planner study's rows for one graph (``python -m gnnio.bench.study --study planner``).

For each dtype and family: every fixed backend, then the planner's automatic choice through its
own call path (``backend='auto'`` / ``degree_aware=None``), forward and forward+backward. A row
names the fastest fixed backend of each pass and the ratio planner / fastest from the measured
times (the planner runs the same kernel as the fixed backend it picks, timed separately, so the
ratio also shows the run-to-run noise).

- SpMM (``spmm``, sum): ``csr`` (cuSPARSE, or gnnio's row-warp kernel) and ``wsb`` (tensor-core
  tiles). float32 is measured twice: with tf32 off (PyTorch's default; the planner then keeps
  CSR, and WSB, which runs as tf32, is shown but not counted as a fixed backend of that
  precision) and on (``float32+tf32``: the planner's WSB rule applies).
- Reduction (``segment_reduce(max)``): ``degree-aware`` (the planner's light/heavy split forced
  on; on a graph without heavy rows it is the node-parallel kernel) and ``node-parallel``.
- Attention (``graph_attention(gatv2)``, 4 heads x F/4): ``csr-split`` (super-node split on)
  and ``csr`` (no split), the only two backends attention has."""
import torch

import gnnio
import gnnio.plan
from gnnio.bench.study import graph_stats, measure

WITHIN = 1.10
OPS = {"spmm": "spmm", "reduce": "segment_reduce(max)", "attention": "graph_attention(gatv2)"}


def _configs(dtype_name, family, cuda):
    """(label, dtype, fp32_precision or None) of each measurement of a dtype."""
    dtype = getattr(torch, dtype_name)
    if family == "spmm" and dtype == torch.float32 and cuda:
        return [("float32", dtype, "ieee"), ("float32+tf32", dtype, "tf32")]
    return [(dtype_name, dtype, None)]


def _family(family, graph, inp, cuda, label):
    """(fixed backends {name: callable}, planner callable, pick, reason, excluded, note)."""
    x, value, query, att = inp["x"], inp["value"], inp["query"], inp["att"]
    f, dtype = x.size(1), x.dtype
    if family == "spmm":
        fixed = {b: (lambda b=b: gnnio.ops.spmm(graph, x, backend=b)) for b in ("csr", "wsb")}
        planner = lambda: gnnio.ops.spmm(graph, x, backend="auto")  # noqa: E731
        pick = gnnio.plan.spmm_backend(graph, x, "auto")
        plan = graph.plan("spmm", f, dtype, backend="auto")
        excluded = ({"wsb": "runs as tf32 (~1e-3 relative), below the float32 default's "
                     "precision: shown, not counted"} if cuda and label == "float32" else {})
        return fixed, planner, pick, plan.reason, excluded, None
    if family == "reduce":
        fixed = {"degree-aware": lambda: gnnio.ops.segment_reduce(graph, x, "max", degree_aware=True),
                 "node-parallel": lambda: gnnio.ops.segment_reduce(graph, x, "max", degree_aware=False)}
        planner = lambda: gnnio.ops.segment_reduce(graph, x, "max")  # noqa: E731
        plan = graph.plan("segment_reduce(max)", f, dtype)
        same = plan.backend == "node-parallel"
    else:
        attn = lambda split: gnnio.ops.graph_attention(  # noqa: E731
            graph, "gatv2", value, key=value, query=query, att=att, degree_aware=split)
        fixed = {"csr-split": lambda: attn(True), "csr": lambda: attn(False)}
        planner = lambda: attn(None)  # noqa: E731
        plan = graph.plan("graph_attention(gatv2)", value.size(1) * value.size(2), dtype)
        same = plan.backend == "csr"
    pick = plan.backend if cuda else plan.cpu_backend
    split = "degree-aware" if family == "reduce" else "csr-split"
    note = f"no heavy rows: {split!r} runs the unsplit kernel (all three are one kernel)" if same else None
    if not cuda:
        note = "CPU: one kernel (the split is CUDA only)"
    return fixed, planner, pick, plan.reason, {}, note


def _inputs(n, f, dtype, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
    h, c = 4, f // 4
    inp = dict(x=rand(n, f), gout=rand(n, f), value=rand(n, h, c), query=rand(n, h, c),
               att=rand(h, c), gatt=rand(n, h, c))
    for k in ("x", "value", "query", "att"):
        inp[k].requires_grad_()
    return inp


def _measure(fn, family, inp, device, args):
    gout, inputs = ((inp["gatt"], [inp["value"], inp["query"], inp["att"]]) if family == "attention"
                    else (inp["gout"], [inp["x"]]))
    try:
        return measure(fn, gout, inputs, device, args.warmup, args.repeat)
    except Exception as e:  # noqa: BLE001 - a failed backend (out of memory) is recorded
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return dict(fwd_ms=None, fwd_bwd_ms=None, peak_extra_gib=None,
                    error=f"{type(e).__name__}: {str(e)[:300]}")


def verdict(row):
    """Fastest counted fixed backend and planner / fastest for each pass, from the measurements."""
    for key, suffix in (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd_bwd")):
        counted = {b: m[key] for b, m in row["backends"].items()
                   if b not in row["excluded"] and m.get(key) is not None}
        best = min(counted, key=counted.get) if counted else None
        row[f"fastest_{suffix}"] = best
        row[f"fastest_{suffix}_ms"] = counted.get(best)
        ok = best is not None and row[key] is not None
        row[f"ratio_{suffix}"] = row[key] / counted[best] if ok else None
        row[f"within_10pct_{suffix}"] = row[f"ratio_{suffix}"] <= WITHIN if ok else None
    return row


def run_graph(data, fp, args, result, save, clock):
    device, name, n = args.device, data.name, data.num_nodes
    cuda, log = device.type == "cuda", clock.log
    graph = gnnio.Graph(data.edge_index.to(device), num_nodes=n)
    result["graphs"][name] = dict(graph_stats(graph),
                                  edges_per_tile=graph.wsb_stats()["edges_per_tile"])
    saved_precision = torch.backends.cuda.matmul.fp32_precision
    for dtype_name in args.dtypes:
        if clock.over(f"{dtype_name} of {name}"):
            return
        for family in args.families:
            for label, dtype, precision in _configs(dtype_name, family, cuda):
                inp = _inputs(n, args.features, dtype, args.seed, device)
                try:
                    if precision is not None:
                        torch.backends.cuda.matmul.fp32_precision = precision
                    fixed, planner, pick, reason, excluded, note = _family(family, graph, inp, cuda, label)
                    backends = {b: _measure(fn, family, inp, device, args) for b, fn in fixed.items()}
                    mine = _measure(planner, family, inp, device, args)
                finally:
                    torch.backends.cuda.matmul.fp32_precision = saved_precision
                row = verdict(dict(graph=name, layer=OPS[family], impl="gnnio (planner)",
                                   family=family, dtype=label, **mine, backends=backends,
                                   excluded=excluded, planner_pick=pick, plan_reason=reason,
                                   fp32_precision=precision))
                if note:
                    row["note"] = note
                result["rows"].append(row)
                save()
                log(f"  {family:9s} {label:12s} " + "  ".join(
                    f"{b} {_ms(m['fwd_ms'])}/{_ms(m['fwd_bwd_ms'])}" for b, m in backends.items())
                    + f"  planner[{pick}] {_ms(row['fwd_ms'])}/{_ms(row['fwd_bwd_ms'])}  "
                    f"ratio {_x(row['ratio_fwd'])}/{_x(row['ratio_fwd_bwd'])}")
                del inp
                if cuda:
                    torch.cuda.empty_cache()


def _ms(v):
    return "-" if v is None else f"{v:.3f}"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"
