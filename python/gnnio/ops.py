"""Functional operators. Each takes a gnnio.Graph (or an edge_index, see ``as_graph``)."""
from typing import Optional

import torch

from gnnio._ops import ops as _ops
from gnnio.graph import Graph
from gnnio.plan import plan_reduce

__all__ = ["spmm", "segment_reduce", "gat_attention", "check_features"]


def check_features(x, num_rows: int, graph: Graph, name: str = "x") -> torch.Tensor:
    """Validates a node-feature matrix and returns it with unit feature stride."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_nodes, features], got shape {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if x.size(0) != num_rows:
        raise ValueError(f"{name} has {x.size(0)} rows but the graph has {num_rows} nodes on that side")
    if x.device != graph.device:
        raise ValueError(f"{name} is on {x.device} but the graph is on {graph.device}")
    return x if x.stride(-1) == 1 or x.size(-1) <= 1 else x.contiguous()


def spmm(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
         reduce: str = "sum") -> torch.Tensor:
    r"""Neighbourhood aggregation :math:`\mathbf{out}_i = \mathrm{reduce}_{j \in N(i)} w_{ji}\,
    \mathbf{x}_j` for ``reduce`` in ``{'sum', 'mean'}`` (mean divides by the number of incoming
    edges; isolated destinations give 0), as PyG's ``propagate`` with that aggregation.

    Args:
        graph: the structure (``x`` has ``graph.num_src`` rows, the output ``graph.num_dst``).
        x: ``[num_src, F]`` float32/float64 (CPU and CUDA), float16/bfloat16 (CUDA).
        edge_weight: ``[E]`` in the order of the edge_index the graph was built from.

    Differentiable in ``x`` (through the cached transpose) and ``edge_weight`` (SDDMM).
    """
    x = check_features(x, graph.num_src, graph)
    need_t = torch.is_grad_enabled() and x.requires_grad
    value, value_t = graph.spmm_values(x.dtype, reduce, edge_weight, need_transpose=need_t)
    return _spmm_csr(graph, value, value_t, x, need_t)


def _spmm_csr(graph: Graph, value, value_t, x, need_t: bool) -> torch.Tensor:
    fwd = graph.csr_by_dst
    rowptr_t, col_t = graph.backward_csr(need_t)
    return _ops.spmm(fwd.rowptr, fwd.col, value, x, graph.num_dst, graph.num_src,
                     graph.cache_key, rowptr_t, col_t, value_t if need_t else None,
                     graph.cache_key + 1)


def gcn_propagate(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
                  improved: bool = False, add_self_loops: bool = True,
                  normalize: bool = True) -> torch.Tensor:
    """GCN's propagation D^-1/2 (A [+ I]) D^-1/2 x with PyG's gcn_norm conventions."""
    x = check_features(x, graph.num_src, graph)
    g, value, value_t = graph.gcn_values(x.dtype, edge_weight, improved, add_self_loops, normalize)
    need_t = torch.is_grad_enabled() and x.requires_grad
    return _spmm_csr(g, value, value_t, x, need_t)


def segment_reduce(graph: Graph, x: torch.Tensor, reduce: str = "max",
                   return_arg: bool = False, degree_aware: Optional[bool] = None):
    r"""Neighbourhood reduction :math:`\mathbf{out}_i = \mathrm{reduce}_{j \in N(i)} \mathbf{x}_j`
    for ``reduce`` in ``{'max', 'min', 'sum', 'mean'}``, as PyG's aggregation with that name:
    a destination without neighbours gets 0.

    For max/min the winner of each (node, feature) is kept as its CSR slot (``arg``, -1 where
    there is none), and the backward pass routes the gradient to that one input through the
    cached transpose: no E x F buffer, no atomics, the same result every run. Ties go to the
    earliest edge of the edge_index order (torch's scatter_reduce splits them evenly instead).
    ``return_arg=True`` also returns ``arg`` (max/min only). On CUDA the planner
    (``gnnio.plan.plan_reduce``) splits high-degree rows into 2-D tiles; ``degree_aware=False``
    forces the plain node-parallel kernel.
    """
    if reduce in ("sum", "add", "mean"):
        if return_arg:
            raise ValueError("return_arg is only defined for reduce='max' or 'min'")
        return spmm(graph, x, None, reduce)
    if reduce not in ("max", "min"):
        raise ValueError(f"reduce must be one of 'max', 'min', 'sum', 'mean', got {reduce!r}")
    x = check_features(x, graph.num_src, graph)
    fwd = graph.csr_by_dst
    need_t = torch.is_grad_enabled() and x.requires_grad
    rowptr_t, col_t = graph.backward_csr(need_t)
    t2c = graph.src_slot_to_dst_slot if need_t else col_t  # col_t is the empty placeholder then
    split = ()
    if x.is_cuda:
        plan = plan_reduce(graph, x.dtype, degree_aware, backward=need_t)
        split = (plan.heavy_rows, plan.heavy_items, plan.light_max_degree, plan.heavy_src,
                 plan.heavy_src_items, plan.light_max_out_degree)
    out, arg = _ops.segment_reduce(fwd.rowptr, fwd.col, x, graph.num_dst, graph.num_src, reduce,
                                   rowptr_t, col_t, t2c, *split)
    return (out, arg) if return_arg else out


def gat_attention(graph: Graph, alpha_src: torch.Tensor, alpha_dst: Optional[torch.Tensor],
                  h_src: torch.Tensor, negative_slope: float = 0.2):
    r"""Fused GAT attention: for each destination i and head h,
    :math:`\mathbf{out}_{i,h} = \sum_{j \to i} \mathrm{softmax}_j(\mathrm{LeakyReLU}(
    \alpha^{src}_{j,h} + \alpha^{dst}_{i,h}))\, \mathbf{h}_{j,h}` in one pass with an online
    softmax. Returns ``(out [num_dst, H, C], stats [num_dst, H, 2])`` with stats the (max, sum)
    of each softmax; only these are stored for the backward pass, which recomputes the attention
    weights. ``alpha_dst`` may be None
    (bipartite input without destination features). CPU for now."""
    if not isinstance(h_src, torch.Tensor) or h_src.dim() != 3:
        raise ValueError("h_src must be a [num_src, heads, channels] Tensor")
    if h_src.size(0) != graph.num_src:
        raise ValueError(f"h_src has {h_src.size(0)} rows but the graph has {graph.num_src} sources")
    if h_src.is_cuda and not torch._C._dispatch_has_kernel_for_dispatch_key("gnnio::gat", "CUDA"):
        raise NotImplementedError("gnnio's fused attention has no CUDA kernel yet")
    fwd = graph.csr_by_dst
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (alpha_src, alpha_dst, h_src))
    rowptr_t, col_t = graph.backward_csr(needs_grad)
    return _ops.gat(fwd.rowptr, fwd.col, alpha_src.contiguous(),
                    None if alpha_dst is None else alpha_dst.contiguous(), h_src.contiguous(),
                    graph.num_dst, float(negative_slope), rowptr_t, col_t)
