from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from gnnio.adjacency import is_sparse_adjacency
from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, check_channels, check_in_channels, check_kwargs,
                               linear, per_node, split_pair)
from gnnio.ops import segment_reduce, spmm

_AGGR = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}


class GraphConv(LayerBase):
    r"""The graph neural network operator from `"Weisfeiler and Leman Go Neural: Higher-order
    Graph Neural Networks" <https://arxiv.org/abs/1810.02244>`_, drop-in for
    ``torch_geometric.nn.GraphConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2
        \bigoplus_{j \in \mathcal{N}(i)} e_{j,i} \cdot \mathbf{x}_j

    with :math:`\bigoplus` the sum (``aggr='add'``), mean, max or min over incoming edges, computed
    by one SpMM (sum, mean) or segment reduction (max, min) over the destination CSR before
    ``lin_rel``, as PyG does.

    Args:
        in_channels (int or (int, int)): source (and destination) feature sizes.
        out_channels (int): output size.
        aggr (str): ``'add'``, ``'mean'``, ``'max'`` or ``'min'``.
            (default: ``'add'``)
        bias (bool): bias of ``lin_rel``. (default: ``True``)

    Shapes: x ``[N, F]`` or ``([N_src, F_src], [N_dst, F_dst])``; edge_index ``[2, E]`` or a
    sparse ``adj_t [N_dst, N_src]`` (``torch.sparse`` COO, CSR or CSC) whose values are the
    edge weights; edge_weight ``[E]`` optional (not with ``adj_t``); size ``(N_src, N_dst)``
    optional; output ``[N_dst, out_channels]``.
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 aggr: str = "add", bias: bool = True, **kwargs):
        if not isinstance(aggr, str) or aggr not in _AGGR:
            raise NotImplementedError(f"gnnio.nn.GraphConv does not support aggr={aggr!r} yet "
                                      "(supported: 'add', 'mean', 'max', 'min')")
        check_kwargs("GraphConv", kwargs)
        super().__init__(aggr=aggr, node_dim=-2)  # PyG's layer's, which user code reads
        self.in_channels, self.out_channels = in_channels, out_channels
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        check_in_channels("GraphConv", *in_channels)
        check_channels("GraphConv", out_channels)
        self.lin_rel = linear(in_channels[0], out_channels, bias)
        self.lin_root = linear(in_channels[1], out_channels, False)
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()
        self._graphs.clear()

    def forward(self, x, edge_index, edge_weight: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None) -> Tensor:
        x_src, x_dst = split_pair(x)
        num_src, num_dst = _sizes(x_src, x_dst, size, edge_index)
        if (isinstance(edge_weight, Tensor) and isinstance(x_src, Tensor)
                and not (edge_weight.is_floating_point() or edge_weight.is_complex())):
            # PyG's message edge_weight * x_j promotes integer (or bool) weights to x's dtype
            edge_weight = edge_weight.to(x_src.dtype)
        graph, edge_weight = self._graphs.get_weighted("GraphConv", edge_index, edge_weight,
                                                       num_src, num_dst)
        reduce = _AGGR[self.aggr]
        if reduce in ("max", "min"):  # PyG's message edge_weight * x_j, then the max / min
            out = per_node(lambda t: segment_reduce(graph, t, reduce, edge_weight=edge_weight), x_src)
        else:
            out = per_node(lambda t: spmm(graph, t, edge_weight, reduce), x_src)
        out = self.lin_rel(out)
        if x_dst is not None:
            out = out + self.lin_root(x_dst)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"  # PyG's


def _sizes(x_src: Tensor, x_dst: Optional[Tensor], size, edge_index=None) -> Tuple[int, int]:
    """(num_src, num_dst) as PyG's propagate infers them: from `size`, else from a sparse
    adjacency's shape, else from the features' node dimension (-2); a missing destination count
    falls back to the source count."""
    if is_sparse_adjacency(edge_index):  # PyG takes the counts from its shape
        given = (None, None) if size is None else tuple(size)
        if len(given) == 2:
            size = tuple(edge_index.size(1 - k) if given[k] is None else given[k] for k in (0, 1))
    if size is not None:
        if len(size) != 2:
            raise ValueError(f"size must be (num_src, num_dst), got {size}")
        num_src = size[0] if size[0] is not None else x_src.size(-2)
        num_dst = size[1] if size[1] is not None else (x_dst.size(-2) if x_dst is not None else num_src)
    else:
        num_src = x_src.size(-2)
        num_dst = x_dst.size(-2) if x_dst is not None else num_src
    if x_src.size(-2) != num_src:
        raise ValueError(f"x_src has {x_src.size(-2)} rows but size says {num_src} source nodes")
    if x_dst is not None and x_dst.size(-2) != num_dst:
        raise ValueError(f"x_dst has {x_dst.size(-2)} rows but size says {num_dst} destination nodes")
    return int(num_src), int(num_dst)
