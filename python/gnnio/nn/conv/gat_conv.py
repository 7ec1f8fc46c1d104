import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter

from gnnio.nn._common import GraphCache, check_channels, check_kwargs, split_pair
from gnnio.nn.conv.graph_conv import _sizes
from gnnio.ops import gat_attention


def _glorot(t: Tensor) -> None:
    """PyG's glorot: U(-a, a), a = sqrt(6 / (fan_in + fan_out)) over the last two dims."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


class GATConv(torch.nn.Module):
    r"""The graph attentional operator from `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_, drop-in for ``torch_geometric.nn.GATConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \Big\Vert_{h} \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha^{h}_{i,j}\mathbf{\Theta}^{h}\mathbf{x}_{j}, \qquad
        \alpha^{h}_{i,j} = \mathrm{softmax}_j\Big(\mathrm{LeakyReLU}\big(
        \mathbf{a}^{h\top}_{s}\mathbf{\Theta}^{h}\mathbf{x}_j + \mathbf{a}^{h\top}_{t}
        \mathbf{\Theta}^{h}\mathbf{x}_i\big)\Big)

    The softmax and the aggregation are one fused pass per destination and head (online
    softmax); no E x H scores or E x H x C messages are stored, only a per-(node, head)
    (max, sum) of the softmax for the backward pass. ``return_attention_weights`` is the one case that
    materialises the E x H weights.

    Args: as PyG's GATConv: in_channels (int or (int, int)), out_channels, heads=1, concat=True,
    negative_slope=0.2, dropout=0.0, add_self_loops=True, edge_dim=None, fill_value='mean',
    bias=True, residual=False. Not yet supported (NotImplementedError): edge_dim / edge_attr,
    dropout > 0 in training mode, CUDA tensors.
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: Optional[int] = None,
                 fill_value: Union[float, Tensor, str] = "mean", bias: bool = True,
                 residual: bool = False, **kwargs):
        if kwargs.get("aggr", "add") == "add":
            kwargs.pop("aggr", None)
        check_kwargs("GATConv", kwargs)
        if edge_dim is not None:
            raise NotImplementedError("gnnio.nn.GATConv does not support edge_dim yet")
        pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        check_channels("GATConv", *pair, out_channels, heads)
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.edge_dim, self.fill_value = add_self_loops, edge_dim, fill_value
        self.residual = residual
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = torch.nn.Linear(in_channels, heads * out_channels, bias=False)
        else:
            self.lin_src = torch.nn.Linear(pair[0], heads * out_channels, bias=False)
            self.lin_dst = torch.nn.Linear(pair[1], heads * out_channels, bias=False)
        self.att_src = Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = None
        self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        if residual:
            self.res = torch.nn.Linear(pair[1], total, bias=False)
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = Parameter(torch.empty(total))
        else:
            self.register_parameter("bias", None)
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin, self.lin_src, self.lin_dst, self.res):
            if lin is not None:
                _glorot(lin.weight)
        _glorot(self.att_src)
        _glorot(self.att_dst)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._graphs.clear()

    def forward(self, x, edge_index, edge_attr: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None, return_attention_weights=None):
        if edge_attr is not None:
            raise NotImplementedError("gnnio.nn.GATConv does not support edge_attr yet")
        if self.dropout > 0 and self.training:
            raise NotImplementedError("gnnio.nn.GATConv: dropout on attention coefficients in "
                                      "training mode is not supported yet (eval mode is)")
        H, C = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        res = self.res(x_dst) if self.res is not None and x_dst is not None else None
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        shared = x_dst is x_src and self.lin is not None
        h_src = lin_src(x_src).view(-1, H, C)
        h_dst = None if x_dst is None else (h_src if shared else lin_dst(x_dst).view(-1, H, C))
        alpha_src = (h_src * self.att_src).sum(-1)
        alpha_dst = None if h_dst is None else (h_dst * self.att_dst).sum(-1)

        num_src, num_dst = _sizes(x_src, x_dst, size)
        graph = self._graphs.get(edge_index, num_src, num_dst)
        if self.add_self_loops:
            loops = min(size) if size is not None else min(num_src, num_dst)
            graph = graph.with_self_loops(loops)[0]
        out, stats = gat_attention(graph, alpha_src, alpha_dst, h_src, self.negative_slope)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        if return_attention_weights:
            ei = graph.edge_index.long()
            score = alpha_src[ei[0]] + (alpha_dst[ei[1]] if alpha_dst is not None else 0)
            st = stats[ei[1]]
            alpha = torch.exp(F.leaky_relu(score, self.negative_slope) - st[..., 0]) / st[..., 1]
            return out, (ei, alpha)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
