"""python -m gnnio.bench: gnnio against PyG (and torch.sparse for SpMM), same process, same
graph and inputs; prints a table and writes the results schema (JSON + markdown)."""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

import torch

import gnnio
import gnnio.plan
from gnnio.bench.cases import DEFAULT_LAYERS, LAYERS
from gnnio.bench.report import markdown_table
from gnnio.bench.timing import copy_rate_tbps, median_ms, peak_extra_gib

STANDARD = ["powerlaw-1M-16M", "uniform-1M-16M", "grid-1000x1000"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gnnio.bench", description=__doc__)
    p.add_argument("--graphs", default="cora",
                   help="comma list of graph names or .mtx paths; 'real' = every real graph found, "
                        "'standard' = %s" % ",".join(STANDARD))
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS),
                   help="comma list from: spmm, " + ", ".join(list(OPS) + list(LAYERS)))
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--compare", default="pyg", choices=["pyg", "none"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=None, help="default 5 on CUDA, 2 on CPU")
    p.add_argument("--repeat", type=int, default=None, help="default 20 on CUDA, 5 on CPU")
    p.add_argument("--out", default=None, help="JSON path (a .md is written beside it)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.graphs = _expand_graphs(args.graphs)
    args.layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    for layer in args.layers:
        if layer != "spmm" and layer not in LAYERS and layer not in OPS:
            p.error(f"unknown layer {layer!r}; choose from spmm, {', '.join(list(OPS) + list(LAYERS))}")
    if args.features <= 0:
        p.error("--features must be positive")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda asked for but torch sees no GPU")
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    args.repeat = args.repeat if args.repeat is not None else (20 if cuda else 5)
    return args


def _expand_graphs(spec):
    out = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "real":
            out += gnnio.datasets.available_real_graphs()
        elif name == "standard":
            out += STANDARD
        else:
            out.append(name)
    return list(dict.fromkeys(out))


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


def rel_diff(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item() if b.numel() else 0.0


def bench_module(fn_fwd, outputs_grad, inputs, device, args):
    """(fwd_ms, fwd_bwd_ms, peak_extra_gib) of a forward callable and its backward."""
    def fwd_bwd():
        out = fn_fwd()
        torch.autograd.grad(out, inputs, outputs_grad)

    fwd = median_ms(fn_fwd, device, args.warmup, args.repeat)
    both = median_ms(fwd_bwd, device, args.warmup, args.repeat)
    return fwd, both, peak_extra_gib(fwd_bwd, device)


def run_graph(name, args, device, dtype, rows, log):
    data = gnnio.datasets.load(name, seed=args.seed)
    n, ei = data.num_nodes, data.edge_index.to(device)
    e = ei.size(1)
    log(f"{name}: {n:,} nodes, {e:,} edges")

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

    for layer in args.layers:
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
        log(f"  {layer}: " + ", ".join(
            f"{r['impl']} fwd {r['fwd_ms']:.3f} ms" for r in rows
            if r["graph"] == name and r["layer"] == layer and r.get("fwd_ms") is not None))


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
        heads, channels = 4, max(1, x.size(1) // 4)
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        rand = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
        value = rand(n, heads, channels).requires_grad_()
        if kind == "gat":
            operands = dict(src_score=rand(n, heads).requires_grad_(), dst_score=rand(n, heads).requires_grad_())
            rows_per_edge = 1
        elif kind == "gatv2":
            operands = dict(key=value, query=rand(n, heads, channels).requires_grad_(),
                            att=rand(heads, channels).requires_grad_())
            rows_per_edge = 1  # key is value: one row per edge
        else:
            operands = dict(key=rand(n, heads, channels).requires_grad_(),
                            query=rand(n, heads, channels).requires_grad_(), scale=channels ** -0.5)
            rows_per_edge = 2
        inputs = [value] + [t for t in operands.values() if isinstance(t, torch.Tensor) and t is not value]
        fn = lambda: gnnio.ops.graph_attention(graph, kind, value, **operands)  # noqa: E731
        g = torch.randn(n, heads, channels, generator=gen, device=device, dtype=dtype)
        fwd, both, mem = bench_module(fn, g, inputs, device, args)
        s, idx = value.element_size(), graph.csr_by_dst.col.element_size()
        row = heads * channels * s
        extra = heads * s if kind == "gat" else 0
        floor_bytes = graph.num_edges * (rows_per_edge * row + idx + extra) + n * (row + heads * 8)
        if kind != "gat":
            floor_bytes += n * row  # the query of each destination
        rows.append(dict(graph=name, layer=f"graph_attention({kind})", impl="gnnio",
                         dtype=str(dtype).split(".")[-1], fwd_ms=fwd, fwd_bwd_ms=both,
                         peak_extra_gib=mem, floor_bytes=floor_bytes,
                         plan=gnnio.plan.plan_attention(graph, heads * channels, backward=True).reason
                         if x.is_cuda else "cpu"))
    return run


OPS = {"segment_reduce(max)": _bench_segment_reduce, "graph_attention(gat)": _bench_attention("gat"),
       "graph_attention(gatv2)": _bench_attention("gatv2"), "graph_attention(dot)": _bench_attention("dot")}


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


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if device.type == "cpu" and dtype != torch.float32:
        raise SystemExit("gnnio's CPU kernels run float32 and float64; use --device cuda for half types")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    result = {
        "card": card_name(device), "torch": torch.__version__, "pyg": pyg_version(),
        "gnnio": gnnio.__version__, "date": datetime.date.today().isoformat(), "commit": git_commit(),
        "copy_tbps": copy_rate_tbps(device), "features": args.features, "rows": [],
    }
    log(f"{result['card']}: copy rate {result['copy_tbps']:.3f} TB/s")
    for name in args.graphs:
        run_graph(name, args, device, dtype, result["rows"], log)
    table = markdown_table(result)
    print(table)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table)
        log(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
