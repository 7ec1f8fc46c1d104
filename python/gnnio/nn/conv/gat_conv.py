from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio.adjacency import (adjacency_values_2d, is_sparse_adjacency, set_values,
                              sorted_adjacency)
from gnnio.graph import Graph
from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, check_channels, check_in_channels, check_sum_kwargs,
                               glorot, linear, reset_linear, split_pair)
from gnnio.nn.conv.graph_conv import _sizes
from gnnio.ops import graph_attention, head_scores

# Helpers shared by the attention layers (GATConv, GATv2Conv, TransformerConv).

_FILL_REDUCTIONS = ("add", "sum", "mean", "min", "max", "mul", "any")


def _check_fill_value(layer: str, fill_value) -> None:
    if fill_value is None or isinstance(fill_value, (int, float, Tensor)):
        return
    if isinstance(fill_value, str) and fill_value in _FILL_REDUCTIONS:
        return
    raise ValueError(f"gnnio.nn.{layer}: fill_value must be a float, a Tensor or one of "
                     f"{list(_FILL_REDUCTIONS)}, got {fill_value!r}")


def _check_edge_attr(layer: str, edge_attr, num_edges: int, edge_dim: int,
                     allow_1d: bool = True) -> Tensor:
    if not isinstance(edge_attr, Tensor):
        raise TypeError(f"gnnio.nn.{layer}: edge_attr must be a Tensor, got {type(edge_attr).__name__}")
    if not edge_attr.dtype.is_floating_point:
        raise TypeError(f"gnnio.nn.{layer}: edge_attr must be floating point, got {edge_attr.dtype}")
    ok = edge_attr.dim() == 2 and edge_attr.size(1) == edge_dim
    ok = ok or (allow_1d and edge_attr.dim() == 1 and edge_dim == 1)
    if not ok or edge_attr.size(0) != num_edges:
        want = f"[{num_edges}, {edge_dim}]" + (f" or [{num_edges}]" if allow_1d and edge_dim == 1 else "")
        raise ValueError(f"gnnio.nn.{layer}: edge_attr must have shape {want} (one row per edge "
                         f"of edge_index, edge_dim={edge_dim}), got {list(edge_attr.shape)}")
    return edge_attr


def _loop_attr(edge_attr: Tensor, dst: Tensor, num_dst: int, num_loops: int, fill_value) -> Tensor:
    """Edge features of the appended self loops, as PyG's add_self_loops computes them
    (``compute_loop_attr``): ones for None, a constant, a broadcast Tensor, or a reduction of
    the incoming (non-loop) edges' features per destination, 0 where there are none ('mul': 1).
    The reduction is taken over all destinations and cut to the first ``num_loops``: for a
    bipartite graph with fewer sources than destinations PyG's scatter would run out of range."""
    size = (num_loops,) + tuple(edge_attr.shape[1:])
    if fill_value is None:
        return edge_attr.new_ones(size)
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full(size, fill_value)
    if isinstance(fill_value, Tensor):
        loop = fill_value.to(edge_attr.device, edge_attr.dtype)
        if edge_attr.dim() != loop.dim():
            loop = loop.unsqueeze(0)
        return loop.expand(size).contiguous()
    if edge_attr.dtype in (torch.float16, torch.bfloat16):
        # PyG reduces in the features' dtype: in bf16 a count or sum stops growing at 256
        # terms and in fp16 a count overflows past 65504. Reduce in float32 instead.
        return _loop_attr(edge_attr.float(), dst, num_dst, num_loops, fill_value).to(edge_attr.dtype)
    full = (num_dst,) + tuple(edge_attr.shape[1:])
    index = dst.view((-1,) + (1,) * (edge_attr.dim() - 1)).expand_as(edge_attr)
    if fill_value in ("add", "sum"):
        out = edge_attr.new_zeros(full).scatter_add_(0, index, edge_attr)
    elif fill_value == "mean":
        count = edge_attr.new_zeros(num_dst).scatter_add_(
            0, dst, edge_attr.new_ones(edge_attr.size(0))).clamp(min=1)
        out = edge_attr.new_zeros(full).scatter_add_(0, index, edge_attr)
        out = out / count.view((-1,) + (1,) * (edge_attr.dim() - 1)).expand_as(out)
    elif fill_value in ("min", "max"):
        out = edge_attr.new_zeros(full).scatter_reduce_(0, index, edge_attr, reduce="a" + fill_value,
                                                        include_self=False)
    elif fill_value == "mul":
        out = edge_attr.new_ones(full).scatter_reduce_(0, index, edge_attr, reduce="prod",
                                                       include_self=True)
    else:  # 'any'
        out = edge_attr.new_zeros(full).scatter_(0, index, edge_attr)
    return out[:num_loops]


def _with_self_loops(graph: Graph, num_loops: int, edge_attr: Optional[Tensor], fill_value):
    """PyG's remove_self_loops + add_self_loops on the graph and its edge features: the looped
    graph (kept edges in order, then loops 0..num_loops-1) and the matching edge_attr."""
    looped, kept, _ = graph.with_self_loops(num_loops)
    if edge_attr is None:
        return looped, None
    kept_attr = edge_attr[kept]
    dst = graph._dst.long()[kept]
    loops = _loop_attr(kept_attr, dst, graph.num_dst, num_loops, fill_value)
    return looped, torch.cat([kept_attr, loops], 0)


def _combine_heads(out: Tensor, concat: bool, res: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    """[N, H, C] attention output -> [N, H * C] (concat) or the mean over heads, plus the residual
    and the bias: the tail GATConv and GATv2Conv share."""
    out = out.flatten(1) if concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    return out if bias is None else out + bias


def _in_dtype(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """t in ``dtype``: under autocast the projections come out in fp16 / bf16 while the
    attention vectors stay float32, and the op then runs in float32 on the rounded projections,
    as PyG's attention does under autocast (its products with att promote to float32). Rounding
    att instead would move every score's LeakyReLU kink, where the gradient jumps."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _op_bias(concat: bool, res: Optional[Tensor], bias: Optional[Tensor], value: Tensor) -> Optional[Tensor]:
    """The output bias when the attention op can add it in its store of out (heads concatenated,
    no residual, value's dtype): the same fl(out + bias) without a second pass over out. None
    otherwise, and _combine_heads adds it."""
    if concat and res is None and bias is not None and bias.dtype == value.dtype:
        return bias
    return None


def _returned_edge_index(edge_index, graph: Graph, added_loops: bool) -> Tensor:
    """The edge_index PyG returns with the attention weights: the given one when no loops were
    added, else the looped edge list (int64, as PyG's concatenation with its arange gives)."""
    if not added_loops and isinstance(edge_index, Tensor):
        return edge_index
    return graph.edge_index.long()


def _edge_attr_of(edge_index, edge_attr: Optional[Tensor], lin_edge) -> Optional[Tensor]:
    """edge_attr, or for a layer with edge_dim given none, a sparse adjacency's [E, D] values:
    PyG's message passing takes those as the edge features."""
    if edge_attr is None and lin_edge is not None and is_sparse_adjacency(edge_index):
        return adjacency_values_2d(edge_index)
    return edge_attr


def _returned_weights(edge_index, graph: Graph, added_loops: bool, alpha: Tensor):
    """GATConv's and GATv2Conv's ``(edge_index, alpha)``. For a sparse adj_t PyG returns
    ``(adj, alpha)``: adj_t (with its loops replaced, entries sorted as PyG's loop utilities
    leave a coalesced input) holding alpha ``[E, H]`` as values, alpha in adj's entry order."""
    if not is_sparse_adjacency(edge_index):
        return _returned_edge_index(edge_index, graph, added_loops), alpha
    if not added_loops:
        return set_values(edge_index, alpha), alpha
    return sorted_adjacency(graph.edge_index, (graph.num_src, graph.num_dst), alpha,
                            edge_index.layout)


def _coalesced_for_loops(graphs: GraphCache, edge_index, add_self_loops: bool):
    """PyG's remove_self_loops / add_self_loops rebuild a torch.sparse COO adjacency with
    to_torch_coo_tensor, which coalesces it: duplicate entries of an uncoalesced COO adj_t become
    one edge (values summed). Do the same before the loops are replaced, through the layer's
    cache (the coalesced copy, and so its Graph, is kept while the same unmodified adjacency
    comes back). (Without loops PyG refuses an uncoalesced COO input; gnnio then keeps every
    stored entry.)"""
    if (add_self_loops and isinstance(edge_index, Tensor) and edge_index.layout == torch.sparse_coo
            and not edge_index.is_coalesced()):
        return graphs.coalesced(edge_index)
    return edge_index


class GATConv(LayerBase):
    r"""The graph attentional operator from `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_, drop-in for ``torch_geometric.nn.GATConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \Big\Vert_{h} \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha^{h}_{i,j}\mathbf{\Theta}^{h}_{s}\mathbf{x}_{j}, \qquad
        \alpha^{h}_{i,j} = \mathrm{softmax}_j\Big(\mathrm{LeakyReLU}\big(
        \mathbf{a}^{h\top}_{s}\mathbf{\Theta}^{h}_{s}\mathbf{x}_j + \mathbf{a}^{h\top}_{t}
        \mathbf{\Theta}^{h}_{t}\mathbf{x}_i + \mathbf{a}^{h\top}_{e}\mathbf{\Theta}^{h}_{e}
        \mathbf{e}_{j,i}\big)\Big)

    The softmax, the dropout on :math:`\alpha` and the aggregation are one fused pass per
    destination and head (``gnnio.ops.graph_attention(kind='gat')``, online softmax): no E x H
    scores or E x H x C messages are stored, only a per-(node, head) (max, sum) for the backward
    pass, which recomputes the weights (and the same dropout mask, from its seed).
    With one projection for both sides and no edge features, the scores
    :math:`\mathbf{a}^{h\top}\mathbf{\Theta}^{h}\mathbf{x}` are formed on CUDA by that pass from
    the rows it gathers (``graph_attention`` with ``att``): no pass over the projection for them.
    ``return_attention_weights`` is the one case that materialises the E x H weights.

    Args:
        in_channels (int or (int, int)): input size, or (source, destination) sizes of a
            bipartite layer (separate ``lin_src`` / ``lin_dst``).
        out_channels (int): size per head.
        heads (int): number of heads. (default: ``1``)
        concat (bool): concatenate the heads, else average them. (default: ``True``)
        negative_slope (float): LeakyReLU slope. (default: ``0.2``)
        dropout (float): dropout probability of the attention weights in training mode.
            The mask is drawn inside the kernel from a seed taken from torch's default
            generator, so it is not PyG's mask for the same ``torch.manual_seed``.
            (default: ``0.0``)
        add_self_loops (bool): remove existing loops and add one per node (for a bipartite
            input, the first ``min(num_src, num_dst)`` nodes). (default: ``True``)
        edge_dim (int, optional): edge feature size; ``edge_attr`` then adds a per-edge score.
        fill_value (float, Tensor or str): edge features of the added loops: a constant, a
            Tensor, or the reduction ``'mean'``/``'add'``/``'sum'``/``'min'``/``'max'``/
            ``'mul'``/``'any'`` of the destination's incoming edge features. (default: ``'mean'``)
        bias (bool): learnable output bias. (default: ``True``)
        residual (bool): add ``res(x_dst)``. (default: ``False``)

    Shapes: x ``[N, F]`` or ``([N_src, F_src], [N_dst, F_dst])`` (``x_dst`` may be None);
    edge_attr ``[E, edge_dim]``; output ``[N_dst, heads * out_channels]`` (concat) or
    ``[N_dst, out_channels]``. With ``return_attention_weights`` truthy: ``(out, (edge_index,
    alpha))``, edge_index including the added loops and alpha ``[E', heads]`` after dropout, in
    that edge order. alpha is differentiable, as PyG's (recomputed with PyTorch operations when
    an input requires grad).
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: Optional[int] = None,
                 fill_value: Union[float, Tensor, str] = "mean", bias: bool = True,
                 residual: bool = False, **kwargs):
        check_sum_kwargs("GATConv", kwargs)
        pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        check_in_channels("GATConv", *pair)
        check_channels("GATConv", out_channels, heads)
        if edge_dim is not None:
            check_channels("GATConv", edge_dim)
        _check_fill_value("GATConv", fill_value)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"gnnio.nn.GATConv: dropout must be in [0, 1), got {dropout}")
        super().__init__(aggr="add", node_dim=0)  # PyG's layer's, which user code reads
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual = residual
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = linear(in_channels, heads * out_channels, False, "glorot")
        else:
            self.lin_src = linear(pair[0], heads * out_channels, False, "glorot")
            self.lin_dst = linear(pair[1], heads * out_channels, False, "glorot")
        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = torch.nn.Linear(edge_dim, heads * out_channels, bias=False)
            self.att_edge = Parameter(torch.empty(1, heads, out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        if residual:
            self.res = linear(pair[1], total, False, "glorot")
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = Parameter(torch.empty(total))
        else:
            self.register_parameter("bias", None)
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):
            if lin is not None:
                reset_linear(lin, "glorot")
        glorot(self.att_src)
        glorot(self.att_dst)
        if self.att_edge is not None:
            glorot(self.att_edge)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._graphs.clear()

    def forward(self, x, edge_index, edge_attr: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None, return_attention_weights=None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        if x_src.dim() != 2:
            raise ValueError(f"gnnio.nn.GATConv: x must be 2-D [num_nodes, features], got "
                             f"shape {list(x_src.shape)}")
        res = self.res(x_dst) if self.res is not None and x_dst is not None else None
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        shared = x_dst is x_src and self.lin is not None
        h_src = lin_src(x_src).view(-1, H, C)
        h_dst = None if x_dst is None else (h_src if shared else lin_dst(x_dst).view(-1, H, C))

        edge_index = _coalesced_for_loops(self._graphs, edge_index, self.add_self_loops)
        num_src, num_dst = _sizes(x_src, x_dst, size, edge_index)
        graph = self._graphs.get(edge_index, num_src, num_dst)
        edge_attr = _edge_attr_of(edge_index, edge_attr, self.lin_edge)
        if self.lin_edge is None:
            edge_attr = None  # PyG ignores edge features without edge_dim
        elif edge_attr is not None:
            edge_attr = _check_edge_attr("GATConv", edge_attr, graph.num_edges, self.edge_dim)
        # PyG's (h * att).sum(-1), fused: no N x H x C product in either pass. With one
        # projection for both sides, no edge term and no weights returned, the op takes att
        # itself and forms the scores from the rows (on CUDA inside the attention kernel).
        att = alpha_src = alpha_dst = None
        op_dtype = torch.promote_types(h_src.dtype, self.att_src.dtype)  # PyG's, under autocast
        if shared and edge_attr is None and not return_attention_weights:
            att = torch.cat([self.att_src.to(op_dtype), self.att_dst.to(op_dtype)])
        elif shared:  # (cast first: autocast refuses a cat of 16-bit parameters)
            alpha_src, alpha_dst = head_scores(h_src, torch.cat([self.att_src.to(op_dtype),
                                                                 self.att_dst.to(op_dtype)]))
        else:
            alpha_src = head_scores(h_src, self.att_src)[0]
            alpha_dst = None if h_dst is None else head_scores(h_dst, self.att_dst)[0]
        if self.add_self_loops:
            graph, edge_attr = _with_self_loops(graph, min(num_src, num_dst), edge_attr,
                                                self.fill_value)
        edge_score = None
        if edge_attr is not None:
            e = self.lin_edge(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
            edge_score = _in_dtype(head_scores(e.view(-1, H, C), self.att_edge)[0], op_dtype)
        h_src = _in_dtype(h_src, op_dtype)
        op_bias = _op_bias(self.concat, res, self.bias, h_src)
        result = graph_attention(graph, "gat", h_src, src_score=alpha_src, dst_score=alpha_dst,
                                 att=att, edge_score=edge_score, negative_slope=self.negative_slope,
                                 dropout=self.dropout if self.training else 0.0,
                                 return_weights=bool(return_attention_weights), bias=op_bias)
        out, alpha = result if return_attention_weights else (result, None)
        out = _combine_heads(out, self.concat, res, self.bias if op_bias is None else None)
        if return_attention_weights:
            return out, _returned_weights(edge_index, graph, self.add_self_loops, alpha)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
