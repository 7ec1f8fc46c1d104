from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, check_channels, check_in_channels, check_kwargs,
                               linear, per_node, split_pair)
from gnnio.nn.conv.graph_conv import _sizes
from gnnio.ops import segment_reduce, spmm


_AGGR = {"mean": "mean", "max": "max", "min": "min", "add": "sum", "sum": "sum"}


class SAGEConv(LayerBase):
    r"""The GraphSAGE operator from `"Inductive Representation Learning on Large Graphs"
    <https://arxiv.org/abs/1706.02216>`_, drop-in for ``torch_geometric.nn.SAGEConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{mean}_{j \in \mathcal{N}(i)} \mathbf{x}_j

    (or max / min / sum instead of the mean). The mean and the sum are one SpMM over the
    destination CSR (the mean with cached 1/deg edge values); max / min are one segment
    reduction that keeps the winning edge of each (node, feature) for the backward pass.

    Args:
        in_channels (int or (int, int)), out_channels (int): feature sizes.
        aggr (str): ``'mean'``, ``'max'``, ``'min'`` or ``'add'`` / ``'sum'``. (default: ``'mean'``)
        normalize (bool): L2-normalise the output. (default: ``False``)
        root_weight (bool): add :math:`\mathbf{W}_1 \mathbf{x}_i`. (default: ``True``)
        project (bool): first :math:`\mathbf{x}_j \leftarrow \mathrm{ReLU}(\mathbf{W}_3
            \mathbf{x}_j + \mathbf{b})`. (default: ``False``)
        bias (bool): bias of ``lin_l``. (default: ``True``)

    Shapes: x ``[N, F]`` or ``([N_src, F_src], [N_dst, F_dst])``; edge_index ``[2, E]`` or a
    sparse ``adj_t [N_dst, N_src]`` (``torch.sparse`` COO, CSR or CSC), whose values weight the
    messages as PyG's spmm does (mean: :math:`\sum_j w_{ji} x_j / \deg_i`, sum without the
    division, max / min of :math:`w_{ji} x_j`); size optional; output
    ``[N_dst, out_channels]``.
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 aggr: str = "mean", normalize: bool = False, root_weight: bool = True,
                 project: bool = False, bias: bool = True, **kwargs):
        if not isinstance(aggr, str) or aggr not in _AGGR:
            raise NotImplementedError(f"gnnio.nn.SAGEConv does not support aggr={aggr!r} yet "
                                      "(supported: 'mean', 'max', 'min', 'add', 'sum')")
        check_kwargs("SAGEConv", kwargs)
        super().__init__(aggr=aggr, node_dim=-2)  # PyG's layer's, which user code reads
        self.in_channels, self.out_channels = in_channels, out_channels
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        check_in_channels("SAGEConv", *in_channels)
        check_channels("SAGEConv", out_channels)
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        if project:
            if in_channels[0] <= 0:
                raise ValueError(f"'{self.__class__.__name__}' does not support lazy "
                                 "initialization with `project=True`")
            self.lin = torch.nn.Linear(in_channels[0], in_channels[0], bias=True)
        self.lin_l = linear(in_channels[0], out_channels, bias)
        if root_weight:
            self.lin_r = linear(in_channels[1], out_channels, False)
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()
        self._graphs.clear()

    def forward(self, x, edge_index, size: Optional[Tuple[int, int]] = None) -> Tensor:
        x_src, x_dst = split_pair(x)
        if self.project:
            x_src = self.lin(x_src).relu()
        num_src, num_dst = _sizes(x_src, x_dst, size, edge_index)
        graph, weight = self._graphs.get_weighted("SAGEConv", edge_index, None, num_src, num_dst)
        reduce = _AGGR[self.aggr]
        if weight is None or reduce in ("max", "min"):  # PyG's spmm: reduce_j w_ji x_j
            out = per_node(lambda t: segment_reduce(graph, t, reduce, edge_weight=weight), x_src)
        else:  # sum_j w_ji x_j [/ deg_i]
            out = per_node(lambda t: spmm(graph, t, weight, reduce), x_src)
        out = self.lin_l(out)
        if self.root_weight and x_dst is not None:
            out = out + self.lin_r(x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, aggr={self.aggr})"
