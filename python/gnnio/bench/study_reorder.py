"""The reordering study's rows for one graph (``python -m gnnio.bench.study --study reorder``).

For the original order and each order of ``--orders``: the graph relabelled on the device, then
each kernel timed forward and forward+backward (float32, F features; attention gatv2 with 4 heads
x F/4) on inputs permuted the same way, so every order computes the same numbers in its own node
order. Each row carries its speedup over the original order (same kernel, same process) and the
order's cost. ``reduce-light`` / ``reduce-heavy`` stand for the two parts of the degree-aware
``segment_reduce(max)``, which the op runs in one call and does not time apart: the op on the
edges into the light destinations only (node-parallel kernel) and on those into the heavy ones
only (the split kernel), with the planner's threshold of the original graph. They exist where
the planner splits the forward pass."""
import time

import torch

import gnnio
import gnnio.plan
import gnnio.reorder
from gnnio.bench import perms
from gnnio.bench.study import _sync, graph_stats, measure

OPS = {"spmm": "gcn_propagate", "reduce": "segment_reduce(max)",
       "reduce-light": "segment_reduce(max) light part", "reduce-heavy": "segment_reduce(max) heavy part",
       "attention": "graph_attention(gatv2)"}


def _inputs(n, args, device):
    gen = torch.Generator(device=device).manual_seed(args.seed)
    f, heads = args.features, 4
    rand = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    return dict(x=rand(n, f), gout=rand(n, f), value=rand(n, heads, f // heads),
                query=rand(n, heads, f // heads), att=rand(heads, f // heads),
                gatt=rand(n, heads, f // heads))


def _kernels(graph, ei, n, inp, threshold, wanted):
    """(kernel, callable, output gradient, inputs to differentiate) for each wanted kernel."""
    x, value, query, att = inp["x"], inp["value"], inp["query"], inp["att"]
    out = []
    if "spmm" in wanted:
        out.append(("spmm", lambda: gnnio.ops.gcn_propagate(graph, x), inp["gout"], [x]))
    if "reduce" in wanted:
        out.append(("reduce", lambda: gnnio.ops.segment_reduce(graph, x, "max"), inp["gout"], [x]))
    if threshold is not None and ("reduce-light" in wanted or "reduce-heavy" in wanted):
        heavy = torch.bincount(ei[1], minlength=n) > threshold
        on_heavy = heavy[ei[1]]
        for kernel, mask, split in (("reduce-light", ~on_heavy, False), ("reduce-heavy", on_heavy, True)):
            if kernel in wanted:
                part = gnnio.Graph(ei[:, mask], num_nodes=n)
                out.append((kernel, lambda g=part, s=split: gnnio.ops.segment_reduce(
                    g, x, "max", degree_aware=s), inp["gout"], [x]))
    if "attention" in wanted:
        out.append(("attention", lambda: gnnio.ops.graph_attention(
            graph, "gatv2", value, key=value, query=query, att=att), inp["gatt"], [value, query, att]))
    return out


def run_graph(data, fp, args, result, save, clock):
    device, name, n = args.device, data.name, data.num_nodes
    log = clock.log
    ei0 = data.edge_index.to(device)
    original = gnnio.Graph(ei0, num_nodes=n)
    split = gnnio.plan.plan_reduce(original, torch.float32, True, backward=False)
    threshold = split.light_max_degree if split.heavy_rows is not None else None
    stats = dict(graph_stats(original), reduce_split=split.reason)
    result["graphs"][name] = stats
    if threshold is None and {"reduce-light", "reduce-heavy"} & set(args.kernels):
        log(f"  no heavy rows (max in-degree {stats['max_in_degree']}): no light/heavy parts")
    del original
    base = _inputs(n, args, device)
    baseline = {}
    for order in ("none", *args.orders):
        if order != "none" and clock.over(f"order {order} of {name}"):
            return
        info = dict(order_cost_s=0.0, order_host=None, order_source=None)
        perm = None
        if order != "none":
            found, why = perms.get(args.perms, name, order, data.edge_index, n, fp, args.compute_orders)
            if found is None:
                log(f"  {order}: skipped: {why}")
                result["skipped"].append(dict(graph=name, order=order, why=why))
                save()
                continue
            perm = found.perm
            info = dict(order_cost_s=found.cost_s, order_host=found.host, order_source=found.source)
        _sync(device)
        t0 = time.perf_counter()
        if perm is None:
            ei = ei0
        else:
            p = perm.to(device)
            inv = torch.empty_like(p)
            inv[p] = torch.arange(n, device=device)
            ei = inv[ei0]
        graph = gnnio.Graph(ei, num_nodes=n)
        graph.csr_by_dst, graph.csr_by_src  # noqa: B018 - both CSRs, as a training step builds them
        _sync(device)
        info["relabel_ms"] = (time.perf_counter() - t0) * 1e3
        info["bandwidth"] = gnnio.reorder.bandwidth(graph)
        info["edges_per_tile"] = graph.wsb_stats()["edges_per_tile"]
        # edges whose ends are within 1024 ids: a part of the metis order, 512 KiB of fp32 rows
        info["near_edges"] = ((ei[0] - ei[1]).abs() < 1024).double().mean().item() if ei.numel() else 0.0
        result.setdefault("orders", []).append(dict(graph=name, order=order, **info))
        log(f"  {order}: cost {info['order_cost_s']:.3f} s ({info['order_source'] or '-'}), relabel "
            f"{info['relabel_ms']:.1f} ms, bandwidth {info['bandwidth']:,}, "
            f"{info['edges_per_tile']:.2f} edges/tile, {info['near_edges']:.1%} within 1024 ids")
        if perm is None:
            inp = {k: v.clone() for k, v in base.items()}
        else:
            p = perm.to(device)
            inp = {k: (v if k == "att" else v.index_select(0, p)).clone() for k, v in base.items()}
        for k in ("x", "value", "query", "att"):
            inp[k].requires_grad_()
        for kernel, fn, gout, inputs in _kernels(graph, ei, n, inp, threshold, args.kernels):
            row = dict(graph=name, layer=OPS[kernel], impl="gnnio", kernel=kernel, order=order,
                       dtype="float32", fwd_ms=None, fwd_bwd_ms=None, peak_extra_gib=None, **info)
            try:
                row.update(measure(fn, gout, inputs, device, args.warmup, args.repeat))
            except Exception as e:  # noqa: BLE001 - one failed kernel keeps the others' rows
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if order == "none" and row["fwd_ms"] is not None:
                baseline[kernel] = row["fwd_ms"], row["fwd_bwd_ms"]
            elif kernel in baseline and row["fwd_ms"] is not None:
                row["speedup_fwd"] = baseline[kernel][0] / row["fwd_ms"]
                row["speedup_fwd_bwd"] = baseline[kernel][1] / row["fwd_bwd_ms"]
            result["rows"].append(row)
            save()
            log(f"    {kernel:13s} " + (row.get("error") or
                f"fwd {row['fwd_ms']:.3f} ms  fwd+bwd {row['fwd_bwd_ms']:.3f} ms"
                + (f"  ({row['speedup_fwd']:.2f}x, {row['speedup_fwd_bwd']:.2f}x)"
                   if order != "none" and "speedup_fwd" in row else "")))
        del graph, inp, ei
        if device.type == "cuda":
            torch.cuda.empty_cache()

