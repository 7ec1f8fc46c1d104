"""The planner study's rows for one graph (``python -m gnnio.bench.study --study planner``).

For each dtype and family: every fixed backend and the planner's automatic choice through the
default call path (``backend=None`` / ``degree_aware=None``: the environment read and the
memoised plan included, as a user's call), forward and forward+backward. The candidates of one
(graph, family, dtype, pass) are timed the same way and interleaved (:func:`measure_interleaved`:
round r takes one sample of each, starting from a rotating candidate; the median of the rounds),
so host drift during the comparison lands on all of them alike. A row names the fastest fixed
backend of each pass, the ratio planner / fastest, and splits it as (planner / its pick run as a
fixed backend) x (pick / fastest): a miss is ``same kernel`` (the planner ran the fastest
kernel: per-call cost or noise) or ``other kernel`` (a wrong choice).

The forward pass is timed without autograd (``torch.no_grad()``: an inference call) and the
forward+backward pass as a training call: the planner sees which one a call is (whether a
backward follows: ``training`` in :func:`gnnio.plan.spmm_backend`) and may choose differently
for each, so a row records its pick for each pass (``planner_pick_fwd``, ``planner_pick``).

- SpMM (``spmm``, sum): ``csr`` (cuSPARSE, or gnnio's row-warp kernel) and ``wsb`` (tensor-core
  tiles). float32 is measured twice: with tf32 off (PyTorch's default; the planner then keeps
  CSR, and WSB, which runs as tf32, is shown but not counted as a fixed backend of that
  precision) and on (``float32+tf32``: the planner's WSB rule applies).
- Reduction (``segment_reduce(max)``): ``degree-aware`` (the planner's light/heavy split forced
  on; on a graph without heavy rows it is the node-parallel kernel) and ``node-parallel``.
- Attention (``graph_attention(gatv2)``, 4 heads x F/4): ``csr-split`` (super-node split on)
  and ``csr`` (no split), GATv2's two backends.
- GAT attention (``attention-gat``: ``graph_attention(gat)``, 4 heads x F/4, source and
  destination scores): ``csr-split``, ``csr`` and ``wsb`` (the 16 x 16 tiles, on CUDA tensor
  cores; float32 runs as tf32 there, so with float32 it is shown, not counted, as SpMM's).
  ``auto`` picks ``wsb`` by gnnio.plan.attention_backend's rule (edges per tile, measured on
  the H200): this family's rows check it.

With ``--device-time`` (CUDA) each candidate of a pass is also captured in a CUDA graph and its
replays timed the same way (interleaved, CUDA events): the GPU's time alone, without the host's
per-call work (Python, dispatch, cuSPARSE's host side), which on the small graphs is most of a
call and moves 2-5x between machines (bench/NOTES.md, "Planner study"). A row then also has
``fwd_device_ms`` / ``fwd_bwd_device_ms`` for the planner and each backend and their own
verdict (``ratio_fwd_device``, ...). The planner's replay runs its pick's kernels."""
import gc
import statistics
import time

import torch

import gnnio
import gnnio.plan
from gnnio.bench.study import FEW_SAMPLES_MS, ONE_SAMPLE_MS, graph_stats
from gnnio.bench.timing import sample_ms

WITHIN = 1.10
OPS = {"spmm": "spmm", "reduce": "segment_reduce(max)", "attention": "graph_attention(gatv2)",
       "attention-gat": "graph_attention(gat)"}


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
        planner = lambda: gnnio.ops.spmm(graph, x)  # noqa: E731 - the default path
        picks = {t: gnnio.plan.spmm_backend(graph, x, training=t) for t in (False, True)}
        plan = graph.plan("spmm", f, dtype)
        excluded = ({"wsb": "runs as tf32 (~1e-3 relative), below the float32 default's "
                     "precision: shown, not counted"} if cuda and label == "float32" else {})
        return fixed, planner, picks, plan.reason, excluded, None
    if family == "reduce":
        fixed = {"degree-aware": lambda: gnnio.ops.segment_reduce(graph, x, "max", degree_aware=True),
                 "node-parallel": lambda: gnnio.ops.segment_reduce(graph, x, "max", degree_aware=False)}
        planner = lambda: gnnio.ops.segment_reduce(graph, x, "max")  # noqa: E731
        plans = {t: graph.plan("segment_reduce(max)", f, dtype, training=t) for t in (False, True)}
        same = all(p.backend == "node-parallel" for p in plans.values())
    elif family == "attention-gat":
        src, dst = inp["src_score"], inp["dst_score"]
        gat = lambda **kw: gnnio.ops.graph_attention(  # noqa: E731
            graph, "gat", value, src_score=src, dst_score=dst, **kw)
        fixed = {"csr-split": lambda: gat(degree_aware=True, backend="csr"),
                 "csr": lambda: gat(degree_aware=False, backend="csr"),
                 "wsb": lambda: gat(backend="wsb")}
        planner = gat  # the default path
        plans = {t: graph.plan("graph_attention(gat)", value.size(1) * value.size(2), dtype,
                               training=t) for t in (False, True)}
        picks = {t: p.backend if cuda else p.cpu_backend for t, p in plans.items()}
        excluded = ({"wsb": "runs as tf32 (~1e-3 relative), below the float32 default's "
                     "precision: shown, not counted"} if cuda and dtype == torch.float32 else {})
        # WSB is a kernel of its own: a miss against it is a choice (csr-split and csr run one
        # kernel where there are no heavy rows, and always on the CPU).
        return fixed, planner, picks, plans[True].reason, excluded, None
    else:
        attn = lambda split: gnnio.ops.graph_attention(  # noqa: E731
            graph, "gatv2", value, key=value, query=query, att=att, degree_aware=split)
        fixed = {"csr-split": lambda: attn(True), "csr": lambda: attn(False)}
        planner = lambda: attn(None)  # noqa: E731
        plans = {t: graph.plan("graph_attention(gatv2)", value.size(1) * value.size(2), dtype,
                               training=t) for t in (False, True)}
        same = all(p.backend == "csr" for p in plans.values())
    picks = {t: p.backend if cuda else p.cpu_backend for t, p in plans.items()}
    plan = plans[True]
    split = "degree-aware" if family == "reduce" else "csr-split"
    note = f"no heavy rows: {split!r} runs the unsplit kernel (all three are one kernel)" if same else None
    if not cuda:
        note = "CPU: one kernel (the split is CUDA only)"
    return fixed, planner, picks, plan.reason, {}, note


def _inputs(n, f, dtype, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
    h, c = 4, f // 4
    inp = dict(x=rand(n, f), gout=rand(n, f), value=rand(n, h, c), query=rand(n, h, c),
               att=rand(h, c), gatt=rand(n, h, c), src_score=rand(n, h), dst_score=rand(n, h))
    for k in ("x", "value", "query", "att", "src_score", "dst_score"):
        inp[k].requires_grad_()
    return inp


MIN_SAMPLE_MS = 5.0  # as gnnio.bench.timing.median_ms: a short call is repeated inside a sample
# A short call is host-bound (tens of us of Python and dispatch around a few us of kernel), and
# its samples spread by ~10% (two forced runs of one kernel differed by up to 1.15x at 2cbb6b2
# and da5855b): it takes this many times more samples (each only MIN_SAMPLE_MS long).
SHORT_CALL_SAMPLES = 3


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_interleaved(fns, device, warmup, repeat):
    """{name: {ms, samples, inner} or {error}} for callables timed the same way, interleaved.

    Each gets one untimed call (caches) and a timed probe; from the probe its calls per sample
    (``inner``: enough for MIN_SAMPLE_MS on a GPU, at most 200; 1 on the CPU, where the study runs only as its tests) and
    its sample count: above ONE_SAMPLE_MS the probe is the measurement, above FEW_SAMPLES_MS 3
    samples. Then ``warmup`` rounds of one call each, and ``repeat`` rounds of one sample each:
    the rotations of the candidates' order, then of the reversed order, and so on, so that each
    one follows each other one about equally often (with one fixed cyclic order the planner
    followed the WSB sample in 7 of 10 rounds, and a short call right after several ms of
    tensor-core work ran 2-7 us slower on the H200); a short call (inner > 1) makes one untimed
    call first; it takes SHORT_CALL_SAMPLES x ``repeat`` samples. Python's garbage collector is
    off while the samples are taken (a collection inside one sample of a host-bound call is one
    of the spikes it otherwise measures). The median of each one's samples."""
    names, out, samples, inner, want = list(fns), {}, {}, {}, {}
    for name in names:
        try:
            fns[name]()
            _sync(device)
            t0 = time.perf_counter()
            fns[name]()
            _sync(device)
        except Exception as e:  # noqa: BLE001 - a failed backend (out of memory) is recorded
            if device.type == "cuda":
                torch.cuda.empty_cache()
            out[name] = dict(ms=None, error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        probe = (time.perf_counter() - t0) * 1e3
        if probe > ONE_SAMPLE_MS:
            out[name] = dict(ms=probe, samples=1, inner=1)
            continue
        inner[name] = (max(1, min(200, int(MIN_SAMPLE_MS / max(probe, 1e-3))))
                       if device.type == "cuda" else 1)
        want[name] = (min(3, repeat) if probe > FEW_SAMPLES_MS
                      else repeat * (SHORT_CALL_SAMPLES if inner[name] > 1 else 1))
        samples[name] = []
    live = [n for n in names if n in samples]
    for _ in range(warmup):
        for name in live:
            fns[name]()
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(max(want.values(), default=0)):
            order = live if (r // max(len(live), 1)) % 2 == 0 else live[::-1]
            for i in range(len(order)):
                name = order[(r + i) % len(order)]
                if len(samples[name]) < want[name]:
                    if inner[name] > 1:
                        fns[name]()
                    samples[name].append(sample_ms(fns[name], inner[name], device))
    finally:
        if gc_was_on:
            gc.enable()
    for name in live:
        out[name] = dict(ms=statistics.median(samples[name]), samples=len(samples[name]),
                         inner=inner[name])
    return out


def capture(fn, device):
    """fn captured in a CUDA graph (after two eager calls on a side stream, as CUDA graphs need:
    caches and workspaces exist before capture): returns the graph's replay. The capture runs on
    ``device`` and on a stream of its own, and the caller's current stream is restored whatever
    happens: a capture invalidated by the call (a host read, a sync) makes torch.cuda.graph's
    exit raise before it restores the stream."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.device(device), torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
            fn()
    finally:
        torch.cuda.set_stream(current)
    return graph.replay


def measure_replays(fns, device, warmup, repeat):
    """measure_interleaved over the CUDA-graph replays of fns: {name: {ms, samples, inner} or
    {error}} (a capture that fails, as one that reads the host inside the call would, is an
    error of that candidate, not of the study)."""
    replays, out = {}, {}
    for name, fn in fns.items():
        try:
            replays[name] = capture(fn, device)
        except Exception as e:  # noqa: BLE001 - recorded per candidate
            torch.cuda.synchronize(device)
            out[name] = dict(ms=None, error=f"capture: {type(e).__name__}: {str(e)[:300]}")
    out.update(measure_interleaved(replays, device, warmup, repeat))
    del replays
    torch.cuda.synchronize(device)
    return out


def _measure_family(fixed, planner, family, inp, device, args):
    """({backend: measurement}, planner's measurement): forward, then forward+backward, each
    with every fixed backend and the planner interleaved."""
    gout, inputs = {
        "attention": (inp["gatt"], [inp["value"], inp["query"], inp["att"]]),
        "attention-gat": (inp["gatt"], [inp["value"], inp["src_score"], inp["dst_score"]]),
    }.get(family, (inp["gout"], [inp["x"]]))
    fns = {**{("fixed", b): fn for b, fn in fixed.items()}, ("planner", None): planner}
    res = {k: dict(fwd_ms=None, fwd_bwd_ms=None, peak_extra_gib=None) for k in fns}
    device_time = getattr(args, "device_time", False) and device.type == "cuda"
    def inference(fn):
        def call():
            with torch.no_grad():
                return fn()
        return call

    for key, wrap in (("fwd_ms", inference),
                      ("fwd_bwd_ms", lambda fn: lambda: torch.autograd.grad(fn(), inputs, gout))):
        got = measure_interleaved({k: wrap(fn) for k, fn in fns.items()}, device, args.warmup,
                                  args.repeat)
        for k, m in got.items():
            res[k][key] = m["ms"]
            if "error" in m:
                res[k].setdefault("error", m["error"])
            else:
                res[k][f"{key[:-3]}_samples"] = m["samples"]
        if device_time:
            dev_key = f"{key[:-3]}_device_ms"
            got = measure_replays({k: wrap(fn) for k, fn in fns.items() if res[k][key] is not None},
                                  device, args.warmup, args.repeat)
            for k, m in got.items():
                res[k][dev_key] = m["ms"]
                if "error" in m:
                    res[k].setdefault("device_error", m["error"])
    return {b: res["fixed", b] for b in fixed}, res["planner", None]


def pass_pick(row, suffix):
    """The planner's pick for a pass ('fwd' or 'fwd_bwd', or their '_device' timings): rows
    before e86a9a0 hold one pick."""
    forward = suffix in ("fwd", "fwd_device")
    return row.get("planner_pick_fwd" if forward else "planner_pick", row.get("planner_pick"))


# (time key, suffix of the verdict's keys): host-inclusive timings, then the device-only ones.
PASSES = (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd_bwd"))
DEVICE_PASSES = (("fwd_device_ms", "fwd_device"), ("fwd_bwd_device_ms", "fwd_bwd_device"))


def verdict(row):
    """Fastest counted fixed backend and planner / fastest for each pass, from the measurements,
    and the split of that ratio: ``pick_ratio`` = the planner's pick run as a fixed backend /
    fastest (the choice's cost), ``overhead_ratio`` = planner / its pick (the planner's per-call
    cost and noise), ``miss`` = None (within 10%), 'same kernel' (the pick runs the fastest's
    kernel: the same name, or a row whose backends all run one kernel) or 'other kernel'.
    Rows with device-only timings (--device-time) get the same keys for them, suffixed _device."""
    passes = PASSES + (DEVICE_PASSES if "fwd_device_ms" in row or "fwd_bwd_device_ms" in row else ())
    for key, suffix in passes:
        counted = {b: m[key] for b, m in row["backends"].items()
                   if b not in row["excluded"] and m.get(key) is not None}
        best = min(counted, key=counted.get) if counted else None
        row[f"fastest_{suffix}"] = best
        row[f"fastest_{suffix}_ms"] = counted.get(best)
        ok = best is not None and row.get(key) is not None
        row[f"ratio_{suffix}"] = row[key] / counted[best] if ok else None
        row[f"within_10pct_{suffix}"] = row[f"ratio_{suffix}"] <= WITHIN if ok else None
        pick = pass_pick(row, suffix)
        pick_ms = row["backends"].get(pick, {}).get(key) if pick is not None else None
        row[f"pick_ratio_{suffix}"] = pick_ms / counted[best] if ok and pick_ms else None
        row[f"overhead_ratio_{suffix}"] = row[key] / pick_ms if ok and pick_ms else None
        miss = None
        if ok and not row[f"within_10pct_{suffix}"]:
            miss = "same kernel" if pick == best or row.get("one_kernel") else "other kernel"
        row[f"miss_{suffix}"] = miss
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
                    fixed, planner, picks, reason, excluded, note = _family(family, graph, inp, cuda, label)
                    backends, mine = _measure_family(fixed, planner, family, inp, device, args)
                finally:
                    torch.backends.cuda.matmul.fp32_precision = saved_precision
                row = verdict(dict(graph=name, layer=OPS[family], impl="gnnio (planner)",
                                   family=family, dtype=label, **mine, backends=backends,
                                   excluded=excluded, planner_pick=picks[True],
                                   planner_pick_fwd=picks[False], plan_reason=reason,
                                   one_kernel=note is not None,
                                   fp32_precision=precision))
                if note:
                    row["note"] = note
                result["rows"].append(row)
                save()
                log(f"  {family:9s} {label:12s} " + "  ".join(
                    f"{b} {_ms(m['fwd_ms'])}/{_ms(m['fwd_bwd_ms'])}" for b, m in backends.items())
                    + f"  planner[{picks[False]}/{picks[True]}] "
                    f"{_ms(row['fwd_ms'])}/{_ms(row['fwd_bwd_ms'])}  "
                    f"ratio {_x(row['ratio_fwd'])}/{_x(row['ratio_fwd_bwd'])}"
                    + "".join(f"  {p}: {row[f'miss_{p}']}" for p in ("fwd", "fwd_bwd")
                              if row[f"miss_{p}"]))
                del inp
                if cuda:
                    torch.cuda.empty_cache()


def _ms(v):
    return "-" if v is None else f"{v:.3f}"


def _x(v):
    return "-" if v is None else f"{v:.2f}x"
