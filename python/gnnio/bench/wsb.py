"""The ``spmm(wsb)`` rows: the tensor-core SpMM on weighted block-sparse tiles next to gnnio's
CSR spmm (cuSPARSE on CUDA), same process, graph and inputs. The issue's bar: on a locally dense
graph (``blockdiag-1M-16M``, a mesh or FEM matrix) WSB is at least 1.5x the CSR kernel.

Each gnnio row also carries what the tiles cost: ``fill_ratio`` (stored zeros / stored
entries), ``num_tiles`` and ``wsb_build_ms`` (both WSB structures from the edge list, the
one-time cost a Graph pays on first use, like the ``Graph`` row's CSR build)."""
import torch

import gnnio
from gnnio._ops import ops
from gnnio.bench.timing import bench_module, median_ms, rel_diff


def bench_spmm_wsb(name, x, gout, ei, n, device, dtype, args, rows):
    graph = gnnio.Graph(ei, num_nodes=n)
    dt = str(dtype).split(".")[-1]
    src, dst = graph._src, graph._dst
    build_ms = median_ms(lambda: (ops.wsb_from_coo(dst, src, n, n), ops.wsb_from_coo(src, dst, n, n)),
                         device, 1, 3)
    stats = graph.wsb_stats()
    tile_stats = dict(fill_ratio=stats["fill_ratio"], num_tiles=stats["num_tiles"],
                      edges_per_tile=stats["edges_per_tile"])

    def wsb():
        return gnnio.ops.spmm(graph, x, backend="wsb")

    def csr():
        return gnnio.ops.spmm(graph, x, backend="csr")

    fwd, both, mem = bench_module(wsb, gout, [x], device, args)
    ours = wsb()
    # Bytes the tiled product must move: each stored tile and its block column's 16 feature
    # rows once per tile (the tile's index too), the output once. At a fill ratio f this is
    # below the CSR floor (a feature row per edge) when a tile's 16 rows are shared by more
    # than 16 of its edges, that is (1 - f) x 256 > 16.
    itemsize, width = x.element_size(), x.size(1)
    idx = graph.wsb().block_col.element_size()
    floor_bytes = stats["num_tiles"] * (256 * itemsize + 16 * width * itemsize + idx) + n * width * itemsize
    rows.append(dict(graph=name, layer="spmm(wsb)", impl="gnnio", dtype=dt, fwd_ms=fwd,
                     fwd_bwd_ms=both, peak_extra_gib=mem, floor_bytes=floor_bytes,
                     wsb_build_ms=build_ms, **tile_stats))
    fwd, both, mem = bench_module(csr, gout, [x], device, args)
    rows.append(dict(graph=name, layer="spmm(wsb)", impl="gnnio-csr", dtype=dt, fwd_ms=fwd,
                     fwd_bwd_ms=both, peak_extra_gib=mem, max_rel_diff_vs_gnnio=rel_diff(csr(), ours)))
    del ours
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_attention_wsb(name, x, gout, ei, n, device, dtype, args, rows):
    """The ``graph_attention(wsb)`` rows: GAT attention (kind gat) on the tiles (impl ``gnnio``) next
    to the fused CSR kernels (``gnnio-csr``, split as the planner splits), 4 heads x
    features/4, the same value and scores, each needing a gradient. The floor counts what the
    tiled form must move: per tile its count entries (float32) and one 16-row block of value
    rows, per row its scores, out and stats."""
    from gnnio.bench.cases import attention_operands

    graph = gnnio.Graph(ei, num_nodes=n)
    dt = str(dtype).split(".")[-1]
    heads, channels = 4, max(1, x.size(1) // 4)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    rand = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
    value, operands, _ = attention_operands("gat", n, heads, channels, rand)
    inputs = [value, operands["src_score"], operands["dst_score"]]
    g = torch.randn(n, heads, channels, generator=gen, device=device, dtype=dtype)
    stats = graph.wsb_stats()

    def run(backend):
        return lambda: gnnio.ops.graph_attention(graph, "gat", value, backend=backend, **operands)

    graph.wsb_counts(), graph.wsb_counts(transpose=True)  # built once per graph, not timed
    fwd, both, mem = bench_module(run("wsb"), g, inputs, device, args)
    ours = run("wsb")()
    s, idx = value.element_size(), graph.wsb().block_col.element_size()
    floor_bytes = (stats["num_tiles"] * (256 * 4 + 16 * heads * channels * s + idx)
                   + n * (2 * heads * s + heads * channels * s + heads * 8))
    rows.append(dict(graph=name, layer="graph_attention(wsb)", impl="gnnio", dtype=dt,
                     fwd_ms=fwd, fwd_bwd_ms=both, peak_extra_gib=mem, floor_bytes=floor_bytes,
                     fill_ratio=stats["fill_ratio"], num_tiles=stats["num_tiles"],
                     edges_per_tile=stats["edges_per_tile"]))
    fwd, both, mem = bench_module(run("csr"), g, inputs, device, args)
    rows.append(dict(graph=name, layer="graph_attention(wsb)", impl="gnnio-csr", dtype=dt,
                     fwd_ms=fwd, fwd_bwd_ms=both, peak_extra_gib=mem,
                     max_rel_diff_vs_gnnio=rel_diff(run("csr")(), ours)))
    del ours
    if device.type == "cuda":
        torch.cuda.empty_cache()
