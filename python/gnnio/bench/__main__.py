"""gnnio bench (python -m gnnio.bench): gnnio against PyG (and torch.sparse for SpMM), same
process, same graph and inputs; prints a table and writes the results schema (JSON), a markdown
table and a plot of the speedups."""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time

import torch

import gnnio
import gnnio.plan
import gnnio.reorder
from gnnio.bench import training
from gnnio.bench.cases import DEFAULT_LAYERS, LAYERS, attention_operands
from gnnio.bench.report import markdown_table
from gnnio.bench.timing import bench_module, copy_rate_tbps, median_ms, peak_extra_gib, rel_diff
from gnnio.bench.wsb import bench_attention_wsb, bench_spmm_wsb

STANDARD = ["powerlaw-1M-16M", "uniform-1M-16M", "grid-1000x1000"]
# What gnnio's kernels run, by device type (the CPU kernels: float32 and float64; the CUDA ones
# refuse float64 for attention, so the benchmark does not offer it there).
DTYPES = {"cpu": ("float32", "float64"), "cuda": ("float32", "bfloat16", "float16")}
EDGE_INDEX_SUFFIXES = (".pt", ".pth")
MTX_SUFFIXES = (".mtx", ".mtx.gz")
_GENERATED = re.compile(r"(?:(?:powerlaw|uniform|blockdiag)-(\d+[KMG]?)-\d+[KMG]?|grid-(\d+)x(\d+))")


def parse_args(argv, prog="python -m gnnio.bench"):
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    p.add_argument("--graphs", default="cora",
                   help="comma list of graph names, .mtx[.gz] paths, or .pt files holding an "
                        "edge_index saved with torch.save (a [2, E] integer tensor, or a dict with "
                        "'edge_index' and optional 'num_nodes'); 'real' = every real graph found, "
                        "'standard' = %s; generated: powerlaw-N-E, uniform-N-E, grid-HxW, "
                        "blockdiag-N-E (locally dense: 16-node groups, for spmm(wsb))"
                        % ",".join(STANDARD))
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS),
                   help="comma list from: spmm, " + ", ".join(list(OPS) + list(LAYERS)))
    p.add_argument("--features", type=int, default=128, help="features per node, in and out (default 128)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                   help="cpu: float32, float64; cuda: float32, bfloat16, float16")
    p.add_argument("--compare", default="pyg", choices=["pyg", "none"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=None, help="default 5 on CUDA, 2 on CPU")
    p.add_argument("--repeat", type=int, default=None, help="default 20 on CUDA, 5 on CPU")
    p.add_argument("--out", default=None, help="JSON path (a .md and a .png are written beside it)")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="PNG of speedup and memory ratio per layer and graph (default: beside --out)")
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reorder", default="none", choices=["none", *gnnio.reorder.METHODS],
                   metavar="METHOD",
                   help="renumber each graph's nodes first (%s; default none), timing the "
                        "reordering as a row 'reorder(METHOD)', so runs with and without it can "
                        "be compared" % ", ".join(gnnio.reorder.METHODS))
    training.add_arguments(p)
    args = p.parse_args(argv)
    args.prog = prog

    args.graphs = _expand_graphs(args.graphs, p)
    for name in args.graphs:
        problem = graph_problem(name)
        if problem:
            p.error(problem)
    args.layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    if not args.layers:
        p.error("--layers is empty")
    for layer in args.layers:
        if layer != "spmm" and layer not in LAYERS and layer not in OPS:
            p.error(f"unknown layer {layer!r}; choose from spmm, {', '.join(list(OPS) + list(LAYERS))}")
    if args.features <= 0:
        p.error(f"--features must be positive, got {args.features}")
    training.check_arguments(args, p)

    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"unknown --device {args.device!r}; use cpu or cuda[:N]")
    if device.type not in DTYPES:
        p.error(f"--device {args.device}: gnnio's kernels run on cpu and cuda")
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda asked for but torch sees no GPU")
    if cuda and not gnnio._ops.HAS_CUDA_KERNELS:
        p.error("--device cuda: this gnnio was built without its CUDA kernels (rebuild on a machine "
                "with nvcc, or use --device cpu)")
    if cuda and device.index is not None and device.index >= torch.cuda.device_count():
        p.error(f"--device {args.device}: torch sees {torch.cuda.device_count()} GPU(s)")
    if args.dtype not in DTYPES[device.type]:
        p.error(f"--dtype {args.dtype} does not run on {device.type}: gnnio's {device.type.upper()} "
                f"kernels run {' and '.join(DTYPES[device.type])}"
                + (" (use --device cuda for half types)" if not cuda else ""))
    if args.reorder != "none":
        try:
            gnnio.reorder.check_available(args.reorder)
        except ImportError as e:
            p.error(f"--reorder {args.reorder}: {e}")
    if args.compare == "pyg" and pyg_version() is None:
        p.error("--compare pyg needs torch_geometric (pip install torch_geometric), or use --compare none")

    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    args.repeat = args.repeat if args.repeat is not None else (20 if cuda else 5)
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.repeat < 1:
        p.error(f"--repeat must be 1 or more, got {args.repeat}")
    if args.plot is None and args.out and not args.no_plot:
        args.plot = os.path.splitext(args.out)[0] + ".png"
    if args.no_plot:
        args.plot = None
    return args


def _expand_graphs(spec, parser):
    out = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "real":
            found = gnnio.datasets.available_real_graphs()
            if not found:
                parser.error(f"--graphs real: no real graphs (*.mtx.gz) in {gnnio.datasets.graph_dirs()}")
            out += found
        elif name == "standard":
            out += STANDARD
        else:
            out.append(name)
    if not out:
        parser.error("--graphs is empty")
    return list(dict.fromkeys(out))


def graph_problem(name):
    """What is wrong with a --graphs entry (a message), or None when the run can load it. A .pt
    file is read and checked here, so a bad one stops the run before anything is timed."""
    m = _GENERATED.fullmatch(name)
    if m:
        n = gnnio.datasets._count(m.group(1)) if m.group(1) else int(m.group(2)) * int(m.group(3))
        return None if n > 0 else f"graph {name!r} has no nodes"
    if name.endswith(EDGE_INDEX_SUFFIXES):
        if not os.path.isfile(name):
            return f"no such file: {name!r}"
        try:
            load_edge_index_file(name)
        except ValueError as e:
            return str(e)
        return None
    if os.path.exists(name):
        if not os.path.isfile(name):
            return f"{name!r} is not a file"
        if not name.endswith(MTX_SUFFIXES):
            return (f"{name!r}: unknown file type; --graphs takes Matrix Market files (.mtx, .mtx.gz) "
                    "and edge_index files saved with torch.save (.pt)")
        return None
    if name.endswith(MTX_SUFFIXES) or os.sep in name:
        return f"no such file: {name!r}"
    try:
        gnnio.datasets._find(name)
    except FileNotFoundError:
        real = gnnio.datasets.available_real_graphs()
        return (f"unknown graph {name!r}: not a file, not a generated graph (powerlaw-N-E, "
                f"uniform-N-E, blockdiag-N-E, grid-HxW), and not a real graph found here ({', '.join(real) or 'none'})")
    return None


_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def load_edge_index_file(path):
    """A user's edge_index saved with torch.save: a [2, E] integer tensor (row 0 = source, row 1
    = destination), or a dict with 'edge_index' and an optional 'num_nodes' (else max index + 1).
    Read with weights_only=True (no arbitrary pickles). Raises ValueError naming the problem."""
    how = ("save it with torch.save(edge_index, path) or "
           "torch.save({'edge_index': edge_index, 'num_nodes': n}, path)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zip and torch errors alike mean "not ours"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: torch.load cannot read it as tensors ({reason[:200]}); {how}") from None
    num_nodes = None
    if isinstance(obj, dict):
        if "edge_index" not in obj:
            raise ValueError(f"{path}: the saved dict has no 'edge_index' key (keys: "
                             f"{', '.join(map(repr, obj)) or 'none'}); {how}")
        edge_index, num_nodes = obj["edge_index"], obj.get("num_nodes")
    else:
        edge_index = obj
    if not isinstance(edge_index, torch.Tensor):
        raise ValueError(f"{path}: edge_index must be a tensor, got {type(edge_index).__name__}; {how}")
    if edge_index.layout != torch.strided:
        raise ValueError(f"{path}: edge_index must be a dense tensor, got layout {edge_index.layout}")
    if edge_index.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{path}: edge_index must be an integer tensor, got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"{path}: edge_index must have shape [2, E], got {list(edge_index.shape)}")
    edge_index = edge_index.to(torch.int64).contiguous()
    if edge_index.numel() and edge_index.min().item() < 0:
        raise ValueError(f"{path}: edge_index has negative node ids")
    needed = edge_index.max().item() + 1 if edge_index.numel() else 0
    if num_nodes is None:
        if needed == 0:
            raise ValueError(f"{path}: edge_index is empty; save 'num_nodes' with it")
        num_nodes = needed
    else:
        if isinstance(num_nodes, torch.Tensor) and num_nodes.numel() == 1 and not (
                num_nodes.dtype.is_floating_point or num_nodes.dtype == torch.bool):
            num_nodes = num_nodes.item()
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
            raise ValueError(f"{path}: 'num_nodes' must be an integer, got {num_nodes!r}")
        if num_nodes < needed or num_nodes <= 0:
            raise ValueError(f"{path}: 'num_nodes' is {num_nodes} but edge_index refers to node "
                             f"{needed - 1}")
    base = os.path.basename(path)
    base = base[: -len(next(s for s in EDGE_INDEX_SUFFIXES if base.endswith(s)))]
    return gnnio.datasets.GraphData(base, edge_index, num_nodes)


def load_graph(name, seed):
    """gnnio.datasets.load, plus .pt edge_index files."""
    if name.endswith(EDGE_INDEX_SUFFIXES):
        return load_edge_index_file(name)
    return gnnio.datasets.load(name, seed=seed)


class Progress:
    """Progress on stderr, one step per graph (loading it) and per (graph, layer): a tqdm bar when
    tqdm is installed and the stream is a terminal, else one line per step. Log lines go through
    it so they do not break the bar. stdout is left to the table."""

    def __init__(self, total, stream=None):
        self.total, self.done = total, 0
        self.stream = sys.stderr if stream is None else stream
        self.bar = None
        if self.stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, file=self.stream, unit="step", dynamic_ncols=True,
                                leave=False)

    def start(self, what):
        if self.bar is not None:
            self.bar.set_description(what)
        else:
            self.log(f"[{self.done + 1}/{self.total}] {what}")

    def step(self):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def log(self, text):
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def card_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def git_commit():
    """GNNIO_COMMIT when set (a copied tree's git metadata can be stale: the device runs pass
    the commit they were sent from), else the checkout's HEAD."""
    if os.environ.get("GNNIO_COMMIT"):
        return os.environ["GNNIO_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def pyg_version():
    try:
        import torch_geometric
        return torch_geometric.__version__
    except ImportError:
        return None


def run_graph(name, args, device, dtype, rows, progress):
    log = progress.log
    progress.start(f"{name}: loading")
    try:
        data = load_graph(name, args.seed)
    except (OSError, ValueError) as e:  # a .mtx that does not parse, an unreadable file
        raise SystemExit(f"{args.prog}: error: cannot load graph {name!r}: {e}") from None
    name = data.name  # a file's base name (no local folders in the results), else as given
    n, ei = data.num_nodes, data.edge_index.to(device)
    e = ei.size(1)
    log(f"{name}: {n:,} nodes, {e:,} edges")

    if args.reorder != "none":
        ei = _reorder(name, ei, n, device, args, rows, log)

    # The Graph's own cost: both CSRs from a cold edge_index (what a mini-batch pays).
    def build():
        g = gnnio.Graph(ei, num_nodes=n)
        g.csr_by_src
        return g
    rows.append(dict(graph=name, layer="Graph", impl="gnnio", dtype="int32",
                     fwd_ms=median_ms(build, device, 1, 5), fwd_bwd_ms=None, peak_extra_gib=None))

    gen = torch.Generator(device=device).manual_seed(args.seed)
    f = args.features
    x = torch.randn(n, f, generator=gen, device=device, dtype=dtype).requires_grad_()
    gout = torch.randn(n, f, generator=gen, device=device, dtype=dtype)

    progress.step()
    for layer in args.layers:
        progress.start(f"{name}: {layer}")
        try:
            if layer == "spmm":
                _bench_spmm(name, x, gout, ei, n, device, dtype, args, rows)
            elif layer in OPS:
                OPS[layer](name, x, gout, ei, n, device, dtype, args, rows)
            else:
                _bench_layer(name, layer, x, gout, ei, device, dtype, args, rows)
        except torch.OutOfMemoryError:
            rows.append(dict(graph=name, layer=layer, impl="?", dtype=str(dtype).split(".")[-1],
                             fwd_ms=None, fwd_bwd_ms=None, peak_extra_gib=None, error="out of memory"))
            torch.cuda.empty_cache()
        args.save()
        log(f"  {layer}: " + ", ".join(
            f"{r['impl']} fwd {r['fwd_ms']:.3f} ms" for r in rows
            if r["graph"] == name and r["layer"] == layer and r.get("fwd_ms") is not None))
        progress.step()


def _reorder(name, ei, n, device, args, rows, log):
    """The edge_index renumbered by args.reorder, and a row with what that costs: the order
    from a built Graph plus relabelling the edges, wall clock of one call (it runs on the host
    and takes seconds on the standard graphs; parse_args imported its library already). The CSR
    build of the result is what the 'Graph' row measures."""
    method = args.reorder
    graph = gnnio.Graph(ei, num_nodes=n)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    p = gnnio.reorder.permutation(graph, method)
    new_ei = torch.stack([p.inv[ei[0]], p.inv[ei[1]]])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = (time.perf_counter() - t0) * 1e3
    rows.append(dict(graph=name, layer=f"reorder({method})", impl="gnnio", dtype="int64",
                     fwd_ms=ms, fwd_bwd_ms=None, peak_extra_gib=None))
    bw = lambda e: int((e[0] - e[1]).abs().max()) if e.numel() else 0  # noqa: E731
    log(f"  reorder({method}): {ms:.1f} ms, bandwidth {bw(ei):,} -> {bw(new_ei):,}")
    return new_ei


def _bench_spmm(name, x, gout, ei, n, device, dtype, args, rows):
    graph = gnnio.Graph(ei, num_nodes=n)
    dt = str(dtype).split(".")[-1]
    fwd, both, mem = bench_module(lambda: gnnio.ops.spmm(graph, x), gout, [x], device, args)
    ours = gnnio.ops.spmm(graph, x)
    # Bytes an SpMM must move: one feature row gathered per edge, the index and value of each
    # edge, the output written once. Its time at the copy rate is the floor.
    itemsize = x.element_size()
    idx = graph.csr_by_dst.col.element_size()
    floor_bytes = graph.num_edges * (x.size(1) * itemsize + idx + itemsize) + n * x.size(1) * itemsize
    rows.append(dict(graph=name, layer="spmm", impl="gnnio", dtype=dt, fwd_ms=fwd, fwd_bwd_ms=both,
                     peak_extra_gib=mem, floor_bytes=floor_bytes))
    csr = graph.csr_by_dst
    value = torch.ones(graph.num_edges, device=device, dtype=dtype)
    a = torch.sparse_csr_tensor(csr.rowptr, csr.col, value, size=(n, n))
    with torch.no_grad():
        ref_fwd = median_ms(lambda: torch.sparse.mm(a, x.detach()), device, args.warmup, args.repeat)
        ref = torch.sparse.mm(a, x.detach())
    rows.append(dict(graph=name, layer="spmm", impl="torch.sparse", dtype=dt, fwd_ms=ref_fwd,
                     fwd_bwd_ms=None, peak_extra_gib=None, max_rel_diff_vs_gnnio=rel_diff(ref, ours)))


def _bench_segment_reduce(name, x, gout, ei, n, device, dtype, args, rows):
    """segment_reduce(max): the degree-aware plan, the plain node-parallel kernel, and
    torch.scatter_reduce (what PyG runs without torch_scatter) on the same inputs."""
    graph = gnnio.Graph(ei, num_nodes=n)
    dt = str(dtype).split(".")[-1]
    itemsize, idx = x.element_size(), graph.csr_by_dst.col.element_size()
    # Bytes it must move: a feature row and an index per edge, out and arg written once.
    floor_bytes = graph.num_edges * (x.size(1) * itemsize + idx) + n * x.size(1) * (itemsize + idx)
    ours = None
    variants = [("gnnio", None), ("gnnio-node-parallel", False)] if x.is_cuda else [("gnnio", None)]
    for impl, degree_aware in variants:
        fn = lambda: gnnio.ops.segment_reduce(graph, x, "max", degree_aware=degree_aware)  # noqa: E731
        fwd, both, mem = bench_module(fn, gout, [x], device, args)
        out = fn()
        row = dict(graph=name, layer="segment_reduce(max)", impl=impl, dtype=dt, fwd_ms=fwd,
                   fwd_bwd_ms=both, peak_extra_gib=mem, floor_bytes=floor_bytes)
        if impl == "gnnio":
            ours = out
            row["plan"] = gnnio.plan.plan_reduce(graph, dtype, degree_aware, backward=True).reason if x.is_cuda else "cpu"
        else:
            row["max_rel_diff_vs_gnnio"] = rel_diff(out, ours)
        rows.append(row)
    index = ei[1][:, None].expand(-1, x.size(1))

    def scatter():
        return torch.zeros(n, x.size(1), device=device, dtype=dtype).scatter_reduce(
            0, index, x[ei[0]], "amax", include_self=False)
    fwd, both, mem = bench_module(scatter, gout, [x], device, args)
    rows.append(dict(graph=name, layer="segment_reduce(max)", impl="torch.scatter_reduce", dtype=dt,
                     fwd_ms=fwd, fwd_bwd_ms=both, peak_extra_gib=mem,
                     max_rel_diff_vs_gnnio=rel_diff(scatter(), ours)))


def _bench_attention(kind):
    def run(name, x, gout, ei, n, device, dtype, args, rows):
        """The fused attention op alone (no linear layers), 4 heads x features/4, against its
        gather floor: what it must read (one value row per edge, plus a key row for 'dot', the
        per-edge index and score inputs) and write (out, stats)."""
        graph = gnnio.Graph(ei, num_nodes=n)
        # 'shared': heads of the full feature width reading one row per source (x itself).
        heads, channels = 4, x.size(1) if kind == "shared" else max(1, x.size(1) // 4)
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        rand = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
        value, operands, rows_per_edge = attention_operands(kind, n, heads, channels, rand)
        inputs = [value] + [t for t in operands.values() if isinstance(t, torch.Tensor) and t is not value]
        op_kind = "dot" if kind == "shared" else kind
        # The fused CSR kernels (their floor below): auto could send GAT to the tiles, whose
        # rows are graph_attention(wsb)'s.
        fn = lambda: gnnio.ops.graph_attention(graph, op_kind, value, backend="csr", **operands)  # noqa: E731
        g = torch.randn(n, heads, channels, generator=gen, device=device, dtype=dtype)
        fwd, both, mem = bench_module(fn, g, inputs, device, args)
        s, idx = value.element_size(), graph.csr_by_dst.col.element_size()
        row = heads * channels * s
        extra = heads * s if kind == "gat" else 0
        floor_bytes = int(graph.num_edges * (rows_per_edge * row + idx + extra) + n * (row + heads * 8))
        if kind != "gat":
            floor_bytes += n * row  # the query of each destination
        rows.append(dict(graph=name, layer=f"graph_attention({kind})", impl="gnnio",
                         dtype=str(dtype).split(".")[-1], fwd_ms=fwd, fwd_bwd_ms=both,
                         peak_extra_gib=mem, floor_bytes=floor_bytes,
                         plan=gnnio.plan.plan_attention(graph, heads * channels, backward=True).reason
                         if x.is_cuda else "cpu"))
    return run


OPS = {"segment_reduce(max)": _bench_segment_reduce, "graph_attention(gat)": _bench_attention("gat"),
       "graph_attention(gatv2)": _bench_attention("gatv2"), "graph_attention(dot)": _bench_attention("dot"),
       "graph_attention(shared)": _bench_attention("shared"),
       training.LAYER: training.bench_train_step, "spmm(wsb)": bench_spmm_wsb,
       "graph_attention(wsb)": bench_attention_wsb}


def _bench_layer(name, layer, x, gout, ei, device, dtype, args, rows):
    case = LAYERS[layer]
    dt = str(dtype).split(".")[-1]
    ours = case.make_gnnio(x.size(1)).to(device=device, dtype=dtype)
    impls = [("gnnio", ours)]
    if args.compare == "pyg" and case.make_pyg is not None:
        ref = case.make_pyg(x.size(1)).to(device=device, dtype=dtype)
        ours.load_state_dict(ref.state_dict())
        impls.append(("pyg", ref))
    outputs = {}
    for impl, module in impls:
        params = [p for p in module.parameters() if p.requires_grad]
        fwd, both, mem = bench_module(lambda: module(x, ei), gout, [x] + params, device, args)
        outputs[impl] = module(x, ei)
        rows.append(dict(graph=name, layer=layer, impl=impl, dtype=dt, fwd_ms=fwd, fwd_bwd_ms=both,
                         peak_extra_gib=mem))
    if "pyg" in outputs:
        rows[-1]["max_rel_diff_vs_gnnio"] = rel_diff(outputs["pyg"], outputs["gnnio"])
    del outputs, impls, ours
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _save_json(result, path):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)


def have_matplotlib():
    return importlib.util.find_spec("matplotlib") is not None


def main(argv=None, prog=None):
    """Runs the benchmark (argv as on the command line; sys.argv[1:] when None) and returns the
    results dict. Bad input exits through argparse (status 2, message on stderr)."""
    if prog is None:
        prog = "gnnio-bench" if os.path.basename(sys.argv[0]) == "gnnio-bench" else "python -m gnnio.bench"
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    progress = Progress(len(args.graphs) * (1 + len(args.layers)))
    log = progress.log
    result = {
        "card": card_name(device), "torch": torch.__version__, "pyg": pyg_version(),
        "gnnio": gnnio.__version__, "date": datetime.date.today().isoformat(), "commit": git_commit(),
        "copy_tbps": copy_rate_tbps(device), "features": args.features, "reorder": args.reorder,
        "rows": [],
    }
    log(f"{result['card']}: copy rate {result['copy_tbps']:.3f} TB/s")
    args.save = lambda: _save_json(result, args.out)  # after each layer: a killed run keeps its rows
    try:
        for name in args.graphs:
            run_graph(name, args, device, dtype, result["rows"], progress)
    finally:
        progress.close()
    table = markdown_table(result)
    print(table, flush=True)
    if args.out:
        _save_json(result, args.out)
        md = os.path.splitext(args.out)[0] + ".md"
        with open(md, "w") as f:
            f.write(table)
        log(f"wrote {args.out} and {md}")
    if args.plot:
        if not have_matplotlib():
            log(f"matplotlib is not installed: no plot written to {args.plot} (pip install matplotlib)")
        else:
            from gnnio.bench.plot import write_plot

            os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
            write_plot(result, args.plot)
            log(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main()
