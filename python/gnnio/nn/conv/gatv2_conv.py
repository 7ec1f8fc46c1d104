from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, check_channels, check_in_channels, check_sum_kwargs,
                               glorot, linear, linears_of_one_input, materialise_lazy,
                               reset_linear, split_pair)
from gnnio.nn.conv.gat_conv import (_check_edge_attr, _check_fill_value,
                                    _coalesced_for_loops, _combine_heads, _edge_attr_of,
                                    _in_dtype, _op_bias, _returned_weights, _with_self_loops)
from gnnio.ops import graph_attention


class GATv2Conv(LayerBase):
    r"""The GATv2 operator from `"How Attentive are Graph Attention Networks?"
    <https://arxiv.org/abs/2105.14491>`_, drop-in for ``torch_geometric.nn.GATv2Conv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \Big\Vert_{h} \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha^{h}_{i,j}\mathbf{\Theta}^{h}_{s}\mathbf{x}_{j}, \qquad
        \alpha^{h}_{i,j} = \mathrm{softmax}_j\Big(\mathbf{a}^{h\top}\mathrm{LeakyReLU}\big(
        \mathbf{\Theta}^{h}_{s}\mathbf{x}_j + \mathbf{\Theta}^{h}_{t}\mathbf{x}_i +
        \mathbf{\Theta}^{h}_{e}\mathbf{e}_{j,i}\big)\Big)

    (:math:`\mathbf{\Theta}_s` = ``lin_l`` and :math:`\mathbf{\Theta}_t` = ``lin_r``, both with
    a bias). One fused pass per destination and head (``gnnio.ops.graph_attention(kind='gatv2')``,
    key = value = ``lin_l(x_src)``, query = ``lin_r(x_dst)``, edge key = ``lin_edge(edge_attr)``):
    the E x H x C sums inside the LeakyReLU are formed in registers, never stored; the backward
    pass recomputes them.

    Args:
        in_channels (int or (int, int)), out_channels (int), heads (int, default ``1``),
        concat (bool, default ``True``), negative_slope (float, default ``0.2``),
        dropout (float, default ``0.0``; the mask is drawn in the kernel from a seed taken
        from torch's default generator), add_self_loops (bool, default ``True``), edge_dim
        (int, optional), fill_value (float, Tensor or str, default ``'mean'``; as GATConv's),
        bias (bool, default ``True``: ``lin_l``, ``lin_r`` and the output bias),
        share_weights (bool, default ``False``: ``lin_r`` is ``lin_l``), residual (bool,
        default ``False``): as PyG's.

    Shapes: x ``[N, F]`` or ``([N_src, F_src], [N_dst, F_dst])``; edge_attr ``[E, edge_dim]``;
    output ``[N_dst, heads * out_channels]`` (concat) or ``[N_dst, out_channels]``. With
    ``return_attention_weights`` truthy: ``(out, (edge_index, alpha))``, edge_index including
    the added loops, alpha ``[E', heads]`` after dropout (differentiable, as PyG's).
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: Optional[int] = None,
                 fill_value: Union[float, Tensor, str] = "mean", bias: bool = True,
                 share_weights: bool = False, residual: bool = False, **kwargs):
        check_sum_kwargs("GATv2Conv", kwargs)
        pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        check_in_channels("GATv2Conv", *pair)
        check_channels("GATv2Conv", out_channels, heads)
        if edge_dim is not None:
            check_channels("GATv2Conv", edge_dim)
        _check_fill_value("GATv2Conv", fill_value)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"gnnio.nn.GATv2Conv: dropout must be in [0, 1), got {dropout}")
        super().__init__(aggr="sum", node_dim=0)  # PyG's layer's, which user code reads
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual, self.share_weights = residual, share_weights
        self.lin_l = linear(pair[0], heads * out_channels, bias, "glorot")
        if share_weights:
            self.lin_r = self.lin_l
        else:
            self.lin_r = linear(pair[1], heads * out_channels, bias, "glorot")
        self.att = Parameter(torch.empty(1, heads, out_channels))
        if edge_dim is not None:
            self.lin_edge = torch.nn.Linear(edge_dim, heads * out_channels, bias=False)
        else:
            self.lin_edge = None
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
        # As PyG: lin_r is reset even when it is lin_l (twice, so the random stream matches).
        reset_linear(self.lin_l, "glorot")
        reset_linear(self.lin_r, "glorot")
        if self.lin_edge is not None:
            reset_linear(self.lin_edge, "glorot")
        if self.res is not None:
            reset_linear(self.res, "glorot")
        glorot(self.att)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._graphs.clear()

    def forward(self, x, edge_index, edge_attr: Optional[Tensor] = None,
                return_attention_weights=None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        if x_dst is None:
            raise ValueError("gnnio.nn.GATv2Conv needs destination features: pass (x_src, x_dst), "
                             "not (x_src, None)")
        if x_src.dim() != 2 or x_dst.dim() != 2:
            raise ValueError("gnnio.nn.GATv2Conv: node features must be 2-D [num_nodes, features]")
        materialise_lazy((self.res, x_dst), (self.lin_l, x_src), (self.lin_r, x_dst))
        res = self.res(x_dst) if self.res is not None else None
        if x_dst is x_src and self.share_weights:
            x_l = x_r = self.lin_l(x_src).view(-1, H, C)
        elif x_dst is x_src:  # one d x buffer in the backward
            x_l, x_r = (t.view(-1, H, C) for t in linears_of_one_input(x_src, self.lin_l, self.lin_r))
        else:
            x_l = self.lin_l(x_src).view(-1, H, C)
            x_r = self.lin_r(x_dst).view(-1, H, C)

        num_src, num_dst = x_src.size(0), x_dst.size(0)
        edge_index = _coalesced_for_loops(self._graphs, edge_index, self.add_self_loops)
        graph = self._graphs.get(edge_index, num_src, num_dst)
        edge_attr = _edge_attr_of(edge_index, edge_attr, self.lin_edge)
        if edge_attr is not None:
            if self.lin_edge is None:
                raise ValueError("gnnio.nn.GATv2Conv: edge_attr was given but the layer has no "
                                 "edge_dim")
            edge_attr = _check_edge_attr("GATv2Conv", edge_attr, graph.num_edges, self.edge_dim)
        if self.add_self_loops:
            graph, edge_attr = _with_self_loops(graph, min(num_src, num_dst), edge_attr,
                                                self.fill_value)
        edge_key = None
        if edge_attr is not None:
            e = self.lin_edge(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
            edge_key = e.view(-1, H, C)
        op_dtype = torch.promote_types(x_l.dtype, self.att.dtype)  # PyG's, under autocast
        x_l, x_r, edge_key = (_in_dtype(t, op_dtype) for t in (x_l, x_r, edge_key))
        op_bias = _op_bias(self.concat, res, self.bias, x_l)
        result = graph_attention(graph, "gatv2", x_l, query=x_r, key=x_l, edge_key=edge_key,
                                 att=self.att.to(op_dtype), negative_slope=self.negative_slope,
                                 dropout=self.dropout if self.training else 0.0,
                                 return_weights=bool(return_attention_weights), bias=op_bias)
        out, alpha = result if return_attention_weights else (result, None)
        out = _combine_heads(out, self.concat, res, self.bias if op_bias is None else None)
        if return_attention_weights:
            return out, _returned_weights(edge_index, graph, self.add_self_loops, alpha)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
