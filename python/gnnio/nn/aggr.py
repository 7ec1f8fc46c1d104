"""gnnio's max / min aggregations as PyG ``Aggregation`` modules, so any PyG layer that takes an
aggregation (``SAGEConv(..., aggr=gnnio.nn.aggr.MaxAggregation())``, ``GraphConv``, ...) runs
gnnio's segment reduction: the winning message of each (node, feature) is kept as an index, the
backward pass routes the gradient to it without atomics (deterministic), ties go to the earliest
message (torch's scatter_reduce splits them evenly).

PyG hands an aggregation the per-edge messages ``x`` [E, F] and the destination ``index`` [E];
the CSR over ``index`` is built once and reused while the same index storage, unmodified, comes
back (PyG passes a view of the same edge_index every step).
"""
import torch

from gnnio.graph import Graph
from gnnio.nn._common import version_of
from gnnio.ops import segment_reduce

try:
    from torch_geometric.nn.aggr import Aggregation as _Base
except ImportError:  # PyG is optional for gnnio; these modules need it to plug into PyG layers
    _Base = torch.nn.Module

__all__ = ["MaxAggregation", "MinAggregation"]


class _SegmentAggregation(_Base):
    reduce = ""

    def __init__(self):
        super().__init__()
        self._key = None
        self._graph = None
        self._index = None  # held so its memory cannot be reused while the key refers to it

    def _graph_for(self, index: torch.Tensor, dim_size: int) -> Graph:
        key = (index.data_ptr(), tuple(index.shape), tuple(index.stride()), version_of(index),
               dim_size, index.device)
        if self._key != key:
            messages = torch.arange(index.numel(), device=index.device)
            self._graph = Graph(torch.stack([messages, index.view(-1)]), size=(index.numel(), dim_size))
            self._key, self._index = key, index
        return self._graph

    def forward(self, x, index=None, ptr=None, dim_size=None, dim=-2, max_num_elements=None):
        if x.dim() != 2 or dim not in (0, -2):
            raise NotImplementedError(f"gnnio.nn.aggr.{type(self).__name__} reduces 2-D messages "
                                      f"over dim 0 (got x of shape {list(x.shape)}, dim={dim})")
        if index is None:
            if ptr is None:
                raise ValueError("give index or ptr")
            counts = ptr.diff()
            index = torch.repeat_interleave(torch.arange(counts.numel(), device=ptr.device), counts)
            dim_size = counts.numel() if dim_size is None else dim_size
        if dim_size is None:
            dim_size = int(index.max()) + 1 if index.numel() else 0
        return segment_reduce(self._graph_for(index, int(dim_size)), x, self.reduce)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MaxAggregation(_SegmentAggregation):
    r""":math:`\max_{i \in \mathcal{X}} \mathbf{x}_i` per feature, drop-in for
    ``torch_geometric.nn.aggr.MaxAggregation`` (empty groups give 0)."""

    reduce = "max"


class MinAggregation(_SegmentAggregation):
    r""":math:`\min_{i \in \mathcal{X}} \mathbf{x}_i` per feature, drop-in for
    ``torch_geometric.nn.aggr.MinAggregation`` (empty groups give 0)."""

    reduce = "min"
