"""What every gnnio layer shares: turning the edge_index argument into a cached Graph, splitting
(x_src, x_dst) pairs, and refusing PyG options that a layer does not implement yet."""
import weakref
from typing import Optional, Tuple

import torch

from gnnio.graph import Graph

# MessagePassing keyword arguments and the only values gnnio implements.
_MESSAGE_PASSING_DEFAULTS = {"flow": "source_to_target", "node_dim": -2, "decomposed_layers": 1}


def check_kwargs(layer: str, kwargs: dict) -> None:
    for name, value in kwargs.items():
        if name in _MESSAGE_PASSING_DEFAULTS and value == _MESSAGE_PASSING_DEFAULTS[name]:
            continue
        raise NotImplementedError(f"gnnio.nn.{layer} does not support the argument {name}={value!r} yet")


def check_channels(layer: str, *channels) -> None:
    for c in channels:
        if not isinstance(c, int) or c <= 0:
            raise NotImplementedError(
                f"gnnio.nn.{layer}: lazy or non-positive channel sizes ({c!r}) are not supported; "
                "give the input size explicitly")


def split_pair(x) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    if isinstance(x, torch.Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        if not isinstance(x[0], torch.Tensor):
            raise TypeError("x[0] (source features) must be a Tensor")
        return x[0], x[1]
    raise TypeError(f"x must be a Tensor or a pair (x_src, x_dst), got {type(x).__name__}")


def version_of(t: torch.Tensor):
    """The in-place version counter; inference tensors have none (they cannot be modified
    outside inference mode, and are treated as unchanged)."""
    return None if t.is_inference() else t._version


class GraphCache:
    """Per-layer cache of the Graph built from a plain edge_index Tensor.

    The Graph is reused while the caller passes the same tensor object, unmodified (same
    version counter) and with the same node counts; anything else builds a new one. This is what
    PyG's ``cached=True`` gives for a fixed graph, but safe when the graph changes. Pass a
    ``gnnio.Graph`` to share one structure between layers.
    """

    def __init__(self):
        self._key = None
        self._graph = None

    def get(self, edge_index, num_src: int, num_dst: Optional[int]) -> Graph:
        if isinstance(edge_index, Graph):
            if edge_index.num_src != num_src or (num_dst is not None and edge_index.num_dst != num_dst):
                raise ValueError(
                    f"the Graph has (num_src, num_dst) = ({edge_index.num_src}, {edge_index.num_dst}) "
                    f"but the features give ({num_src}, {num_dst})")
            return edge_index
        if not isinstance(edge_index, torch.Tensor):
            raise TypeError("edge_index must be a Tensor [2, E], a torch_geometric.EdgeIndex or a "
                            f"gnnio.Graph, got {type(edge_index).__name__}")
        if edge_index.is_sparse or edge_index.layout != torch.strided:
            raise NotImplementedError("sparse adjacency matrices are not supported yet; pass an "
                                      "edge_index [2, E] or a gnnio.Graph")
        num_dst = num_src if num_dst is None else num_dst
        key = (edge_index.data_ptr(), version_of(edge_index), tuple(edge_index.shape), num_src,
               num_dst, edge_index.device)
        if self._key is not None and self._key[0]() is edge_index and self._key[1] == key:
            return self._graph
        graph = Graph(edge_index, size=(num_src, num_dst))
        self._key, self._graph = (weakref.ref(edge_index), key), graph
        return graph

    def clear(self):
        self._key = self._graph = None
