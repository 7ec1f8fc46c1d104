"""The planner: policy chosen from cheap graph statistics, kept apart from the kernels.

Each plan says what it chose and why (``reason``), so a user can see it and override it
(argument or environment variable)."""
import os
from typing import NamedTuple, Optional

import torch


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


def split_rows(rowptr: torch.Tensor, threshold: int, chunk: int = EDGE_CHUNK):
    """Rows of a CSR with more than ``threshold`` slots and their work items
    (heavy index, first slot, end slot) of at most ``chunk`` slots, in row then slot order."""
    deg = (rowptr[1:] - rowptr[:-1]).long()
    heavy = (deg > threshold).nonzero().view(-1)
    begin = rowptr[heavy].long()
    chunks = (deg[heavy] + chunk - 1) // chunk
    owner = torch.repeat_interleave(torch.arange(heavy.numel(), device=deg.device), chunks)
    first_chunk = torch.cumsum(chunks, 0) - chunks
    index = torch.arange(owner.numel(), device=deg.device) - first_chunk[owner]
    start = begin[owner] + index * chunk
    end = torch.minimum(start + chunk, begin[owner] + deg[heavy][owner])
    return heavy.contiguous(), torch.stack([owner, start, end], 1).contiguous()


class _Split(NamedTuple):
    threshold: int  # rows with more slots are heavy
    max_degree: int
    heavy: Optional[torch.Tensor]  # None when no row is above the threshold
    items: Optional[torch.Tensor]


def _heavy_split(graph, side: str, min_heavy: int, over_mean: float, chunk: int) -> _Split:
    """The light/heavy split of csr_by_dst (``side='dst'``) or of the transpose (``'src'``):
    rows above max(min_heavy, over_mean x that side's mean degree), cut into ``chunk``-slot work
    items. Cached on the Graph per (side, threshold, chunk), whichever family asks."""
    if side == "dst":
        stats = graph.stats()
        mean, max_degree = stats["mean_in_degree"], stats["max_in_degree"]
    else:  # the source side's own mean: E / num_src differs from E / num_dst when bipartite
        mean, max_degree = graph.num_edges / max(graph.num_src, 1), graph.max_out_degree()
    threshold = int(max(min_heavy, over_mean * mean))
    if max_degree <= threshold:
        return _Split(threshold, max_degree, None, None)
    csr = (lambda: graph.csr_by_dst) if side == "dst" else (lambda: graph.csr_by_src)
    heavy, items = graph._cached(("split", side, threshold, chunk),
                                 lambda: split_rows(csr().rowptr, threshold, chunk))
    return _Split(threshold, max_degree, heavy, items)


def plan_reduce(graph, dtype: torch.dtype, degree_aware: Optional[bool] = None,
                backward: bool = False) -> ReducePlan:
    """Light/heavy split for segment_reduce on ``graph`` (CUDA); with ``backward`` also the split
    of the transpose that the backward pass walks. ``degree_aware=False`` (or
    GNNIO_REDUCE=node) gives the plain node-parallel variant, for comparison."""
    if degree_aware is None:
        degree_aware = os.environ.get("GNNIO_REDUCE", "degree") != "node"
    if not degree_aware:
        return ReducePlan(NODE_PARALLEL, EDGE_CHUNK, None, None, "node-parallel: forced")
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
ATTENTION_MIN_HEAVY = 128
ATTENTION_OVER_MEAN = 8


def plan_attention(graph, width: int, backward: bool = False,
                   degree_aware: Optional[bool] = None) -> AttentionPlan:
    """Super-node split for graph_attention on CUDA: destinations (and, with ``backward``,
    sources) whose degree would make one warp the long pole of the launch. ``width`` = heads x
    channels. GNNIO_ATTENTION=node forces the unsplit kernel."""
    if degree_aware is None:
        degree_aware = os.environ.get("GNNIO_ATTENTION", "degree") != "node"
    if not degree_aware:
        return AttentionPlan(NODE_PARALLEL, None, None, "node-parallel: forced")
    parts = []
    heavy_src = heavy_src_items = None
    light_max, light_max_out = NODE_PARALLEL, NODE_PARALLEL
    fwd = _heavy_split(graph, "dst", ATTENTION_MIN_HEAVY, ATTENTION_OVER_MEAN, ATTENTION_CHUNK)
    heavy_rows, heavy_items = fwd.heavy, fwd.items
    if heavy_rows is not None:
        light_max = fwd.threshold
        parts.append(f"super nodes: {heavy_rows.numel()} destinations above {fwd.threshold} "
                     f"edges (max {fwd.max_degree}) split into {heavy_items.size(0)} chunks "
                     f"of {ATTENTION_CHUNK}")
    else:
        parts.append(f"no super nodes: max in-degree {fwd.max_degree} <= {fwd.threshold}")
    if backward:
        bwd = _heavy_split(graph, "src", ATTENTION_MIN_HEAVY, ATTENTION_OVER_MEAN, ATTENTION_CHUNK)
        if bwd.heavy is not None:
            heavy_src, heavy_src_items, light_max_out = bwd.heavy, bwd.items, bwd.threshold
            parts.append(f"backward: {heavy_src.numel()} sources above {bwd.threshold} "
                         f"out-edges (max {bwd.max_degree}) split")
    return AttentionPlan(light_max, heavy_rows, heavy_items, "; ".join(parts), light_max_out,
                         heavy_src, heavy_src_items)
