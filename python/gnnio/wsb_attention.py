"""GAT attention on WSB tiles: :func:`gnnio.ops.graph_attention`'s ``backend='wsb'``.

The softmax-weighted sum of each 16-destination block is taken as dense 16 x 16 tile products
(tensor cores on CUDA; csrc/gnnio/wsb/attention.h has the algorithm). A tile entry holds the
number of edges j -> i (duplicates are separate softmax terms with one score), built once per
graph and cached with its WSB structure.
"""
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from gnnio._ops import ops as _ops, widened_on_cpu
from gnnio.graph import Graph

MAX_CHANNELS = 128  # kWsbAttentionMaxChannels: a head's 16 x C block is staged in shared memory


def wsb_attention_blockers(kind: str, value: torch.Tensor, *, edge_score=None, edge_value=None,
                           dropout: float = 0.0, return_weights: bool = False) -> list:
    """Why a graph_attention call cannot run on WSB tiles (empty list: it can)."""
    why = []
    if kind != "gat":
        why.append(f"kind {kind!r} (WSB attention takes 'gat')")
    if edge_score is not None or edge_value is not None:
        why.append("edge terms (a duplicate edge's terms would differ within one tile entry)")
    if dropout > 0:
        why.append("dropout (a mask per edge)")
    if return_weights:
        why.append("returned weights")
    if value.size(2) > MAX_CHANNELS:
        why.append(f"{value.size(2)} channels a head (at most {MAX_CHANNELS})")
    if value.is_cuda and value.dtype == torch.float64:
        why.append("float64 on CUDA (tensor cores take float32 as tf32, float16, bfloat16)")
    return why


def wsb_gat_attention(graph: Graph, value: torch.Tensor, src_score: torch.Tensor,
                      dst_score: Optional[torch.Tensor] = None,
                      negative_slope: float = 0.2) -> torch.Tensor:
    r""":math:`\mathbf{out}_{i,h} = \sum_j \mathrm{softmax}_j(\mathrm{LeakyReLU}(s^{src}_{j,h} +
    s^{dst}_{i,h}))\, V_{j,h}` over the graph's WSB tiles: ``value [num_src, H, C]``,
    ``src_score [num_src, H]``, ``dst_score [num_dst, H]`` (optional), all one dtype; returns
    ``[num_dst, H, C]``. Differentiable in the three tensors (not twice). On CUDA the tile
    products run on tensor cores, float32 as tf32 (about 1e-3 relative) whatever
    ``torch.backends.cuda.matmul``'s setting when called directly or forced (the planner's auto
    rule picks float32 tiles only where tf32 is allowed); on the CPU float32 or float64
    throughout, float16 / bfloat16 in float32 with each result rounded once to the dtype
    (gnnio._ops.widened_on_cpu)."""
    if not isinstance(value, torch.Tensor) or value.dim() != 3 or value.size(0) != graph.num_src:
        raise ValueError(f"value must be a [num_src={graph.num_src}, heads, channels] Tensor, got "
                         f"{list(value.shape) if isinstance(value, torch.Tensor) else type(value)}")
    if src_score is None:
        raise ValueError("wsb_gat_attention needs src_score [num_src, heads]")
    heads = value.size(1)
    for name, t, rows in (("src_score", src_score, graph.num_src), ("dst_score", dst_score, graph.num_dst)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (rows, heads)):
            raise ValueError(f"{name} must be [{rows}, {heads}], got "
                             f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    for t in (value, src_score, dst_score):
        if t is not None and t.device != graph.device:
            raise ValueError(f"an operand is on {t.device} but the graph is on {graph.device}")
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (value, src_score, dst_score))
    if training:
        # The backward's transposed tiles, built here rather than inside the backward, where a
        # torch.compile trace of the backward would meet the cache's host work.
        graph.wsb(transpose=True), graph.wsb_counts(transpose=True)
    return widened_on_cpu(_WsbGatAttention.apply, value)(
        graph, value.contiguous(), src_score.contiguous(),
        None if dst_score is None else dst_score.contiguous(), float(negative_slope), training)


class _WsbGatAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graph, value, src_score, dst_score, negative_slope, training):
        w = graph.wsb()
        out, stats, out_acc = _ops.wsb_gat_attention(
            w.block_rowptr, w.block_col, graph.wsb_counts(), src_score, dst_score, value,
            graph.num_src, graph.num_dst, negative_slope, training)
        # A 16-bit backward forms D_i = dout . out from the unrounded out (as the CSR kernels do).
        ctx.save_for_backward(value, src_score, dst_score, out_acc if out_acc.numel() else out, stats)
        ctx.graph, ctx.negative_slope = graph, negative_slope
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        value, src_score, dst_score, out, stats = ctx.saved_tensors
        g = ctx.graph
        w, wt = g.wsb(), g.wsb(transpose=True)
        needs = [int(ctx.needs_input_grad[2]), int(ctx.needs_input_grad[3] and dst_score is not None),
                 int(ctx.needs_input_grad[1])]
        d_src, d_dst, d_value = _ops.wsb_gat_attention_backward(
            w.block_rowptr, w.block_col, g.wsb_counts(), wt.block_rowptr, wt.block_col,
            g.wsb_counts(transpose=True), src_score, dst_score, value, out, stats,
            grad_out.contiguous(), ctx.negative_slope, needs)
        return None, d_value, d_src, d_dst, None, None
