"""python -m gnnio.bench.study: issue 5's two studies, op level, one process per results file.

- ``--study reorder``: each graph x each node order (none, degree, rcm, metis) x each kernel
  (``gcn_propagate``, ``segment_reduce(max)`` and, where the planner splits it, its light and
  heavy parts, ``graph_attention(gatv2)``): forward and forward+backward on the reordered graph
  next to the original, the order's own cost (wall clock, and the host that measured it), the
  relabelling's cost on the device, and the locality it buys (bandwidth, edges per 16x16 tile).
- ``--study planner``: each graph x each family x dtype: every fixed backend (SpMM ``csr`` /
  ``wsb``; reduction ``degree-aware`` / ``node-parallel``; attention ``csr-split`` / ``csr``) and
  the planner's automatic choice, with the fastest fixed backend and the ratio planner/fastest.

``--save-perms DIR`` only computes the orders (CPU) and saves them for ``--perms DIR`` on another
machine (:mod:`gnnio.bench.perms`). ``--out PREFIX`` writes ``PREFIX-reorder-study.{json,md}``
and ``PREFIX-planner.{json,md}``; the JSON is rewritten after every row, and ``--time-limit S``
stops before a graph (or an order / dtype within one) once S seconds have passed, so a
time-boxed run keeps what finished."""
import argparse
import datetime
import os
import sys
import time

import torch

import gnnio
import gnnio.plan
import gnnio.reorder
from gnnio.bench import __main__ as bench
from gnnio.bench import perms
from gnnio.bench.timing import copy_rate_tbps, median_ms

STUDIES = ("reorder", "planner")
ORDERS = gnnio.reorder.METHODS  # 'none' (the original order) is always measured first
KERNELS = ("spmm", "reduce", "reduce-light", "reduce-heavy", "attention")
FAMILIES = ("spmm", "reduce", "attention", "attention-gat")
DEFAULT_GRAPHS = "standard,real"
SUFFIX = {"reorder": "reorder-study", "planner": "planner"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gnnio.bench.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default="both", choices=[*STUDIES, "both"])
    p.add_argument("--graphs", default=DEFAULT_GRAPHS,
                   help="comma list, as for `gnnio bench` ('real', 'standard', names, files); "
                        f"default {DEFAULT_GRAPHS}")
    p.add_argument("--orders", default=",".join(ORDERS),
                   help=f"reorder study and --save-perms: comma list from {', '.join(ORDERS)}")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help=f"reorder study: comma list from {', '.join(KERNELS)}")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"planner study: comma list from {', '.join(FAMILIES)}")
    p.add_argument("--dtypes", default=None,
                   help="planner study: comma list (default float32,bfloat16 on CUDA, float32 on "
                        "the CPU); float32 SpMM is measured with tf32 off and on ('float32+tf32')")
    p.add_argument("--features", type=int, default=128,
                   help="F of spmm / reduce; attention runs 4 heads x F/4 (default 128)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=None, help="default 3 on CUDA, 1 on CPU")
    p.add_argument("--repeat", type=int, default=None, help="default 10 on CUDA, 3 on CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="PREFIX",
                   help="writes PREFIX-reorder-study.{json,md} and PREFIX-planner.{json,md}")
    p.add_argument("--perms", default=None, metavar="DIR",
                   help="read orders from DIR/{graph}-{order}.pt (see --save-perms) where valid")
    p.add_argument("--compute-orders", default=None,
                   help="orders that may be computed here when DIR has no valid file "
                        "(default: all of --orders)")
    p.add_argument("--save-perms", default=None, metavar="DIR",
                   help="compute each (graph, order) here and save it to DIR; times nothing else")
    p.add_argument("--force", action="store_true", help="--save-perms: recompute existing files")
    p.add_argument("--device-time", action="store_true",
                   help="planner study on CUDA: also time each candidate's CUDA-graph replays (the "
                        "GPU's time alone, without the host's per-call work), with their own verdict")
    p.add_argument("--time-limit", type=float, default=0.0, metavar="S",
                   help="stop before the next graph (or order / dtype) after S seconds (0: none)")
    args = p.parse_args(argv)

    args.graphs = bench._expand_graphs(args.graphs, p)
    for name in args.graphs:
        problem = bench.graph_problem(name)
        if problem:
            p.error(problem)
    args.orders = _choices(p, "--orders", args.orders, ORDERS)
    args.compute_orders = (args.orders if args.compute_orders is None
                           else _choices(p, "--compute-orders", args.compute_orders, ORDERS, True))
    args.kernels = _choices(p, "--kernels", args.kernels, KERNELS)
    args.families = _choices(p, "--families", args.families, FAMILIES)
    args.studies = STUDIES if args.study == "both" else (args.study,)
    if args.features < 4:
        p.error(f"--features must be 4 or more, got {args.features}")
    try:
        args.device = torch.device(args.device)
    except RuntimeError:
        p.error(f"unknown --device {args.device!r}")
    cuda = args.device.type == "cuda"
    if cuda and not (torch.cuda.is_available() and gnnio._ops.HAS_CUDA_KERNELS):
        p.error("--device cuda needs a GPU and gnnio built with its CUDA kernels")
    allowed = bench.DTYPES[args.device.type]
    args.dtypes = _choices(p, "--dtypes", args.dtypes or ("float32,bfloat16" if cuda else "float32"),
                           allowed)
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    args.repeat = args.repeat if args.repeat is not None else (10 if cuda else 3)
    if args.warmup < 0 or args.repeat < 1:
        p.error("--warmup must be >= 0 and --repeat >= 1")
    return args


def _choices(p, flag, spec, allowed, empty_ok=False):
    items = [s.strip() for s in spec.split(",") if s.strip()]
    for s in items:
        if s not in allowed:
            p.error(f"{flag}: unknown {s!r}; choose from {', '.join(allowed)}")
    if not items and not empty_ok:
        p.error(f"{flag} is empty")
    return list(dict.fromkeys(items))


class Clock:
    """The --time-limit: ``over(what)`` is True (and says so once) when the limit has passed."""

    def __init__(self, limit, log):
        self.start, self.limit, self.log = time.monotonic(), limit, log
        self.stopped = None

    def elapsed(self):
        return time.monotonic() - self.start

    def over(self, what):
        if self.stopped is None and self.limit > 0 and self.elapsed() > self.limit:
            self.stopped = f"time limit {self.limit:g} s reached after {self.elapsed():.0f} s, before {what}"
            self.log(f"stopping: {self.stopped}")
        return self.stopped is not None


def log(text):
    print(text, flush=True)


def header(args, study):
    device = args.device
    return {
        "card": bench.card_name(device), "torch": torch.__version__, "pyg": bench.pyg_version(),
        "gnnio": gnnio.__version__, "date": datetime.date.today().isoformat(),
        "commit": bench.git_commit(), "copy_tbps": copy_rate_tbps(device), "study": study,
        "features": args.features, "attention": f"gatv2 (attention-gat: gat), 4 heads x {args.features // 4}",
        "warmup": args.warmup, "repeat": args.repeat, "seed": args.seed,
        "device_time": bool(getattr(args, "device_time", False)) and device.type == "cuda",
        "perms": args.perms, "tf32_default": torch.backends.cuda.matmul.fp32_precision,
        "env": {k: v for k, v in os.environ.items() if k.startswith("GNNIO_") and k != "GNNIO_COMMIT"},
        "graphs": {}, "rows": [], "skipped": [], "stopped": None,
    }


def load(name, args, cache):
    """(GraphData on the CPU, fingerprint), loaded once per process."""
    if name not in cache:
        t0 = time.perf_counter()
        try:
            data = bench.load_graph(name, args.seed)
        except (OSError, ValueError) as e:
            raise SystemExit(f"python -m gnnio.bench.study: cannot load graph {name!r}: {e}") from None
        cache.clear()  # keep one graph at a time: the standard ones take 256 MB each
        cache[name] = data, perms.fingerprint(data.edge_index, data.num_nodes)
        log(f"{data.name}: {data.num_nodes:,} nodes, {data.edge_index.size(1):,} edges "
            f"(loaded in {time.perf_counter() - t0:.1f} s)")
    return cache[name]


# A call slower than this is timed with fewer samples (the planner study's hopeless fixed
# backends: node-parallel reduction and unsplit attention on a power-law super node take 0.1-1+ s).
FEW_SAMPLES_MS, ONE_SAMPLE_MS = 20.0, 250.0


def measure(fn_fwd, grad_out, inputs, device, warmup, repeat):
    """{fwd_ms, fwd_bwd_ms, samples}: median_ms of the forward and of forward+backward
    (autograd.grad of ``inputs``). Each pass gets one untimed call (caches: CSR transposes, splits,
    WSB tiles) and one timed probe; a probe above FEW_SAMPLES_MS gets 3 samples and no more
    warm-up, one above ONE_SAMPLE_MS is itself the measurement (samples 1)."""
    def fwd_bwd():
        torch.autograd.grad(fn_fwd(), inputs, grad_out)

    out = {"peak_extra_gib": None}
    for key, fn in (("fwd_ms", fn_fwd), ("fwd_bwd_ms", fwd_bwd)):
        fn()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        probe = (time.perf_counter() - t0) * 1e3
        if probe > ONE_SAMPLE_MS:
            out[key], out[f"{key[:-3]}_samples"] = probe, 1
        elif probe > FEW_SAMPLES_MS:
            out[key], out[f"{key[:-3]}_samples"] = median_ms(fn, device, 0, min(3, repeat)), min(3, repeat)
        else:
            out[key] = median_ms(fn, device, warmup, repeat)
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_stats(graph):
    s = graph.stats()
    return {"num_nodes": graph.num_dst, "num_edges": graph.num_edges,
            "mean_in_degree": s["mean_in_degree"], "max_in_degree": s["max_in_degree"],
            "p99_in_degree": s["p99_in_degree"], "max_out_degree": graph.max_out_degree()}


def save_perms(args):
    """--save-perms: each (graph, order) computed here and saved, valid files kept."""
    cache = {}
    for name in args.graphs:
        data, fp = load(name, args, cache)
        for order in args.orders:
            path = perms.file_path(args.save_perms, data.name, order)
            found, _ = perms.load(args.save_perms, data.name, order, fp)
            if found is not None and not args.force:
                log(f"  {order}: kept {path} ({found.cost_s:.3f} s on {found.host})")
                continue
            try:
                result = perms.compute(data.edge_index, data.num_nodes, order)
            except ImportError as e:
                log(f"  {order}: skipped ({e})")
                continue
            perms.save(args.save_perms, data.name, order, result, fp)
            log(f"  {order}: {result.cost_s:.3f} s -> {path}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.save_perms:
        save_perms(args)
        return None
    from gnnio.bench import study_planner, study_reorder
    from gnnio.bench.study_report import write

    runners = {"reorder": study_reorder.run_graph, "planner": study_planner.run_graph}
    clock, cache, results = Clock(args.time_limit, log), {}, {}
    log(f"{bench.card_name(args.device)}; studies {', '.join(args.studies)} on "
        f"{len(args.graphs)} graphs")
    for study in args.studies:
        result = results[study] = header(args, study)
        path = f"{args.out}-{SUFFIX[study]}" if args.out else None
        save = (lambda r=result, p=path: write(r, p)) if path else (lambda: None)
        for name in args.graphs:
            if clock.over(f"{study} study of graph {name}"):
                break
            data, fp = load(name, args, cache)
            log(f"== {study}: {data.name} ({clock.elapsed():.0f} s)")
            runners[study](data, fp, args, result, save, clock)
            save()
        result["stopped"] = clock.stopped
        result["elapsed_s"] = round(clock.elapsed(), 1)
        if path:
            write(result, path)
            log(f"wrote {path}.json and {path}.md")
    return results


if __name__ == "__main__":
    main()
