"""What every gnnio layer shares: turning the edge_index argument into a cached Graph, splitting
(x_src, x_dst) pairs, and refusing PyG options that a layer does not implement yet."""
import inspect
import weakref
from typing import Optional, Tuple

import torch

from gnnio.graph import Graph
from gnnio.ops import column_sum

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


class _LinearsOfOneInput(torch.autograd.Function):
    """y_k = x W_k^T + b_k for several linears of one input x. The backward writes d x once,
    each d y_k W_k added into the same buffer by its GEMM (``addmm_``, beta 1: the same sum
    fl(d x + d y_k W_k) as autograd's add), where autograd would make one [N, in] gradient per
    linear and add them: k - 1 elementwise passes over [N, in] (0.7 ms each at 1M x 256 fp32 on
    an H200) and two such buffers alive at once. (forward / setup_context separate, as
    torch.func's transforms need.)"""

    @staticmethod
    def forward(x, *weights_and_biases):
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases))

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, *weights_and_biases = inputs
        ctx.save_for_backward(x, *weights_and_biases[0::2])
        ctx.has_bias = [b is not None for b in weights_and_biases[1::2]]

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        need = ctx.needs_input_grad
        x2 = x.reshape(-1, x.size(-1))
        flat = [g.reshape(-1, g.size(-1)) for g in grads]
        grad_x = None
        if need[0]:
            for g, w in zip(flat, weights):
                grad_x = torch.mm(g, w) if grad_x is None else grad_x.addmm_(g, w)
            grad_x = grad_x.view(x.shape)
        result = [grad_x]
        for k, g in enumerate(flat):
            result.append(g.t().mm(x2) if need[1 + 2 * k] else None)
            result.append(column_sum(g) if ctx.has_bias[k] and need[2 + 2 * k] else None)
        return tuple(result)


# With a separate setup_context, Function.apply binds its arguments to forward's signature on
# every call, and inspect.signature parses it each time unless the function carries one: ~20 us
# of a ~120 us call (four linears of a tiny input, CPU), host time that the small graphs' layer
# calls are made of (NOTES v15: cora's TransformerConv forward keeps the GPU busy 0.08 ms).
_LinearsOfOneInput.forward.__signature__ = inspect.signature(_LinearsOfOneInput.forward)


def _plain_linear(lin: torch.nn.Module) -> bool:
    """A torch.nn.Linear whose call is exactly F.linear: not a subclass or wrapper (QAT, LoRA),
    no hooks of its own or global ones (weight_norm, spectral_norm, user hooks)."""
    from torch.nn.modules import module as m
    return (type(lin) is torch.nn.Linear and not lin._forward_hooks and not lin._forward_pre_hooks
            and not m._global_forward_hooks and not m._global_forward_pre_hooks)


def linears_of_one_input(x: torch.Tensor, *linears: torch.nn.Module) -> Tuple[torch.Tensor, ...]:
    """``tuple(lin(x) for lin in linears)``, with one d x buffer in the backward (see
    :class:`_LinearsOfOneInput`) when every one is a plain ``torch.nn.Linear``
    (:func:`_plain_linear`); each module's own call otherwise, under autocast (whose casts the
    Function would have to repeat) and for a single linear."""
    if (len(linears) < 2 or torch.is_autocast_enabled(x.device.type)
            or not all(_plain_linear(lin) for lin in linears)):
        return tuple(lin(x) for lin in linears)
    args = []
    for lin in linears:
        args += [lin.weight, lin.bias]
    return _LinearsOfOneInput.apply(x, *args)
