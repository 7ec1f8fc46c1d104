"""python -m gnnio.bench.scale: how many edges one GATv2Conv training step handles on one GPU
(issue 7's Scale bar).

For each edge count of ``--edges`` (ascending), a power-law graph of DESIGN.md's generator
(destination rank k drawn with P ∝ (k+1)^-1.1, node ids randomly permuted, source uniform; 20M
nodes by default) is drawn on the device in chunks, a ``gnnio.Graph`` is built with everything
a training step reads (both CSRs, the slot map of the transpose, the super-node plans), and one
training step of ``gnnio.nn.GATv2Conv(128, 32, heads=4, add_self_loops=False)`` (forward, cross
entropy over ``--train-frac`` of the nodes against random labels, backward, Adam step) runs in
each of ``--dtypes``: a first step (plans, optimizer state), then ``--warmup`` and ``--repeat``
timed steps (CUDA events; median). A few destination rows of the output are then checked
against a plain-torch computation of the same attention (chunked online softmax, so a row of
10^8 neighbours is checked too).

The ladder goes on while some dtype still fits: a dtype that fails (out of memory or any other
error, recorded in its row with the memory peak at the failure) is not tried at larger sizes.
The results file (the results schema; layer ``GATv2Conv-scale``, with ``num_edges``, ``fits``,
``peak_gib`` = the step's absolute peak, ``peak_extra_gib`` = above what was allocated before
it, ``graph_gib`` = the Graph and its caches) is rewritten after every row, so a run stopped
from outside keeps what it measured; ``largest_fit`` names the largest size that fit per dtype.
``--time-limit`` stops the run by itself before that many seconds: a size whose predicted time
(the last size's, scaled by the edge count) does not fit is not started, and an alarm stops a
size still running at the limit.

The edges differ from ``gnnio.datasets.powerlaw``'s at the same size (another random stream:
the device's generator, in chunks), not their distribution.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import time

import torch
import torch.nn.functional as F

import gnnio
import gnnio.plan
from gnnio.bench.timing import copy_rate_tbps
from gnnio.bench.training import describe, free

LAYER = "GATv2Conv-scale"
DEFAULT_EDGES = "256M,512M,1G,1250M,1500M,1750M,2G,2500M"
_INT32_MAX = 2**31 - 1


class TimeLimit(BaseException):
    """Raised by the alarm at --time-limit; a BaseException, so that no `except Exception` on
    the way (here or in a library) swallows it."""


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="python -m gnnio.bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="20M", help="number of nodes (default 20M)")
    p.add_argument("--edges", default=DEFAULT_EDGES,
                   help=f"comma list of edge counts, ascending (K, M, G suffixes; default {DEFAULT_EDGES})")
    p.add_argument("--dtypes", default="float32,bfloat16" if cuda else "float32")
    p.add_argument("--features", type=int, default=128, help="input features (default 128)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--channels", type=int, default=32, help="per head (default 32)")
    p.add_argument("--self-loops", action="store_true", help="add_self_loops=True (default off)")
    p.add_argument("--train-frac", type=float, default=0.1,
                   help="fraction of the nodes in the loss (default 0.1)")
    p.add_argument("--exponent", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after the first (default 1)")
    p.add_argument("--repeat", type=int, default=3, help="timed steps (default 3)")
    p.add_argument("--check-rows", type=int, default=8,
                   help="destination rows checked against plain torch (default 8; 0: none)")
    p.add_argument("--chunk", default="64M", help="edges drawn per generation chunk (default 64M)")
    p.add_argument("--time-limit", type=float, default=0.0,
                   help="stop before this many seconds from the start (default: no limit)")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--out", default=None, help="results JSON (a .md table is written beside it)")
    args = p.parse_args(argv)
    try:
        args.nodes = gnnio.datasets._count(args.nodes)
        args.edges = [gnnio.datasets._count(s.strip()) for s in args.edges.split(",") if s.strip()]
        args.chunk = gnnio.datasets._count(args.chunk)
    except (ValueError, IndexError):
        p.error("--nodes, --edges and --chunk take integers with an optional K, M or G suffix")
    if args.nodes <= 0 or not args.edges or min(args.edges) <= 0 or args.chunk <= 0:
        p.error("--nodes, --edges and --chunk must be positive")
    if args.edges != sorted(args.edges):
        p.error("--edges must be ascending")
    args.dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
    for d in args.dtypes:
        if d not in ("float32", "bfloat16", "float16", "float64"):
            p.error(f"unknown dtype {d!r}")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not (torch.cuda.is_available() and gnnio._ops.HAS_CUDA_KERNELS):
        p.error("--device cuda needs a GPU and gnnio built with its CUDA kernels")
    if not 0 < args.train_frac <= 1:
        p.error("--train-frac must be in (0, 1]")
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be >= 1 and --warmup >= 0")
    return args


def generate(num_nodes, num_edges, exponent=1.1, seed=0, device="cpu", chunk=2**26):
    """[2, E] edge_index (row 0 source, row 1 destination; int32 when ids and E fit, else int64)
    drawn on ``device`` in chunks: beyond the result, about 20 bytes per chunk edge and the
    float64 CDF of the ranks (8 bytes per node)."""
    device = torch.device(device)
    dtype = torch.int32 if max(num_nodes, num_edges) <= _INT32_MAX else torch.int64
    g = torch.Generator(device=device).manual_seed(seed)
    cdf = gnnio.datasets.powerlaw_cdf(num_nodes, exponent, device=device)
    ids = torch.randperm(num_nodes, generator=g, device=device).to(dtype)
    ei = torch.empty(2, num_edges, dtype=dtype, device=device)
    for start in range(0, num_edges, chunk):
        stop = min(start + chunk, num_edges)
        u = torch.rand(stop - start, generator=g, dtype=torch.float64, device=device)
        rank = torch.searchsorted(cdf, u, out_int32=dtype == torch.int32).clamp_(max=num_nodes - 1)
        del u
        torch.index_select(ids, 0, rank, out=ei[1, start:stop])
        del rank
        ei[0, start:stop].random_(0, num_nodes, generator=g)
    return ei


def _short(n):
    for s, v in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n % v == 0:
            return f"{n // v}{s}"
    return str(n)


def _gib(nbytes):
    return nbytes / 2**30


class Memory:
    """CUDA allocator counters (all None on a CPU)."""

    def __init__(self, device):
        self.device, self.cuda = device, device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def reset(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def now(self):
        return _gib(torch.cuda.memory_allocated(self.device)) if self.cuda else None

    def peak(self):
        return _gib(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None


def build_graph(args, num_edges, mem):
    """(graph, info) with every format and plan a training step reads, built before the step."""
    t0 = time.perf_counter()
    ei = generate(args.nodes, num_edges, args.exponent, args.seed, args.device, args.chunk)
    mem.sync()
    t1 = time.perf_counter()
    graph = gnnio.Graph(ei, num_nodes=args.nodes)  # int32 input: shared with the Graph, no copy
    del ei
    graph.csr_by_src
    graph.src_slot_to_dst_slot
    plan = None
    if args.device.type == "cuda":
        plan = gnnio.plan.plan_attention(graph, args.heads * args.channels, backward=True).reason
    mem.sync()
    info = dict(gen_s=t1 - t0, build_s=time.perf_counter() - t1, index_dtype=str(graph.index_dtype).split(".")[-1],
                max_in_degree=graph.stats()["max_in_degree"], plan=plan)
    return graph, info


def run_step(graph, dtype, args, mem, row):
    """Fills row with the step's numbers (raises on any failure)."""
    n, H, C = args.nodes, args.heads, args.channels
    dev = args.device
    torch.manual_seed(args.seed)
    conv = gnnio.nn.GATv2Conv(args.features, C, heads=H, add_self_loops=args.self_loops).to(dev, dtype)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    x = torch.randn(n, args.features, generator=gen, device=dev, dtype=dtype)
    n_train = max(1, int(n * args.train_frac))  # node ids are a random permutation: a random subset
    y = torch.randint(H * C, (n_train,), generator=gen, device=dev)
    opt = torch.optim.Adam(conv.parameters(), lr=0.01)
    mem.reset()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(conv(x, graph)[:n_train].float(), y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    loss = step()
    mem.sync()
    row["first_step_s"] = time.perf_counter() - t0
    times = []
    mem.reset()
    before = mem.now()
    for i in range(args.warmup + args.repeat):
        if mem.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t = time.perf_counter()
            loss = step()
            ms = (time.perf_counter() - t) * 1e3
        if i >= args.warmup:
            times.append(ms)
    row.update(fwd_bwd_ms=statistics.median(times), step_ms=times, loss=float(loss.detach()), fits=True,
               peak_gib=mem.peak(), state_gib=before,
               peak_extra_gib=None if before is None else mem.peak() - before)
    opt.zero_grad(set_to_none=True)
    del opt
    if args.check_rows > 0:
        try:  # a failing check is reported, the step still fit
            row["check_max_rel_diff"], row["check_rows"] = spot_check(conv, x, graph, args)
        except Exception as e:  # noqa: BLE001
            row["check_error"] = describe(e)
    return row


@torch.no_grad()
def spot_check(conv, x, graph, args, chunk=2**21):
    """Largest relative difference between the layer's output and a plain-torch computation on a
    few destination rows: the heaviest, the last non-empty ones (the highest CSR slots) and
    seeded random ones; each row in chunks of slots with an online softmax."""
    H, C = conv.heads, conv.out_channels
    out = conv(x, graph)
    if conv.add_self_loops:  # the graph the layer ran on (cached by the Graph)
        graph = graph.with_self_loops(graph.num_dst)[0]
    csr = graph.csr_by_dst
    deg = graph.in_degree()
    nonempty = (deg > 0).nonzero().view(-1)
    if nonempty.numel() == 0:
        return 0.0, []
    k = args.check_rows
    g = torch.Generator(device=deg.device).manual_seed(args.seed + 3)
    picks = [int(deg.argmax())] + nonempty[-max(1, k // 2):].tolist() + nonempty[
        torch.randint(nonempty.numel(), (max(0, k - 1 - k // 2),), generator=g, device=deg.device)].tolist()
    rows = sorted(set(picks))
    att = conv.att.view(H, C).float()
    worst = 0.0
    for i in rows:
        begin, end = int(csr.rowptr[i]), int(csr.rowptr[i + 1])
        xr = conv.lin_r(x[i:i + 1]).view(1, H, C).float()
        m = torch.full((H,), float("-inf"), device=x.device)
        s = torch.zeros(H, device=x.device)
        acc = torch.zeros(H, C, device=x.device)
        for b in range(begin, end, chunk):
            j = csr.col[b:min(end, b + chunk)].long()
            xl = conv.lin_l(x[j]).view(-1, H, C).float()  # rounded to the layer's dtype first
            e = (att * F.leaky_relu(xl + xr, conv.negative_slope)).sum(-1)  # [slots, H]
            m_new = torch.maximum(m, e.max(0).values)
            w = torch.exp(e - m_new)
            r = torch.exp(m - m_new)
            s = s * r + w.sum(0)
            acc = acc * r[:, None] + (w[:, :, None] * xl).sum(0)
            m = m_new
        ref = (acc / (s[:, None] + 1e-16)).reshape(-1)
        if conv.bias is not None:
            ref = ref + conv.bias.float()
        diff = (out[i].float() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)
        worst = max(worst, float(diff))
    return worst, rows


def markdown(result):
    lines = [f"# GATv2Conv scale — {result['card']}", "",
             f"torch {result['torch']}, gnnio {result['gnnio']} (commit {result['commit'][:10]}), "
             f"{result['date']}; {result['settings']}", "",
             "| graph | dtype | edges | fits | step ms | peak GiB | step extra GiB | graph GiB | build s "
             "| check rel diff | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, s=".2f": "—" if v is None else format(v, s)  # noqa: E731
    for r in result["rows"]:
        lines.append(f"| {r['graph']} | {r['dtype']} | {r['num_edges']:,} | {'yes' if r['fits'] else 'no'} "
                     f"| {f(r.get('fwd_bwd_ms'), '.1f')} | {f(r.get('peak_gib'))} | {f(r.get('peak_extra_gib'))} "
                     f"| {f(r.get('graph_gib'))} | {f(r.get('build_s'), '.1f')} "
                     f"| {f(r.get('check_max_rel_diff'), '.2e')} | {(r.get('error') or '')[:120]} |")
    lines.append("")
    for dt, fit in result["largest_fit"].items():
        lines.append(f"largest fit, {dt}: " + (f"{fit['num_edges']:,} edges, step {fit['fwd_bwd_ms']:.1f} ms, "
                                               f"peak {f(fit['peak_gib'])} GiB" if fit else "none"))
    if result.get("stopped"):
        lines.append(f"stopped: {result['stopped']}")
    return "\n".join(lines) + "\n"


def _write(result, path):
    fits = {}
    for r in result["rows"]:
        if r["fits"] and (fits.get(r["dtype"]) is None or r["num_edges"] > fits[r["dtype"]]["num_edges"]):
            fits[r["dtype"]] = {k: r.get(k) for k in ("graph", "num_edges", "fwd_bwd_ms", "peak_gib")}
        fits.setdefault(r["dtype"], None)
    result["largest_fit"] = fits
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        for name, text in ((path, json.dumps(result, indent=1)),
                           (os.path.splitext(path)[0] + ".md", markdown(result))):
            with open(name + ".tmp", "w") as fh:
                fh.write(text)
            os.replace(name + ".tmp", name)


def main(argv=None):
    from gnnio.bench.__main__ import card_name, git_commit, pyg_version

    start = time.perf_counter()
    args = parse_args(argv)
    dev, mem = args.device, Memory(args.device)
    deadline = start + args.time_limit if args.time_limit > 0 else None
    result = {
        "card": card_name(dev), "torch": torch.__version__, "pyg": pyg_version(), "gnnio": gnnio.__version__,
        "date": datetime.date.today().isoformat(), "commit": git_commit(), "copy_tbps": copy_rate_tbps(dev),
        "settings": (f"GATv2Conv({args.features}, {args.channels}, heads={args.heads}, add_self_loops="
                     f"{args.self_loops}), Adam, cross entropy over {args.train_frac:g} of the nodes; powerlaw "
                     f"exponent {args.exponent}, {args.nodes:,} nodes, seed {args.seed}, drawn on {dev.type}"),
        "total_gib": _gib(torch.cuda.mem_get_info(dev)[1]) if mem.cuda else None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "stopped": None, "rows": [],
    }
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"{result['card']}: {result['settings']}")

    def alarm(signum, frame):
        raise TimeLimit()

    old = None
    if deadline is not None:
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.perf_counter()))
    dtypes = list(args.dtypes)
    last = None  # (edges, seconds) of the last size
    try:
        for e in args.edges:
            if not dtypes:
                break
            if deadline is not None and last is not None:
                predicted = last[1] * e / last[0] * len(dtypes) / last[2]
                left = deadline - time.perf_counter()
                if 1.2 * predicted > left:
                    result["stopped"] = f"time limit: {e:,} edges predicted {predicted:.0f} s, {left:.0f} s left"
                    break
            t0 = time.perf_counter()
            name = f"powerlaw-{_short(args.nodes)}-{_short(e)}"
            log(f"{name}: drawing and building the graph")
            base = dict(graph=name, layer=LAYER, impl="gnnio", num_nodes=args.nodes, num_edges=e, fits=False,
                        fwd_ms=None, fwd_bwd_ms=None, peak_extra_gib=None, peak_gib=None)
            mem.reset()
            graph, info = None, {}
            try:
                graph, info = build_graph(args, e, mem)
                info.update(graph_gib=mem.now(), build_peak_gib=mem.peak())
            except Exception as ex:  # noqa: BLE001 - recorded, and the ladder ends
                for dt in dtypes:
                    result["rows"].append(dict(base, dtype=dt, error=f"graph: {describe(ex)}",
                                               peak_gib=mem.peak()))
                dtypes = []
            if graph is not None:
                log(f"  {info['index_dtype']} indices, generated in {info['gen_s']:.1f} s, built in "
                    f"{info['build_s']:.1f} s; {info['plan']}")
                for dt in list(dtypes):
                    row = dict(base, dtype=dt, **info)
                    try:
                        run_step(graph, getattr(torch, dt), args, mem, row)
                    except Exception as ex:  # noqa: BLE001
                        row.update(fits=False, error=describe(ex), peak_gib=mem.peak())
                        dtypes.remove(dt)
                    result["rows"].append(row)
                    free(dev)
                    peak = "—" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
                    log(f"  {dt}: " + (f"step {row['fwd_bwd_ms']:.1f} ms, peak {peak} GiB, check "
                                       f"{row.get('check_max_rel_diff', row.get('check_error'))}"
                                       if row["fits"] else row["error"]))
                    _write(result, args.out)
            del graph
            free(dev)
            _write(result, args.out)
            last = (e, time.perf_counter() - t0, max(1, len([r for r in result["rows"] if r["num_edges"] == e])))
    except TimeLimit:
        result["stopped"] = "time limit reached while a size was running"
    finally:
        if deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    _write(result, args.out)
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
