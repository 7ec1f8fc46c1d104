from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from gnnio.nn._base import LayerBase
from gnnio.nn._common import GraphCache, check_sum_kwargs, per_node, split_pair
from gnnio.nn.conv.graph_conv import _sizes
from gnnio.ops import spmm


class GINConv(LayerBase):
    r"""The graph isomorphism operator from `"How Powerful are Graph Neural Networks?"
    <https://arxiv.org/abs/1810.00826>`_, drop-in for ``torch_geometric.nn.GINConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = h_{\mathbf{\Theta}} \left( (1 + \epsilon) \cdot
        \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathbf{x}_j \right)

    The neighbour sum is one SpMM over the destination CSR (cached cuSPARSE on CUDA), where PyG
    gathers an ``[E, F]`` message tensor and scatters it; then ``(1 + eps) x_i`` is added and
    ``nn`` applied, in PyG's order.

    Args:
        nn (torch.nn.Module): :math:`h_{\mathbf{\Theta}}`, applied to ``[N_dst, F]`` (an MLP, as a
            rule). Its parameters are the layer's, under ``nn.``.
        eps (float): :math:`\epsilon`'s initial value. (default: ``0.``)
        train_eps (bool): :math:`\epsilon` a trainable parameter (else a buffer).
            (default: ``False``)

    Shapes: x ``[N, F]`` or ``([N_src, F], [N_dst, F])`` (``x_dst`` may be None: no root term);
    edge_index ``[2, E]`` or a sparse ``adj_t [N_dst, N_src]`` (``torch.sparse`` COO, CSR or CSC,
    its values multiplying each neighbour as PyG's ``spmm`` does); size ``(N_src, N_dst)``
    optional; output ``nn``'s on ``[N_dst, F]``.
    """

    def __init__(self, nn: Callable, eps: float = 0.0, train_eps: bool = False, **kwargs):
        check_sum_kwargs("GINConv", kwargs)
        super().__init__(aggr="add", node_dim=-2)  # PyG's layer's, which user code reads
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        _reset(self.nn)
        self.eps.data.fill_(self.initial_eps)
        self._graphs.clear()

    def forward(self, x, edge_index, size: Optional[Tuple[int, int]] = None) -> Tensor:
        x_src, x_dst = split_pair(x)
        num_src, num_dst = _sizes(x_src, x_dst, size, edge_index)
        graph, weight = self._graphs.get_weighted("GINConv", edge_index, None, num_src, num_dst)
        out = per_node(lambda t: spmm(graph, t, weight, "sum"), x_src)
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(nn={self.nn})"  # PyG's


def _reset(module) -> None:
    """PyG's ``inits.reset``: the module's own reset_parameters, else its children's, recursively
    (an ``nn.Sequential`` of Linears and activations)."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    else:
        for child in module.children() if hasattr(module, "children") else []:
            _reset(child)
