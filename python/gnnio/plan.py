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


# Initial values, not yet tuned on the H200 (the reduction issue's benchmark will set them):
# a warp walking more than ~256 slots, or 16x the mean degree, is the long pole of its launch;
# 2048 slots per tile keeps ~1K tiles busy for a 2M-neighbour row.
MIN_HEAVY_DEGREE = 256
HEAVY_OVER_MEAN = 16
EDGE_CHUNK = 2048


def plan_reduce(graph, dtype: torch.dtype, degree_aware: Optional[bool] = None) -> ReducePlan:
    """Light/heavy split for segment_reduce on ``graph`` (CUDA). ``degree_aware=False`` (or
    GNNIO_REDUCE=node) gives the plain node-parallel variant, for comparison."""
    if degree_aware is None:
        degree_aware = os.environ.get("GNNIO_REDUCE", "degree") != "node"
    if not degree_aware:
        return ReducePlan(2**62, EDGE_CHUNK, None, None, "node-parallel: forced")
    if dtype == torch.float64:
        return ReducePlan(2**62, EDGE_CHUNK, None, None,
                          "node-parallel: float64 values do not fit the packed 32-bit key")
    if graph.num_edges >= 2**32:
        return ReducePlan(2**62, EDGE_CHUNK, None, None,
                          "node-parallel: slots do not fit the packed 32-bit key")
    stats = graph.stats()
    threshold = int(max(MIN_HEAVY_DEGREE, HEAVY_OVER_MEAN * stats["mean_in_degree"]))
    if stats["max_in_degree"] <= threshold:
        return ReducePlan(threshold, EDGE_CHUNK, None, None,
                          f"node-parallel: max in-degree {stats['max_in_degree']} <= {threshold}")

    def items():
        deg = graph.in_degree()
        heavy = (deg > threshold).nonzero().view(-1)
        begin = graph.csr_by_dst.rowptr[heavy].long()
        chunks = (deg[heavy] + EDGE_CHUNK - 1) // EDGE_CHUNK
        owner = torch.repeat_interleave(torch.arange(heavy.numel(), device=deg.device), chunks)
        first_chunk = torch.cumsum(chunks, 0) - chunks
        index = torch.arange(owner.numel(), device=deg.device) - first_chunk[owner]
        start = begin[owner] + index * EDGE_CHUNK
        end = torch.minimum(start + EDGE_CHUNK, begin[owner] + deg[heavy][owner])
        return heavy.contiguous(), torch.stack([owner, start, end], 1).contiguous()

    heavy_rows, heavy_items = graph._cached(("reduce_plan", threshold, EDGE_CHUNK), items)
    return ReducePlan(threshold, EDGE_CHUNK, heavy_rows, heavy_items,
                      f"degree-aware: {heavy_rows.numel()} rows above {threshold} slots "
                      f"(max {stats['max_in_degree']}, mean {stats['mean_in_degree']:.1f}) split "
                      f"into {heavy_items.size(0)} tiles of {EDGE_CHUNK}")
