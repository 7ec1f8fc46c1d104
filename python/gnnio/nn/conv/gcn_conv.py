from typing import Optional

import torch
from torch import Tensor
from torch.nn import Parameter

from gnnio.adjacency import is_sparse_adjacency
from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, check_channels, check_in_channels, check_sum_kwargs, linear,
                               flat_edge_weight, per_node, reset_linear)
from gnnio.ops import gcn_propagate


class GCNConv(LayerBase):
    r"""The graph convolutional operator from `"Semi-supervised Classification with Graph
    Convolutional Networks" <https://arxiv.org/abs/1609.02907>`_, drop-in for
    ``torch_geometric.nn.GCNConv`` (PyG 2.8).

    .. math::
        \mathbf{X}^{\prime} = \mathbf{\hat{D}}^{-1/2} \mathbf{\hat{A}}
        \mathbf{\hat{D}}^{-1/2} \mathbf{X} \mathbf{\Theta},

    with :math:`\mathbf{\hat{A}} = \mathbf{A} + \mathbf{I}` (self loops of weight 1, or 2 when
    ``improved``; an existing loop keeps its weight) and :math:`\hat{D}_{ii} = \sum_j \hat{A}_{ij}`
    summed over incoming edges. The aggregation is one cuSPARSE SpMM (CUDA) or OpenMP SpMM (CPU)
    over the destination CSR; the backward pass uses the cached transpose.

    Args:
        in_channels (int), out_channels (int): feature sizes (``in_channels=-1``: lazy, from
            the first input).
        improved (bool): self loops of weight 2. (default: ``False``)
        cached (bool): with ``normalize``, keep the normalised structure and edge weights of
            the first call for every later call, as PyG does (for transductive learning); later
            calls' edge_index and edge_weight are ignored (without ``normalize`` PyG caches
            nothing, and neither does gnnio). Without it gnnio still caches the Graph and its
            normalisation while the same edge_index tensor is passed unmodified.
            (default: ``False``)
        add_self_loops (bool, optional): default ``normalize``.
        normalize (bool): apply the symmetric normalisation. (default: ``True``)
        bias (bool): learn an additive bias. (default: ``True``)

    Shapes: x ``[N, in_channels]``; edge_index ``[2, E]`` (Tensor, EdgeIndex or gnnio.Graph),
    or a sparse ``adj_t [N, N]`` (``torch.sparse`` COO, CSR or CSC) whose values are the edge
    weights, with PyG's sparse conventions (a loop of weight 1, or 2 when ``improved``, is added
    to every node beside any loop it has); edge_weight ``[E]`` optional (not with ``adj_t``);
    output ``[N, out_channels]``.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: Optional[bool] = None,
                 normalize: bool = True, bias: bool = True, **kwargs):
        check_sum_kwargs("GCNConv", kwargs)
        check_in_channels("GCNConv", in_channels)
        check_channels("GCNConv", out_channels)
        super().__init__(aggr="add", node_dim=-2)  # PyG's layer's, which user code reads
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError(f"'{self.__class__.__name__}' does not support adding self-loops to "
                             "the graph when no on-the-fly normalization is applied")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self.lin = linear(in_channels, out_channels, False, "glorot")
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self._graphs = GraphCache()
        self._cached_graph = self._cached_adjacency = self._cached_weight = None
        self.reset_parameters()

    def reset_parameters(self):
        reset_linear(self.lin, "glorot")
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._graphs.clear()
        self._cached_graph = self._cached_adjacency = self._cached_weight = None

    def forward(self, x: Tensor, edge_index, edge_weight: Optional[Tensor] = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise ValueError(f"'{self.__class__.__name__}' received a tuple of node features as "
                             "input while this layer does not support bipartite message passing. "
                             "Please try other layers such as 'SAGEConv' or 'GraphConv' instead")
        if not isinstance(x, Tensor) or x.dim() < 2:
            raise ValueError("x must be a Tensor [num_nodes, in_channels] or, batched as PyG "
                             "takes it, [..., num_nodes, in_channels]")
        edge_weight = flat_edge_weight(edge_weight)
        # PyG caches only what gcn_norm returns: nothing without normalize. The cache holds the
        # first call's structure and its edge weights (given or the adjacency's), which PyG
        # reuses on every later call whatever edge_weight that call passes.
        cache = self.cached and self.normalize
        if cache and self._cached_graph is not None:
            graph, sparse = self._cached_graph, self._cached_adjacency is not None
            edge_weight = self._cached_weight
        else:
            sparse = is_sparse_adjacency(edge_index)
            graph, edge_weight = self._graphs.get_weighted("GCNConv", edge_index, edge_weight,
                                                           x.size(-2), x.size(-2))
            if cache:
                self._cached_graph, self._cached_weight = graph, edge_weight
                self._cached_adjacency = (edge_weight,) if sparse else None
        x = self.lin(x)
        if edge_weight is not None and edge_weight.is_floating_point():
            # PyG's messages are edge_weight * x_j: a wider weight (float64 with float32 x, or
            # float32 weights under a 16-bit autocast) makes the output that dtype.
            wider = torch.promote_types(x.dtype, edge_weight.dtype)
            if wider != x.dtype:
                x = x.to(wider)
        add_self_loops = self.add_self_loops
        if sparse and add_self_loops:
            # PyG's gcn_norm adds a loop of weight fill_value to every node of a sparse
            # adjacency, next to any loop it has (an edge_index's loops are replaced instead).
            fill = 2.0 if self.improved else 1.0
            if edge_weight is not None or fill != 1.0:
                w = x.new_ones(graph.num_edges) if edge_weight is None else edge_weight.to(x.dtype)
                edge_weight = torch.cat([w, w.new_full((graph.num_dst,), fill)])
            graph, add_self_loops = graph.with_added_self_loops(), False
        out = per_node(lambda t: gcn_propagate(graph, t, edge_weight, self.improved, add_self_loops,
                                               self.normalize), x)
        if self.bias is not None:
            out = out + self.bias
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels})"
