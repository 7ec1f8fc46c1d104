"""The planner: policy chosen from cheap graph statistics, kept apart from the kernels.

Each plan says what it chose and why (``reason``), so a user can see it and override it
(argument or environment variable). ``plan_reduce`` and ``plan_attention`` split heavy rows;
``spmm_backend`` picks CSR or WSB for each SpMM. ``gnnio.plan_layer`` (``Graph.plan``) gathers
them into one ``Plan`` for a layer, with the reason as text."""
import math
import os
from typing import List, NamedTuple, Optional, Tuple

import torch

from gnnio.wsb_attention import MAX_CHANNELS as WSB_ATTENTION_MAX_CHANNELS


class ReducePlan(NamedTuple):
    light_max_degree: int  # rows with more slots are "heavy": 2-D tiles instead of one warp
    edge_chunk: int  # slots per heavy work item
    heavy_rows: Optional[torch.Tensor]  # int64 [H]
    heavy_items: Optional[torch.Tensor]  # int64 [I, 3]: (heavy index, first slot, end slot)
    reason: str
    # The same split of the transpose (sources by out-degree), for the backward pass.
    light_max_out_degree: int = 2**62
    heavy_src: Optional[torch.Tensor] = None
    heavy_src_items: Optional[torch.Tensor] = None


# Initial values, not yet tuned on the H200 (the reduction issue's benchmark will set them):
# a warp walking more than ~256 slots, or 16x the mean degree, is the long pole of its launch;
# 2048 slots per tile keeps ~1K tiles busy for a 2M-neighbour row.
MIN_HEAVY_DEGREE = 256
HEAVY_OVER_MEAN = 16
EDGE_CHUNK = 2048
NODE_PARALLEL = 2**62
_REDUCE_FORCED = ReducePlan(NODE_PARALLEL, EDGE_CHUNK, None, None, "node-parallel: forced")


def split_rows(rowptr: torch.Tensor, threshold: int, chunk: int = EDGE_CHUNK,
               max_items: Optional[int] = None):
    """Rows of a CSR with more than ``threshold`` slots and their work items
    (heavy index, first slot, end slot) of at most ``chunk`` slots, in row then slot order.
    With ``max_items``, a row of more than chunk x max_items slots is cut into max_items items
    of ceil(degree / max_items) slots instead (the last one shorter)."""
    deg = (rowptr[1:] - rowptr[:-1]).long()
    heavy = (deg > threshold).nonzero().view(-1)
    begin = rowptr[heavy].long()
    heavy_deg = deg[heavy]
    row_chunk = torch.full_like(heavy_deg, chunk)
    if max_items is not None:
        row_chunk = torch.maximum(row_chunk, (heavy_deg + max_items - 1) // max_items)
    chunks = (heavy_deg + row_chunk - 1) // row_chunk
    owner = torch.repeat_interleave(torch.arange(heavy.numel(), device=deg.device), chunks)
    first_chunk = torch.cumsum(chunks, 0) - chunks
    index = torch.arange(owner.numel(), device=deg.device) - first_chunk[owner]
    start = begin[owner] + index * row_chunk[owner]
    end = torch.minimum(start + row_chunk[owner], begin[owner] + heavy_deg[owner])
    return heavy.contiguous(), torch.stack([owner, start, end], 1).contiguous()


class _Split(NamedTuple):
    threshold: int  # rows with more slots are heavy
    max_degree: int
    heavy: Optional[torch.Tensor]  # None when no row is above the threshold
    items: Optional[torch.Tensor]


def _heavy_split(graph, side: str, min_heavy: int, over_mean: float, chunk: int,
                 max_items: Optional[int] = None, min_longest: int = 0) -> _Split:
    """The light/heavy split of csr_by_dst (``side='dst'``) or of the transpose (``'src'``):
    rows above max(min_heavy, over_mean x that side's mean degree), cut into ``chunk``-slot work
    items (at most ``max_items`` per row, split_rows); none unless the longest row is above
    ``min_longest`` too. Cached on the Graph per (side, threshold, chunk, max_items), whichever
    family asks."""
    if side == "dst":
        stats = graph.stats()
        mean, max_degree = stats["mean_in_degree"], stats["max_in_degree"]
    else:  # the source side's own mean: E / num_src differs from E / num_dst when bipartite
        mean, max_degree = graph.num_edges / max(graph.num_src, 1), graph.max_out_degree()
    threshold = int(max(min_heavy, over_mean * mean))
    if max_degree <= max(threshold, min_longest):
        return _Split(threshold, max_degree, None, None)
    csr = (lambda: graph.csr_by_dst) if side == "dst" else (lambda: graph.csr_by_src)
    heavy, items = graph._cached(("split", side, threshold, chunk, max_items),
                                 lambda: split_rows(csr().rowptr, threshold, chunk, max_items))
    return _Split(threshold, max_degree, heavy, items)


def _memo(graph, key, compute):
    """compute() cached on the Graph under key (eager only): a plan is a pure function of the
    graph and key, and building one (statistics, reason text) costs microseconds per call, which
    is 10-25% of a small graph's whole op (measured in the planner study)."""
    if torch.compiler.is_compiling():
        return compute()
    memo = graph.__dict__.get("_plan_memo")
    if memo is None:
        memo = graph.__dict__["_plan_memo"] = {}
    else:
        hit = memo.get(key)
        if hit is not None:
            return hit
    value = memo[key] = compute()
    return value


# The forcing variables are read on every call (a variable set or removed between two calls is
# honoured by the second), but os.environ.get costs ~0.7 us (it encodes the name and decodes the
# value in Python), as much as the rest of a memoised plan. CPython's os.environ keeps its
# entries in a dict of encoded names; _getenv reads that dict with the name encoded once. Where
# os.environ is not CPython's mapping (replaced by a dict in a test, another interpreter) it is
# os.environ.get, and so it is while torch.compile traces (_env): dynamo folds os.environ.get.
_ENVIRON_TYPE = type(os.environ)
_FAST_ENV = (isinstance(getattr(os.environ, "_data", None), dict)
             and callable(getattr(os.environ, "encodekey", None))
             and callable(getattr(os.environ, "decodevalue", None)))
_ENV_KEYS: dict = {}


def _getenv(name: str) -> Optional[str]:
    """os.environ.get(name), read per call (eager), about 4x cheaper."""
    env = os.environ
    if not _FAST_ENV or type(env) is not _ENVIRON_TYPE:
        return env.get(name)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = env.encodekey(name)
    raw = env._data.get(key)
    return None if raw is None else env.decodevalue(raw)


def _env(name: str, compiling: Optional[bool] = None) -> Optional[str]:
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    return os.environ.get(name) if compiling else _getenv(name)


def _memo_hit(graph, key):
    """The memoised plan of key, or None (eager callers only: the hot path without a closure)."""
    memo = graph.__dict__.get("_plan_memo")
    return None if memo is None else memo.get(key)


def plan_reduce(graph, dtype: torch.dtype, degree_aware: Optional[bool] = None,
                backward: bool = False) -> ReducePlan:
    """Light/heavy split for segment_reduce on ``graph`` (CUDA); with ``backward`` also the split
    of the transpose that the backward pass walks. ``degree_aware=False`` (or
    GNNIO_REDUCE=node) gives the plain node-parallel variant, for comparison."""
    compiling = torch.compiler.is_compiling()
    if degree_aware is None:
        degree_aware = _env("GNNIO_REDUCE", compiling) != "node"
    if not degree_aware:
        return _REDUCE_FORCED
    key = ("reduce", dtype is torch.float64, bool(backward))
    hit = None if compiling else _memo_hit(graph, key)
    return hit if hit is not None else _memo(graph, key, lambda: _plan_reduce_split(graph, dtype, backward))


def _plan_reduce_split(graph, dtype: torch.dtype, backward: bool) -> ReducePlan:
    if graph.num_edges >= 2**32:
        return ReducePlan(NODE_PARALLEL, EDGE_CHUNK, None, None,
                          "node-parallel: slots do not fit the packed 32-bit key")
    parts = []
    heavy_rows = heavy_items = heavy_src = heavy_src_items = None
    light_max, light_max_out = NODE_PARALLEL, NODE_PARALLEL
    if dtype == torch.float64:
        parts.append("forward node-parallel: float64 values do not fit the packed 32-bit key")
    else:
        fwd = _heavy_split(graph, "dst", MIN_HEAVY_DEGREE, HEAVY_OVER_MEAN, EDGE_CHUNK)
        if fwd.heavy is None:
            parts.append(f"forward node-parallel: max in-degree {fwd.max_degree} <= {fwd.threshold}")
        else:
            heavy_rows, heavy_items, light_max = fwd.heavy, fwd.items, fwd.threshold
            parts.append(f"degree-aware: {heavy_rows.numel()} rows above {fwd.threshold} slots "
                         f"(max {fwd.max_degree}, mean {graph.stats()['mean_in_degree']:.1f}) "
                         f"split into {heavy_items.size(0)} tiles of {EDGE_CHUNK}")
    if backward:
        bwd = _heavy_split(graph, "src", MIN_HEAVY_DEGREE, HEAVY_OVER_MEAN, EDGE_CHUNK)
        if bwd.heavy is None:
            parts.append(f"backward node-parallel: max out-degree {bwd.max_degree} <= {bwd.threshold}")
        else:
            heavy_src, heavy_src_items, light_max_out = bwd.heavy, bwd.items, bwd.threshold
            parts.append(f"backward: {heavy_src.numel()} sources above {bwd.threshold} out-edges "
                         f"(max {bwd.max_degree}) split into {heavy_src_items.size(0)} tiles")
    return ReducePlan(light_max, EDGE_CHUNK, heavy_rows, heavy_items, "; ".join(parts),
                      light_max_out, heavy_src, heavy_src_items)


class AttentionPlan(NamedTuple):
    light_max_degree: int
    heavy_rows: Optional[torch.Tensor]
    heavy_items: Optional[torch.Tensor]
    reason: str
    light_max_out_degree: int = NODE_PARALLEL
    heavy_src: Optional[torch.Tensor] = None
    heavy_src_items: Optional[torch.Tensor] = None


# A lane group walks one (node, head) row one slot step at a time; rows far above the mean
# degree are split into chunks of ATTENTION_CHUNK slots whose partial (max, sum, accumulator)
# are merged exactly afterwards. A chunk is a serial walk (~1 us per 4 slots), so it is kept
# short: 1024-slot chunks were the long pole of the launch in the first measurement (NOTES).
ATTENTION_CHUNK = 128
# A split shortens a heavy row's walk to ATTENTION_CHUNK slots and costs the merge kernel's
# launch, about a 32-slot walk: it pays from ATTENTION_CHUNK + 32 slots. The planner studies:
# IMDB-BINARY's 135-slot rows split ran 1.01-1.23x slower than unsplit (now unsplit).
ATTENTION_MIN_HEAVY = ATTENTION_CHUNK + 32
# A graph is split only if its longest row is above two chunks: below that the split shortens
# the launch's longest walk by less than a chunk, and on the small graphs whose only heavy
# rows are that short the merge launch costs more. cora's and pubmed's longest rows (168 and
# 171 slots, the only ones above 160) ran 1.11-1.28x and 1.00-1.17x faster unsplit at 804bade
# (every pass, float32 and bfloat16; pubmed's float32 forward a tie), cora's fwd+bwd 1.06-1.12x
# in the two studies before; only da5855b's, on kernels since changed, had pubmed 1.02-1.21x
# faster split. wiki-Vote (457 slots, 1.3-2.3x faster split) and every larger hub keep their
# split (bench/NOTES.md, "Planner study").
ATTENTION_MIN_LONGEST = 2 * ATTENTION_CHUNK
# A heavy row's items are merged by one block per (row, head) of 16 lane groups, each walking
# its share of the items in batches of 4 loads; the 2M-slot hub of powerlaw-1M-16M in 128-slot
# chunks is 15.6K items per head, ~250 dependent rounds a group, the merges' long pole. Rows
# above 2048 x 128 slots get 2048 longer chunks instead: the hub's ~1K-slot items are the first
# tasks of their launch (items start first) and end well inside it (bench/NOTES.md, v12).
ATTENTION_MAX_ITEMS = 2048
ATTENTION_OVER_MEAN = 8
_ATTENTION_FORCED = AttentionPlan(NODE_PARALLEL, None, None, "node-parallel: forced")


def plan_attention(graph, width: int, backward: bool = False,
                   degree_aware: Optional[bool] = None) -> AttentionPlan:
    """Super-node split for graph_attention on CUDA: destinations (and, with ``backward``,
    sources) whose degree would make one warp the long pole of the launch. ``width`` = heads x
    channels. GNNIO_ATTENTION=node forces the unsplit kernel."""
    compiling = torch.compiler.is_compiling()
    if degree_aware is None:
        degree_aware = _env("GNNIO_ATTENTION", compiling) != "node"
    if not degree_aware:
        return _ATTENTION_FORCED
    key = ("attention", bool(backward))
    hit = None if compiling else _memo_hit(graph, key)
    return hit if hit is not None else _memo(graph, key, lambda: _plan_attention_split(graph, backward))


# GAT attention on WSB tiles against the fused CSR kernels. The tile kernels cost about the same
# per tile whatever it holds, the CSR kernels per edge, so the choice is a threshold on the edges
# per tile: the break-even of blockdiag-1M-16M's per-tile and per-edge times (its full tiles are
# the dearest per tile; grid-1000x1000's give 29-60), 4 heads x 32 (bench/NOTES.md "WSB
# attention"). Heads of up to 32 channels run the narrow build (csrc/gnnio/wsb/policy.h),
# measured on an H100 at f4c2204: tiles 3.08x / 2.03x the CSR kernels (float32 as tf32, forward /
# forward+backward), 3.33x / 2.54x in bfloat16; grid 0.32x / 0.26x and 0.35x / 0.32x; break-even
# 83 / 126 (float32) and 77 / 101 (bfloat16) edges a tile, rounded up. Wider heads run the wide
# build, whose only measurement is v1's (H200, 4cd5c09, before the narrow build and the cp.async
# staging: 1.98x / 1.36x and 2.36x / 1.76x at 32 channels): its break-even points, the
# conservative side for a build that has since only gained. float16 is taken as bfloat16 (not
# measured).
WSB_ATTENTION_MIN_EDGES_PER_TILE = {torch.float32: 85.0, torch.bfloat16: 80.0, torch.float16: 80.0}
WSB_ATTENTION_MIN_EDGES_PER_TILE_TRAINING = {torch.float32: 130.0, torch.bfloat16: 105.0,
                                             torch.float16: 105.0}
WSB_ATTENTION_WIDE_MIN_EDGES_PER_TILE = {torch.float32: 130.0, torch.bfloat16: 110.0,
                                         torch.float16: 110.0}
WSB_ATTENTION_WIDE_MIN_EDGES_PER_TILE_TRAINING = {torch.float32: 190.0, torch.bfloat16: 150.0,
                                                  torch.float16: 150.0}
# policy.h's kNarrowChannels: heads up to this width run the narrow build. The widest head the
# tiles take is the kernels' (gnnio.wsb_attention.MAX_CHANNELS), imported above.
WSB_ATTENTION_NARROW_CHANNELS = 32
# Every measurement was on graphs of 10^6 rows; smaller ones (launch-bound, not measured) stay on
# the CSR kernels.
WSB_ATTENTION_MIN_ROWS = 1 << 16
# Measured at 32 channels a head. Narrower heads weigh a tile's fixed loads (its count tile, its
# 16 scores) more against the CSR kernels' per-edge rows: SpMM's byte model puts the break-even
# at 8 channels near 1.8-2.3x the thresholds, beyond what a tile holds. Not measured: auto
# keeps narrower heads on the CSR kernels.
WSB_ATTENTION_MIN_CHANNELS = 32
# One warp walks a block row's tiles (a head each): powerlaw-1M-16M's hub block row, 62,500
# tiles, took ~400 of its 492 ms, ~6 us a tile. A block row of 64 tiles is then ~0.4 ms, a
# fraction of a 10^6-row CSR call; more would make one warp the long pole.
WSB_ATTENTION_MAX_TILES_PER_BLOCK_ROW = 64


def attention_backend(backend: Optional[str] = None, compiling: Optional[bool] = None,
                      graph=None, dtype: Optional[torch.dtype] = None, training: bool = False,
                      device_type: Optional[str] = None, channels: Optional[int] = None):
    """(backend, reason) of a GAT graph_attention call: 'csr' (the fused CSR kernels, split by
    plan_attention) or 'wsb' (16 x 16 tiles, gnnio/wsb_attention.py). The argument wins;
    otherwise GNNIO_ATTENTION_BACKEND=csr|wsb|auto. Auto: on CUDA, WSB where the graph's
    ``edges_per_tile`` reaches WSB_ATTENTION_MIN_EDGES_PER_TILE[dtype] (``_TRAINING`` when a
    backward follows) for heads of up to WSB_ATTENTION_NARROW_CHANNELS channels, the
    ``WSB_ATTENTION_WIDE_`` tables for wider heads or when ``channels`` is not given, float32
    only where torch allows tf32 matmuls (PyG parity otherwise);
    'csr' without a graph (other kinds, or a call the tiles cannot run), on the CPU, for float64,
    under WSB_ATTENTION_MIN_ROWS rows, under WSB_ATTENTION_MIN_CHANNELS channels a head, and
    where a block row holds more than WSB_ATTENTION_MAX_TILES_PER_BLOCK_ROW tiles (a super node
    included; the tile kernels give a block row to one warp). ``device_type``: the device the
    choice is for (default: the graph's; Graph.plan asks for 'cuda')."""
    forced = _forced_backend(backend, "GNNIO_ATTENTION_BACKEND", compiling)
    if forced is not None:
        return forced
    if graph is None or dtype is None:
        return "csr", "csr: WSB attention takes kind 'gat'"
    if (device_type or graph.device.type) != "cuda":
        return "csr", "csr: on the CPU the tile kernels are a reference, not a faster path"
    narrow = channels is not None and channels <= WSB_ATTENTION_NARROW_CHANNELS
    if narrow:
        table = WSB_ATTENTION_MIN_EDGES_PER_TILE_TRAINING if training else WSB_ATTENTION_MIN_EDGES_PER_TILE
    else:  # the wide build, or a width not given: the conservative table
        table = (WSB_ATTENTION_WIDE_MIN_EDGES_PER_TILE_TRAINING if training
                 else WSB_ATTENTION_WIDE_MIN_EDGES_PER_TILE)
    threshold = table.get(dtype)
    if threshold is None:
        return "csr", f"csr: {_DTYPE_NAMES.get(dtype, dtype)} does not run on tensor-core tiles"
    if graph.num_edges == 0:
        return "csr", "csr: no edges"
    if channels is not None and channels > WSB_ATTENTION_MAX_CHANNELS:
        return "csr", (f"csr: {channels} channels a head (the tiles stage at most "
                       f"{WSB_ATTENTION_MAX_CHANNELS})")
    if channels is not None and channels < WSB_ATTENTION_MIN_CHANNELS:
        return "csr", (f"csr: {channels} channels a head (the tiles were measured at 32; narrower "
                       f"heads stay on the CSR kernels)")
    if graph.num_dst < WSB_ATTENTION_MIN_ROWS:
        return "csr", (f"csr: {graph.num_dst} destination rows (the tiles were measured against the "
                       f"CSR kernels on 10^6-row graphs only; below {WSB_ATTENTION_MIN_ROWS} rows "
                       f"auto keeps the CSR kernels)")
    if dtype == torch.float32 and not _tf32_allowed():
        return "csr", ("csr: float32 tiles would multiply in tf32, which torch.backends.cuda.matmul "
                       "does not allow now (PyG's float32 numerics)")
    key = ("attention-wsb", dtype, bool(training), narrow)  # channels: only the build's table
    hit = None if (compiling or torch.compiler.is_compiling()) else _memo_hit(graph, key)
    if hit is not None:
        return hit

    def rule():
        # The tile kernels give a block row (a head) to one warp, with no super-node split: a
        # hub's block row would be one warp's walk (a 10^6-neighbour hub alone averages ~150
        # edges a tile). Rows the CSR kernels would split keep the call on them.
        for side in ("dst", "src") if training else ("dst",):
            split = _heavy_split(graph, side, ATTENTION_MIN_HEAVY, ATTENTION_OVER_MEAN,
                                 ATTENTION_CHUNK, ATTENTION_MAX_ITEMS, ATTENTION_MIN_LONGEST)
            if split.heavy is not None:
                return "csr", (f"csr: {split.heavy.numel()} super nodes ({'in' if side == 'dst' else 'out'}-"
                               f"degree above {split.threshold}): the tile kernels walk a block row "
                               f"in one warp, the CSR kernels split it")
        ept = graph.wsb_stats()["edges_per_tile"]
        when = "training" if training else "inference"
        if narrow:
            build = f"heads of <= {WSB_ATTENTION_NARROW_CHANNELS} channels"
            measured = ("H100, 32 channels a head: tiles 3.08x / 2.03x the CSR kernels at 256 edges "
                        "a tile in float32, 3.33x / 2.54x in bfloat16; 0.26-0.35x at 9.2")
        else:
            build = "the wide heads' break-even"
            measured = ("H200, the wide build before its cp.async staging: tiles 1.98x / 1.36x at "
                        "256 edges a tile in float32, 2.36x / 1.76x in bfloat16; 0.15-0.22x at 9.2")
        if ept >= threshold:
            # Only now (a locally dense graph) the tiles themselves: their longest block row.
            for transpose in (False, True) if training else (False,):
                longest = int(graph.wsb(transpose).block_rowptr.diff().max())  # (edges: checked above)
                if longest > WSB_ATTENTION_MAX_TILES_PER_BLOCK_ROW:
                    return "csr", (f"csr: a {'source' if transpose else 'destination'} block row "
                                   f"holds {longest} tiles (> {WSB_ATTENTION_MAX_TILES_PER_BLOCK_ROW}"
                                   f"; one warp walks it) though the graph averages {ept:.1f} edges "
                                   f"per tile")
            return "wsb", (f"wsb: {ept:.1f} edges per 16 x 16 tile >= {threshold:g} ({when}, "
                           f"{_DTYPE_NAMES.get(dtype, dtype)}, {build}; {measured})")
        return "csr", (f"csr: {ept:.1f} edges per 16 x 16 tile < {threshold:g} ({when}, "
                       f"{_DTYPE_NAMES.get(dtype, dtype)}, {build}; {measured})")
    return _memo(graph, key, rule)


def _plan_attention_split(graph, backward: bool) -> AttentionPlan:
    parts = []
    heavy_src = heavy_src_items = None
    light_max, light_max_out = NODE_PARALLEL, NODE_PARALLEL
    fwd = _heavy_split(graph, "dst", ATTENTION_MIN_HEAVY, ATTENTION_OVER_MEAN, ATTENTION_CHUNK,
                       ATTENTION_MAX_ITEMS, ATTENTION_MIN_LONGEST)
    heavy_rows, heavy_items = fwd.heavy, fwd.items
    if heavy_rows is not None:
        light_max = fwd.threshold
        parts.append(f"super nodes: {heavy_rows.numel()} destinations above {fwd.threshold} "
                     f"edges (max {fwd.max_degree}) split into {heavy_items.size(0)} chunks "
                     f"of {ATTENTION_CHUNK} (at most {ATTENTION_MAX_ITEMS} per row)")
    elif fwd.max_degree > fwd.threshold:
        parts.append(f"no super nodes: max in-degree {fwd.max_degree} is above {fwd.threshold} "
                     f"but not two chunks ({ATTENTION_MIN_LONGEST}), where a split saves less "
                     f"than its merge launch")
    else:
        parts.append(f"no super nodes: max in-degree {fwd.max_degree} <= {fwd.threshold}")
    if backward:
        bwd = _heavy_split(graph, "src", ATTENTION_MIN_HEAVY, ATTENTION_OVER_MEAN, ATTENTION_CHUNK,
                           ATTENTION_MAX_ITEMS, ATTENTION_MIN_LONGEST)
        if bwd.heavy is not None:
            heavy_src, heavy_src_items, light_max_out = bwd.heavy, bwd.items, bwd.threshold
            parts.append(f"backward: {heavy_src.numel()} sources above {bwd.threshold} "
                         f"out-edges (max {bwd.max_degree}) split")
    return AttentionPlan(light_max, heavy_rows, heavy_items, "; ".join(parts), light_max_out,
                         heavy_src, heavy_src_items)


# ---------------------------------------------------------------------------------------------
# SpMM backend: CSR (cuSPARSE or gnnio's row-warp kernel, chosen in C++ by
# csrc/gnnio/spmm/policy.h) or the tensor-core WSB kernel on 16 x 16 tiles.
#
# WSB multiplies every stored entry of a tile, so it pays when a tile holds many edges. The
# deciding statistic is edges per tile (Graph.wsb_stats(); duplicates count, as each is one
# gather for the CSR kernel). Measured on the H200, WSB against gnnio's CSR spmm (cuSPARSE),
# 128 features, speedup forward / forward+backward (bench/results/nvidia-h200-wsb-*.md):
#
#   edges/tile  graph             float32 (tf32)   bfloat16
#   256         blockdiag-1M-16M  2.73x / 2.73x    5.06x / 4.88x
#   39.4        bcsstk13          0.80x / 1.29x    1.50x / 1.25x
#   20.5        bcsstk25          0.94x / 1.38x    1.35x / 1.22x
#   9.2         grid-1000x1000    0.45x / 0.45x    0.73x / 0.73x
#   7.3         delaunay-n16      0.38x / 0.46x    0.70x / 0.96x
#   1.6         powerlaw-1M-16M   0.04x / 0.04x    0.10x / 0.10x
#
# 16-bit: WSB wins both ways from 20.5 edges per tile and loses at 9.2, so the threshold is 16,
# in between and next to the byte model's break-even (below: ~17.6 at 128 features). float16
# was not measured; it has bfloat16's MMA shape and bytes, so it shares the threshold.
# float32 (tf32, m16n16k8 and twice the tile bytes): first set to 64 from the forward above
# (0.94x at 20.5, 0.80x at 39.4). The first planner study (bench/NOTES.md, "Planner study";
# its results file since replaced by later runs; two float32 rows per graph: WSB runs as tf32
# in both) then measured WSB ahead in both passes at 39.4 and 45.0 edges per tile (bcsstk13
# 0.89x / 0.88x of CSR's time, IMDB-BINARY 0.77x / 0.83x) and the forward still 1.7x slower
# at 20.5 (bcsstk25), so the threshold is 32.
#
# Small graphs, 16-bit: on graphs of at most WSB_SMALL_ROWS destination rows the whole product
# takes 20-80 us, and CSR's per-call cost on them is higher than WSB's (H200, bfloat16 forward:
# CSR ~22 us + 0.4 ns per row, WSB ~12 us + 1.3-1.8 ns per tile). The planner study measured
# bfloat16 WSB ahead in both passes at 9.7 and 11.5 edges per tile (NCI1, 123K rows: 0.72x /
# 0.69x of CSR's time; PROTEINS, 43K rows: 0.85x / 0.84x) and behind at 7.3 (delaunay-n16,
# 66K rows: 1.41x forward), while the 1M-row grid at 9.2 keeps CSR (1.38x), so the threshold is
# 8 on such graphs. float32 (tf32) stays at 32 on them: PROTEINS' tf32 forward is 1.32x slower.
# Not separated by either rule (no choice keeps both passes within 10%): citeseer and
# luxembourg-osm bfloat16 (WSB loses the forward by 1.56x / 1.11x and wins forward+backward by
# 0.82x / 0.88x) and bcsstk25 tf32 (1.71x / 0.79x); they keep CSR.
#
# Training on small graphs: a call whose x needs a gradient is followed by the backward, and
# the choice is then by forward+backward, where WSB gains more than in the forward alone: its
# backward is the same tile product on the transposed tiles, while CSR's small backward calls
# cost more than its forward (H200 planner studies da5855b, 4fd24bb's noise-fix run and e86a9a0,
# forward+backward, WSB against CSR on graphs of at most WSB_SMALL_ROWS rows). float32 (tf32):
# WSB ahead at 9.7 (NCI1: 1.44x, 1.23x, then 0.94x in e86a9a0), 11.5 (PROTEINS, 1.20-1.24x) and
# 20.5 (bcsstk25, 1.17-1.38x) edges per tile, behind at 7.3 (delaunay-n16, 0.63-0.71x) and 5.5
# (luxembourg-osm, 0.77-0.95x): 8.5. 16-bit: WSB ahead at 5.5 (luxembourg-osm, 1.31-1.37x) and
# 7.3 (delaunay-n16, 1.24-1.36x), behind at 3.2 (as20000102, 0.49x) and 2.8 (email-Enron,
# 0.25x): 4. Not separated: citeseer and cora bfloat16 (1.2 / 1.4 edges per tile, 3K rows: WSB
# ahead by 1.22-1.30x / 1.13-1.20x) sit below five graphs where WSB loses (p2p-Gnutella31 1.5,
# soc-Slashdot0902 1.5, wiki-Vote 2.1, email-Enron 2.8, as20000102 3.2 edges per tile) and just
# above pubmed (1.1, 0.37x); they keep CSR. A forward without a gradient of x (inference) keeps
# the forward's rule.
WSB_MIN_EDGES_PER_TILE = {torch.float32: 32.0, torch.float16: 16.0, torch.bfloat16: 16.0}
WSB_SMALL_ROWS = 2**18  # 262,144: NCI1 (122,747) is below, grid-1000x1000 (10^6) far above
WSB_MIN_EDGES_PER_TILE_SMALL = {torch.float16: 8.0, torch.bfloat16: 8.0}
WSB_MIN_EDGES_PER_TILE_SMALL_TRAINING = {torch.float32: 8.5, torch.float16: 4.0, torch.bfloat16: 4.0}
WSB_REFERENCE_WIDTH = 128  # the measured width; other widths scale the threshold by the model
# PyTorch's default keeps float32 matmuls in full precision; WSB runs float32 as tf32 (~1e-3
# relative, docs/wsb.md), which would break the float32 parity with PyG. So the planner picks
# WSB for float32 only where tf32 is allowed (torch.set_float32_matmul_precision('high') or
# torch.backends.cuda.matmul.fp32_precision = 'tf32'); an explicit backend='wsb' or
# GNNIO_SPMM_BACKEND=wsb runs it anyway.
WSB_FLOAT32_NEEDS_TF32 = True

# (edges per tile, graph, destination rows, {dtype: (forward speedup, forward+backward
# speedup)}) of WSB against CSR at 128 features: bench/results/nvidia-h200-wsb-*.md, and the
# planner study for IMDB-BINARY, PROTEINS and NCI1 (float32 there: the mean of its two rows;
# NCI1's float32 forward+backward: the mean of the three studies' tf32 rows).
_WSB_MEASURED = (
    (256.0, "blockdiag-1M-16M", 10**6, {torch.float32: (2.73, 2.73), torch.bfloat16: (5.06, 4.88)}),
    (45.0, "IMDB-BINARY", 19773, {torch.float32: (1.30, 1.20), torch.bfloat16: (1.49, 1.25)}),
    (39.4, "bcsstk13", 2003, {torch.float32: (0.80, 1.29), torch.bfloat16: (1.50, 1.25)}),
    (20.5, "bcsstk25", 15439, {torch.float32: (0.94, 1.38), torch.bfloat16: (1.35, 1.22)}),
    (11.5, "PROTEINS", 43471, {torch.float32: (0.76, 1.16), torch.bfloat16: (1.18, 1.19)}),
    (9.7, "NCI1", 122747, {torch.float32: (0.91, 1.20), torch.bfloat16: (1.39, 1.45)}),
    (9.2, "grid-1000x1000", 10**6, {torch.float32: (0.45, 0.45), torch.bfloat16: (0.73, 0.73)}),
    (7.3, "delaunay-n16", 65536, {torch.float32: (0.38, 0.46), torch.bfloat16: (0.70, 0.96)}),
    (1.6, "powerlaw-1M-16M", 10**6, {torch.float32: (0.04, 0.04), torch.bfloat16: (0.10, 0.10)}),
)

SPMM_BACKENDS = ("csr", "wsb", "auto")
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def _break_even(width: int, dtype: torch.dtype) -> float:
    """Edges per tile at which WSB and CSR move the same bytes: a tile loads its 16 x F block of
    x and 256 values; a CSR edge gathers one x row, its value and a 4-byte column."""
    s = torch.finfo(dtype).bits // 8
    return s * (16 * width + 256) / (s * width + s + 4)


def wsb_threshold(width: int, dtype: torch.dtype, num_rows: Optional[int] = None,
                  training: bool = False) -> float:
    """Edges per 16 x 16 tile from which the planner picks WSB on CUDA for ``width`` features of
    ``dtype`` on a graph of ``num_rows`` destination rows (None: a large graph): the measured
    threshold at 128 features (lower on graphs of at most WSB_SMALL_ROWS rows: for 16-bit
    always, and for ``training``, a call followed by its backward, lower still and for float32
    too), raised for narrower features by the byte model (a tile's 256 values weigh more against
    a narrow x block; not measured), never lowered. ``inf`` for dtypes WSB does not run on CUDA
    (float64)."""
    base = WSB_MIN_EDGES_PER_TILE.get(dtype)
    if base is None:
        return float("inf")
    if num_rows is not None and num_rows <= WSB_SMALL_ROWS:
        small = WSB_MIN_EDGES_PER_TILE_SMALL_TRAINING if training else WSB_MIN_EDGES_PER_TILE_SMALL
        base = small.get(dtype, base)
    scale = _break_even(max(int(width), 1), dtype) / _break_even(WSB_REFERENCE_WIDTH, dtype)
    return base * max(1.0, scale)


# torch.backends.cuda.matmul.fp32_precision is a Python __getattr__ around this getter (~1 us
# per call through the property, ~0.2 us direct).
_FP32_PRECISION = getattr(torch._C, "_get_fp32_precision_getter", None)


@torch.compiler.assume_constant_result
def _tf32_allowed() -> bool:
    # Reading the flag is opaque to torch.compile: a constant of the traced graph (a change of
    # the setting recompiles, as torch guards its global matmul state).
    if _FP32_PRECISION is not None:
        return _FP32_PRECISION("cuda", "matmul") == "tf32"
    return torch.backends.cuda.matmul.fp32_precision == "tf32"


def _forced_backend(backend: Optional[str], variable: str, compiling: Optional[bool] = None):
    """(backend, source) when the argument or the environment variable names 'csr' or 'wsb',
    else None (the planner decides). An explicit argument, 'auto' included, wins over the
    variable. Shared by the SpMM (GNNIO_SPMM_BACKEND) and attention (GNNIO_ATTENTION_BACKEND)
    families, which offer the same three choices."""
    if backend is not None:
        if backend not in SPMM_BACKENDS:
            raise ValueError(f"backend must be 'csr', 'wsb', 'auto' or None, got {backend!r}")
        return None if backend == "auto" else (backend, f"backend={backend!r}")
    env = _env(variable, compiling)
    if env is None or env == "" or env == "auto":
        return None
    if env not in ("csr", "wsb"):
        raise ValueError(f"{variable} must be 'csr', 'wsb' or 'auto', got {env!r}")
    return env, f"{variable}={env}"


def _forced_spmm_backend(backend: Optional[str], compiling: Optional[bool] = None):
    """_forced_backend for the SpMM family (GNNIO_SPMM_BACKEND)."""
    return _forced_backend(backend, "GNNIO_SPMM_BACKEND", compiling)


class _SpmmRule(NamedTuple):
    wsb: bool
    why: str  # 'dtype', 'empty', 'tf32', 'tiles'
    threshold: float
    stats: Optional[dict]
    small: bool = False  # the small-graph threshold applied


def _spmm_rule(graph, width: int, dtype: torch.dtype, want_stats: bool = False,
               training: bool = False) -> _SpmmRule:
    """The planner's CUDA choice between CSR and WSB (not forced). Tile statistics are computed
    (one sort of the edges' tile keys, cached on the Graph) only where they decide, or with
    ``want_stats`` (for a plan's reason)."""
    threshold = wsb_threshold(width, dtype, graph.num_dst, training)
    small = threshold != wsb_threshold(width, dtype)
    if threshold == float("inf"):
        return _SpmmRule(False, "dtype", threshold, None)
    if graph.num_edges == 0 or width == 0:
        return _SpmmRule(False, "empty", threshold, None, small)
    if dtype == torch.float32 and WSB_FLOAT32_NEEDS_TF32 and not _tf32_allowed():
        return _SpmmRule(False, "tf32", threshold, graph.wsb_stats() if want_stats else None,
                         small)
    stats = graph.wsb_stats()
    return _SpmmRule(stats["edges_per_tile"] >= threshold, "tiles", threshold, stats, small)


def spmm_backend(graph, x: torch.Tensor, backend: Optional[str] = None,
                 training: Optional[bool] = None) -> str:
    """'csr' or 'wsb' for one spmm on ``graph`` with features ``x``: ``backend`` ('csr', 'wsb',
    'auto'; None reads GNNIO_SPMM_BACKEND, default auto). Auto is the planner's rule on CUDA
    and 'csr' on the CPU (whose WSB kernel is the reference implementation). ``training``: a
    backward of ``x`` follows the call (None: grad mode is on and ``x`` requires a gradient; the
    ops pass theirs), which lowers the small-graph threshold (wsb_threshold). The thresholds
    were measured with ``x`` needing a gradient; an edge weight needing one alone is not
    counted (its gradient does not go through the transposed tile product)."""
    if backend is not None and backend != "auto":  # forced by the argument
        return backend if backend in ("csr", "wsb") else _forced_spmm_backend(backend)[0]
    compiling = torch.compiler.is_compiling()
    if backend is None:  # the variable may force it
        forced = _forced_spmm_backend(None, compiling)
        if forced is not None:
            return forced[0]
    if not x.is_cuda:
        return "csr"
    width, dtype = x.size(1), x.dtype
    if training is None:
        training = torch.is_grad_enabled() and x.requires_grad
    key = ("spmm", width, dtype, dtype is torch.float32 and _tf32_allowed(), bool(training))
    hit = None if compiling else _memo_hit(graph, key)
    return hit if hit is not None else _memo(
        graph, key, lambda: "wsb" if _spmm_rule(graph, width, dtype, training=training).wsb else "csr")


def _nearest_measurement(ept: float, dtype: torch.dtype) -> str:
    key = torch.bfloat16 if dtype == torch.float16 else dtype
    point = min(_WSB_MEASURED, key=lambda m: abs(math.log(max(ept, 1e-3) / m[0])))
    fwd, both = point[3][key]
    label = _DTYPE_NAMES[key] + (", float16 not measured" if dtype == torch.float16 else "")
    return (f"nearest H200 measurement: {point[1]} ({point[0]:g} edges/tile, {point[2]:,} rows, "
            f"{label}) WSB {fwd:.2f}x forward, {both:.2f}x forward+backward vs CSR")


# TransformerConv's two forms (gnnio.nn.TransformerConv). 'direct' is PyG's: keys and values
# projected per source (N x H x C each), one key and one value row gathered per edge and head.
# 'reassociated' moves W_k and W_v around the aggregation: q~ = W_k,h^T q_i per destination,
# scores q~ . x_j against the input rows themselves (shared by the heads), out = W_v,h sum_j
# a x_j + b_v. The same sums in another order (PyG's float32 error within 0.7-1.7x, bench/NOTES.md
# v18); one x_j row gathered per edge instead of 2 H rows of C, at H x F instead of C channels
# per head of score and aggregation work. It needs the softmax weights to sum to one per
# non-empty row (no dropout) and no edge term (W_e e_ij would be gathered per edge and head).
TRANSFORMER_FORMS = ("direct", "reassociated", "fused")


def _shared_rows_fit(heads: int, features: int) -> bool:
    """attention_forward_cuda_shared_rows' register rule: a query and an accumulator per head,
    4 features a lane up to 128, 8 up to 256, heads x (features a lane) <= 32."""
    per_lane = 4 if features <= 128 else 8
    return features <= 256 and heads * per_lane <= 32


# 'auto' runs the fused form on CUDA for calls without a backward (inference) on graphs of at
# least FUSED_AUTO_MIN_EDGES edges and FUSED_AUTO_MIN_DEGREE mean in-degree. Measured forward
# (bench/NOTES.md v23, 128 -> 4 x 32, float32, PyG in the same process): powerlaw-1M-16M 0.77x
# direct's time on an H100 and 0.85x on the H200, uniform-1M-16M 0.81x (H100); but
# grid-1000x1000 (mean in-degree 4) 1.16x: the fused form's per-row work (q~ and W_v, the
# direct form's key and value projections' multiply-adds moved into the kernel) is repaid
# only by the gather it halves per edge, and below ~10^6 edges launches and noise decide.
# With a backward the direct form stays (forward+backward 1.00x-1.21x direct's: the backward
# is the direct form's and recomputes the key and value projections).
FUSED_AUTO_MIN_EDGES = 1 << 22
FUSED_AUTO_MIN_DEGREE = 12


def _fused_fit(heads: int, channels: int, features: int, dtype: Optional[torch.dtype]) -> bool:
    """transformer_fused_cuda_supported's shapes: float32, F = H x C = 128, 1, 2 or 4 heads."""
    return dtype == torch.float32 and features == 128 and heads * channels == 128 and heads in (1, 2, 4)


def plan_transformer(device: torch.device, *, edge_term: bool, dropout: bool, weights: bool,
                     plain: bool = True, autocast: bool = False, heads: int = 1,
                     features: int = 0, form: Optional[str] = None, channels: int = 0,
                     dtype: Optional[torch.dtype] = None, grad: bool = True, num_edges: int = 0,
                     num_dst: int = 0) -> Tuple[str, str]:
    """(form, reason) for a TransformerConv call. ``form`` (or GNNIO_TRANSFORMER_FORM when it is
    None) is 'direct', 'reassociated', 'fused' or 'auto'. 'reassociated' falls back to 'direct'
    (with the reason) where it does not apply: an edge term, dropout, returned attention
    weights, lin_key or lin_value not plain Linears (a hook or a subclass would not see the
    weights used directly), autocast (its casts are the linears'), or on CUDA more ``heads`` or
    input ``features`` than the shared-row kernel holds (8 heads of up to 128 features, 4 of up
    to 256: attention_forward_cuda_shared_rows; the op would copy x per head). 'fused' is the
    reassociated form in one kernel per tile of destinations (gnnio::transformer_fused_forward:
    no [N, H, F] tensor through memory); where the reassociated form applies, it runs on the CPU
    at any shape and on CUDA at float32, ``features`` = heads x ``channels`` = 128 and 1, 2 or 4
    heads, and falls back to 'reassociated' otherwise.
    'auto' picks 'fused' on CUDA for a call without a backward (``grad`` False: inference) where
    the fused kernel fits and applies, on a graph of ``num_edges`` >= FUSED_AUTO_MIN_EDGES and
    mean in-degree ``num_edges / num_dst`` >= FUSED_AUTO_MIN_DEGREE (measured faster there,
    bench/NOTES.md v23); 'direct' otherwise: the reassociated form was measured slower on the
    CPU (1.7-2.8x, NOTES v19) and, unfused, on the H200 (NOTES v20), and with a backward the
    fused form's forward+backward is no faster than direct's."""
    compiling = torch.compiler.is_compiling()
    source = "argument"
    if form is None:
        form, source = _env("GNNIO_TRANSFORMER_FORM", compiling) or "auto", "GNNIO_TRANSFORMER_FORM"
    if form not in TRANSFORMER_FORMS + ("auto",):
        raise ValueError(f"{source} must be 'direct', 'reassociated', 'fused' or 'auto', got {form!r}")
    fused_fits = device.type != "cuda" or _fused_fit(heads, channels, features, dtype)

    def blockers_of(candidate: str) -> List[str]:  # what keeps the candidate form from applying
        return [name for name, on in (("an edge term", edge_term), ("dropout", dropout),
                                      ("attention weights returned", weights),
                                      ("lin_key / lin_value not plain Linears", not plain),
                                      ("autocast", autocast),
                                      # (its CPU kernels take float32 and float64; direct's
                                      # op runs 16-bit on the CPU in float32, gnnio.ops)
                                      ("16-bit on the CPU", device.type != "cuda"
                                       and dtype in (torch.float16, torch.bfloat16)),
                                      ("more heads or input features than the CUDA kernel holds",
                                       device.type == "cuda" and not _shared_rows_fit(heads, features)
                                       and not (candidate == "fused" and fused_fits)))
                if on]
    if form == "auto":
        if (device.type == "cuda" and not grad and fused_fits and not blockers_of("fused")
                and num_edges >= FUSED_AUTO_MIN_EDGES and num_edges >= FUSED_AUTO_MIN_DEGREE * num_dst):
            return "fused", (f"fused: auto, no backward on a graph of {num_edges} edges and mean "
                             f"in-degree >= {FUSED_AUTO_MIN_DEGREE} (bench/NOTES.md v23)")
        return "direct", (f"direct: the default on {device.type} (the reassociated form "
                          f"measured slower, bench/NOTES.md v19 on the CPU, v20 on the H200; "
                          f"fused only without a backward on large graphs of mean in-degree >= "
                          f"{FUSED_AUTO_MIN_DEGREE}, v23)")
    if form == "direct":
        return "direct", f"direct: forced ({source})"
    blockers = blockers_of(form)
    if blockers:
        return "direct", f"direct: {form} asked ({source}) but not with {', '.join(blockers)}"
    if form == "fused":
        if fused_fits:
            return "fused", f"fused: forced ({source})"
        return "reassociated", (f"reassociated: fused asked ({source}) but the CUDA kernel takes "
                                f"float32 with 128 features = heads x channels, 1, 2 or 4 heads")
    return "reassociated", f"reassociated: forced ({source})"
