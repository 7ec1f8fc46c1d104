"""CPU memory accounting of one forward+backward: what is alive at the peak, and who made it.

    python bench/memory_trace.py --case GATv2Conv --nodes 50K,100K --target 1M
    python bench/memory_trace.py --case GATv2x3-train --ratio 8 --nodes 50K,100K --target 1M
    python bench/memory_trace.py --case all --json bench/results/memory-trace.json

Cases mirror what ``gnnio bench`` measures as ``peak_extra_gib`` on
``powerlaw-<N>-<ratio*N>`` (128 features, fp32): ``GATConv`` / ``GATv2Conv`` /
``TransformerConv`` (128 -> 4 heads x 32, ``torch.autograd.grad(out, [x] + params, gout)``, as
``gnnio.bench.timing.bench_module``) and ``GATv2x3-train`` (the examples' 3-layer GATv2, hidden
4 heads x 64: zero_grad, forward, cross entropy on half the nodes, backward, Adam step, as
``gnnio.bench.training``). One untraced call first fills the Graph's caches (self-loop graph,
transpose, plans) and, for training, Adam's state: what ``before`` holds on the GPU.

**How.** ``torch.profiler`` with ``profile_memory=True`` on the CPU records every allocation
and free of the CPU allocator, with its size, a running total and the op (and Python frame)
it happened under, including the buffers the C++ ops allocate and free internally (GATv2's
per-destination d att partial, delta), which a ``TorchDispatchMode`` with weakref finalizers
would not see (it only sees the outputs of the ops it dispatches). The profiler's
module events (``self_ptr`` = ``id(module)``) name each submodule (``convs.0.lin_l``), and a backward node's
allocations are named after the forward op with the same autograd sequence number ("bwd of
convs.0.lin_l"). Not seen: ``std::vector`` inside the CPU kernels (CPU-only anyway).

**Extrapolation.** The same step at two sizes (same E/N ratio) gives the same sequence of
allocations (checked); each allocation's size is fitted as a + b N and the timeline is
replayed at the target N, so the peak's position and contents are those of the target, not of
the small graph. Then what the CUDA path allocates and the CPU path does not is added from
the code (csrc/torch/cuda/attention_ops_cuda.cpp, csrc/gnnio/attention/cuda_{forward,
backward}.cu): the forward workspace, work items x H x (2 + C) floats, and the backward
workspace, (work items + transposed work items) x H x (1 + 2C) floats, sized from the
planner's split of the target graph (``--cuda-plan``); the per-destination d att partial
[N, H, C] and delta [N, H] are allocated on both. The CUDA caching allocator's rounding
(2 MiB blocks) is ignored.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

import gnnio
import gnnio.nn

GIB = 2 ** 30
CASES = ("GATConv", "GATv2Conv", "TransformerConv", "GATv2x3-train")
FEATURES = 128


def _count(s: str) -> int:
    scale = {"K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}
    s = s.strip().upper()
    return int(float(s[:-1]) * scale[s[-1]]) if s[-1] in scale else int(s)


def _name(n: int) -> str:
    for suffix, v in (("M", 10 ** 6), ("K", 10 ** 3)):
        if n % v == 0:
            return f"{n // v}{suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------------
# the cases


def build_case(case: str, nodes: int, ratio: int, seed: int = 0):
    """(step function, model, info). The step is what the bench's peak_extra_gib measures."""
    data = gnnio.datasets.load(f"powerlaw-{_name(nodes)}-{_name(ratio * nodes)}", seed=seed)
    n, ei = data.num_nodes, data.edge_index
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen).requires_grad_()
    gout = torch.randn(n, FEATURES, generator=gen)
    if case in ("GATConv", "GATv2Conv", "TransformerConv"):
        from gnnio.bench.cases import LAYERS
        module = LAYERS[case].make_gnnio(FEATURES)
        params = [p for p in module.parameters() if p.requires_grad]

        def step():
            out = module(x, ei)
            torch.autograd.grad(out, [x] + params, gout)
        step()  # caches: the Graph of this edge_index, its self-loop graph, transpose, plans
        return step, module, dict(nodes=n, edges=ei.size(1))
    if case == "GATv2x3-train":
        from gnnio.bench import training
        models, _ = training.examples()
        proj = torch.randn(FEATURES, training.NUM_CLASSES, generator=gen)
        perm = torch.randperm(n, generator=gen)
        features = x.detach()
        y = (features @ proj).argmax(1)
        train_idx = perm[: max(1, n // 2)]
        graph = models.graph_input("gnnio", ei, n)
        model = models.build_model(training.MODEL, "gnnio", FEATURES, training.NUM_CLASSES, seed=seed)
        opt = torch.optim.Adam(model.parameters(), lr=training.LR)

        def step():
            opt.zero_grad(set_to_none=True)
            out = model(features, graph)
            F.cross_entropy(out[train_idx], y[train_idx]).backward()
            opt.step()
        step()  # Graph caches and Adam's state, as after the bench's timing steps
        opt.zero_grad(set_to_none=True)
        return step, model, dict(nodes=n, edges=ei.size(1))
    raise ValueError(f"case must be one of {CASES}, got {case!r}")


# ---------------------------------------------------------------------------------------------
# the trace


def _chain(e):
    out = []
    p = e.parent
    while p is not None:
        out.append(p)
        p = p.parent
    return out


def _is_op(e):
    return e.typed[0] == _EventType.TorchOp


def _module_of(chain, qual):
    """The innermost named submodule an event ran in (None outside any)."""
    for p in chain:
        if p.typed[0] == _EventType.PyCall and p.name.startswith("nn.Module"):
            name = qual.get(p.typed[1].module.self_ptr)
            if name:
                return name
    return None


def _where(e, fwd_label, qual):
    """A short producer description of an allocation event."""
    chain = _chain(e)
    module = _module_of(chain, qual)
    node = next((p for p in chain if _is_op(p) and p.name.startswith("autograd::engine::evaluate_function: ")), None)
    ops = []
    for p in chain:
        if _is_op(p) and p.name.startswith("torch::autograd::CppNode"):
            continue
        if not _is_op(p) or p.name.startswith("autograd::engine"):
            if ops:
                break
            continue
        ops.append(p.name)
    op = ops[-1] if ops else "?"
    if len(ops) > 1 and ops[0] != op:
        op = f"{op}/{ops[0]}"
    frame = next((p.name for p in chain if p.typed[0] == _EventType.PyCall and
                  ("gnnio/" in p.name or "examples/" in p.name)), None)
    if frame:
        frame = frame.split("gnnio/")[-1] if "gnnio/" in frame else frame.split("examples/")[-1]
    if node is not None:
        name = node.name.split(": ", 1)[1]
        if "GraphAttentionFunction" in name:
            name = "GraphAttentionFunction"
        seq = node.typed[1].sequence_number
        src = fwd_label.get(seq)
        phase = f"bwd {name}" + (f" of {src}" if src else "")
        return dict(phase="backward", module=src, op=op, where=f"{phase}: {op}")
    return dict(phase="forward", module=module, op=op,
                where=f"{module or frame or '?'}: {op}")


def trace(step, model):
    """Runs step() under the profiler: (events, baseline bytes). events: chronological dicts
    with kind 'alloc'/'free', id, bytes (positive), producer fields."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        step()
    roots = prof.profiler.kineto_results.experimental_event_tree()
    qual = {id(m): name for name, m in model.named_modules() if name}
    allocs, ops = [], []

    def walk(e):
        if e.typed[0] == _EventType.Allocation:
            allocs.append(e)
        elif _is_op(e):
            ops.append(e)
        for c in e.children:
            walk(c)
    for r in roots:
        walk(r)
    # Forward ops that record autograd history: sequence number -> the module they ran in.
    fwd_label = {}
    for e in ops:
        seq = e.typed[1].sequence_number
        if seq < 0 or e.name.startswith("autograd::") or "Backward" in e.name or seq in fwd_label:
            continue
        chain = _chain(e)
        if any(_is_op(p) and p.name.startswith("autograd::engine") for p in chain):
            continue
        mod = _module_of(chain, qual)
        if mod is None:
            frame = next((p.name for p in chain if p.typed[0] == _EventType.PyCall and
                          "gnnio/" in p.name), "?")
            mod = frame.split("gnnio/")[-1]
        fwd_label[seq] = f"{mod} ({e.name})"
    allocs.sort(key=lambda e: (e.start_time_ns, e.typed[1].total_allocated))
    events, names, baseline = [], {}, None
    for e in allocs:
        f = e.typed[1]
        if f.device.type != "cpu":
            continue
        if baseline is None:
            baseline = f.total_allocated - f.alloc_size
        key = f.ptr  # allocation_id is not filled on the CPU; a pointer is live once at a time
        if f.alloc_size > 0:
            info = _where(e, fwd_label, qual)
            names[key] = info
            events.append(dict(kind="alloc", id=key, bytes=f.alloc_size, **info))
        else:
            info = names.pop(key, None) or dict(phase="before", module=None, op="?",
                                                where="allocated before the step")
            events.append(dict(kind="free", id=key, bytes=-f.alloc_size, **info))
    return events, baseline or 0


def timeline(events):
    """(peak extra bytes, index of the peak event, live allocations at the peak, curve).
    Frees of buffers allocated before the step count too (as in the CUDA extra peak)."""
    total, peak, at = 0, 0, -1
    live = {}
    curve = []
    best = {}
    for i, ev in enumerate(events):
        if ev["kind"] == "alloc":
            total += ev["bytes"]
            live[ev["id"]] = ev
        else:
            total -= ev["bytes"]
            live.pop(ev["id"], None)
        curve.append(total)
        if total > peak:
            peak, at, best = total, i, dict(live)
    return peak, at, list(best.values()), curve


def extrapolate(ev1, n1, ev2, n2, target):
    """Events of the target size: each size fitted as a + b N from the two traces."""
    if len(ev1) != len(ev2) or any(a["kind"] != b["kind"] or a["where"] != b["where"]
                                   for a, b in zip(ev1, ev2)):
        raise RuntimeError("the two traces differ in their sequence of allocations; "
                           "pick sizes whose code paths match")
    remap = {}
    out = []
    for a, b in zip(ev1, ev2):
        slope = (b["bytes"] - a["bytes"]) / (n2 - n1)
        size = max(0, round(a["bytes"] + slope * (target - n1)))
        remap.setdefault(b["id"], a["id"])
        ev = dict(b)
        ev["bytes"] = size
        ev["per_node"] = slope
        out.append(ev)
    return out


def _shape(ev, nodes):
    """'N x 128 fp32'-style reading of a buffer size (a guess from bytes per node)."""
    per = ev.get("per_node")
    b = ev["bytes"]
    if per is None:
        per = b / nodes
    if per <= 0.5:
        return "const"
    words = per / 4
    if abs(words - round(words)) < 1e-6:
        return f"N x {round(words)} x 4B"
    return f"{per:.2f} B/node"


# ---------------------------------------------------------------------------------------------
# CUDA-only buffers (from the code)


def cuda_extras(case, nodes, ratio, seed=0):
    """[(what, bytes)] that the CUDA path allocates inside graph_attention(_backward) and the CPU
    path does not, for the attention layers of the case on the target graph."""
    from gnnio.plan import plan_attention
    data = gnnio.datasets.load(f"powerlaw-{_name(nodes)}-{_name(ratio * nodes)}", seed=seed)
    graph = gnnio.Graph(data.edge_index, num_nodes=data.num_nodes)
    looped = graph.with_self_loops(data.num_nodes)[0] if case != "TransformerConv" else graph
    plan = plan_attention(looped, 128, backward=True)
    items = 0 if plan.heavy_items is None else plan.heavy_items.size(0)
    items_t = 0 if plan.heavy_src_items is None else plan.heavy_src_items.size(0)
    shapes = {"GATConv": [(4, 32)], "GATv2Conv": [(4, 32)], "TransformerConv": [(4, 32)],
              "GATv2x3-train": [(4, 64), (4, 64), (1, 7)]}[case]
    out = []
    for h, c in shapes[-2:-1] or shapes[:1]:  # the widest layer (the train model's hidden one)
        out.append((f"fwd workspace ({items} items x {h} x (2+{c}) fp32), during the forward kernel",
                    items * h * (2 + c) * 4, "forward"))
        out.append((f"bwd workspace (({items}+{items_t}) items x {h} x (1+2x{c}) fp32), during the "
                    "backward kernels", (items + items_t) * h * (1 + 2 * c) * 4, "backward"))
    return out, plan.reason


# ---------------------------------------------------------------------------------------------


def report(case, events, nodes, title, extras=None):
    peak, at, live, curve = timeline(events)
    lines = [f"### {case}: {title}", "",
             f"extra peak {peak / GIB:.3f} GiB at event {at} of {len(events)} "
             f"(during: {events[at]['where'] if at >= 0 else '-'})", "",
             "| buffer (producer) | shape | MiB |", "|---|---|---|"]
    groups = defaultdict(lambda: [0, 0])
    for ev in sorted(live, key=lambda e: -e["bytes"]):
        if ev["bytes"] >= 0.004 * peak:
            lines.append(f"| {ev['where']} | {_shape(ev, nodes)} | {ev['bytes'] / 2**20:.1f} |")
        else:
            groups["smaller buffers"][0] += ev["bytes"]
            groups["smaller buffers"][1] += 1
    for k, (b, c) in groups.items():
        lines.append(f"| {c} {k} | - | {b / 2**20:.1f} |")
    freed_before = sum(ev["bytes"] for ev in events[: at + 1]
                       if ev["kind"] == "free" and ev["phase"] == "before")
    if freed_before:
        lines.append(f"| (freed buffers that existed before the step) | - | {-freed_before / 2**20:.1f} |")
    total = peak
    if extras:
        ev = events[at] if at >= 0 else dict(phase="forward", where="", op="")
        during = {"forward": ev["phase"] == "forward" and "graph_attention" in ev["op"],
                  "backward": ev["phase"] == "backward" and "GraphAttentionFunction" in ev["where"]}
        for what, b, when in extras:
            if during[when]:
                lines.append(f"| CUDA only: {what} | - | {b / 2**20:.1f} |")
                total += b
            else:
                lines.append(f"| (CUDA only, not at this peak: {what}) | - | {b / 2**20:.1f} |")
        lines.append("")
        lines.append(f"predicted CUDA extra peak: **{total / GIB:.2f} GiB**")
    lines.append("")
    return "\n".join(lines), dict(peak_gib=peak / GIB, cuda_peak_gib=total / GIB,
                                  live=[dict(where=e["where"], bytes=e["bytes"], shape=_shape(e, nodes))
                                        for e in sorted(live, key=lambda e: -e["bytes"])])


def run_case(case, sizes, ratio, target, cuda_plan, seed=0):
    traces = []
    for n in sizes:
        step, model, info = build_case(case, n, ratio, seed)
        events, _ = trace(step, model)
        traces.append((n, events))
        del step, model
    n1, ev1 = traces[0]
    out_md, out_json = [], {}
    md, js = report(case, ev1, n1, f"powerlaw-{_name(n1)}-{_name(ratio * n1)} (measured on the CPU)")
    out_md.append(md)
    out_json[f"measured_{_name(n1)}"] = js
    if len(traces) > 1 and target:
        n2, ev2 = traces[1]
        md, js = report(case, ev2, n2, f"powerlaw-{_name(n2)}-{_name(ratio * n2)} (measured on the CPU)")
        out_md.append(md)
        out_json[f"measured_{_name(n2)}"] = js
        ext = extrapolate(ev1, n1, ev2, n2, target)
        extras = None
        if cuda_plan:
            extras, reason = cuda_extras(case, target, ratio, seed)
            out_md.append(f"CUDA plan of the target graph: {reason}\n")
        md, js = report(case, ext, target, f"extrapolated to powerlaw-{_name(target)}-"
                        f"{_name(ratio * target)} (from {_name(n1)} and {_name(n2)})", extras)
        out_md.append(md)
        out_json[f"extrapolated_{_name(target)}"] = js
    return "\n".join(out_md), out_json


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", default="all", help=f"one of {', '.join(CASES)}, or 'all'")
    p.add_argument("--nodes", default="50K,100K", help="one or two node counts (two: extrapolate)")
    p.add_argument("--ratio", type=int, default=None,
                   help="edges per node (default 16; 8 for GATv2x3-train, as powerlaw-1M-8M)")
    p.add_argument("--target", default="1M", help="node count to extrapolate to ('' for none)")
    p.add_argument("--cuda-plan", action=argparse.BooleanOptionalAction, default=True,
                   help="add the CUDA workspaces, sized from the planner on the target graph")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the tables' numbers here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = CASES if args.case == "all" else tuple(args.case.split(","))
    sizes = [_count(s) for s in args.nodes.split(",")]
    target = _count(args.target) if args.target else None
    result = {}
    for case in cases:
        ratio = args.ratio or (8 if case == "GATv2x3-train" else 16)
        md, js = run_case(case, sizes, ratio, target, args.cuda_plan)
        print(md, flush=True)
        result[case] = js
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
