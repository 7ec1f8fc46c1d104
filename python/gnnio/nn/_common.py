"""What every gnnio layer shares: turning the edge_index argument into a cached Graph, splitting
(x_src, x_dst) pairs, and refusing PyG options that a layer does not implement yet."""
import inspect
import math
import weakref
from typing import Optional, Tuple

import torch

from gnnio.adjacency import adjacency_key, adjacency_values, is_sparse_adjacency
from gnnio.graph import Graph, refuse_traced
from gnnio.ops import column_sum

# MessagePassing keyword arguments and the only values gnnio implements.
_MESSAGE_PASSING_DEFAULTS = {"flow": "source_to_target", "node_dim": -2, "decomposed_layers": 1}


def check_kwargs(layer: str, kwargs: dict) -> None:
    for name, value in kwargs.items():
        if name in _MESSAGE_PASSING_DEFAULTS and value == _MESSAGE_PASSING_DEFAULTS[name]:
            continue
        raise NotImplementedError(f"gnnio.nn.{layer} does not support the argument {name}={value!r} yet")


def check_sum_kwargs(layer: str, kwargs: dict) -> None:
    """check_kwargs for a layer whose aggregation is the sum: PyG's ``aggr='add'`` (its default)
    or ``'sum'``, the same aggregation there, are accepted; anything else is refused."""
    if kwargs.get("aggr", "add") in ("add", "sum"):
        kwargs.pop("aggr", None)
    check_kwargs(layer, kwargs)


def check_channels(layer: str, *channels) -> None:
    """Output sizes, heads and edge_dim: positive ints."""
    for c in channels:
        if not isinstance(c, int) or isinstance(c, bool) or c <= 0:
            raise ValueError(f"gnnio.nn.{layer}: sizes must be positive ints, got {c!r}")


def check_in_channels(layer: str, *channels) -> None:
    """Input sizes: positive ints, or -1 (any int <= 0, as PyG's Linear) for a size inferred from
    the first input (lazy initialisation, see :func:`linear`)."""
    for c in channels:
        if not isinstance(c, int) or isinstance(c, bool):
            raise ValueError(f"gnnio.nn.{layer}: input sizes must be ints (-1 for lazy), got {c!r}")


def glorot(t: torch.Tensor) -> None:
    """PyG's glorot: U(-a, a), a = sqrt(6 / (fan_in + fan_out)) over the last two dims."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


def reset_linear(lin: torch.nn.Linear, weight_initializer: Optional[str] = None) -> None:
    """PyG's Linear.reset_parameters: 'glorot' or (None) kaiming_uniform(a=sqrt(5)) for the
    weight, U(-1/sqrt(in), 1/sqrt(in)) for the bias; the same formulas as PyG, so a seeded
    construction gives the same numbers. A lazy linear not yet materialised is left alone (it
    is initialised so when its input size is known)."""
    fan = lin.in_features
    if fan <= 0 or torch.nn.parameter.is_lazy(lin.weight):
        return
    with torch.no_grad():
        if weight_initializer == "glorot":
            glorot(lin.weight)
        else:
            bound = math.sqrt(6 / ((1 + math.sqrt(5) ** 2) * fan))
            lin.weight.uniform_(-bound, bound)
        if lin.bias is not None:
            bound = 1.0 / math.sqrt(fan)
            lin.bias.uniform_(-bound, bound)


class _LazyLinear(torch.nn.LazyLinear):
    """torch's LazyLinear, made to behave as PyG's Linear(-1, ...): only the weight waits for the
    input size (the bias is a real [out] tensor from the start, so checkpoints of uncalled layers
    load both ways between PyG and gnnio); once the first input gives the size, the weight is
    drawn by ``weight_initializer`` (PyG's formulas, in PyG's order of draws) and the module
    becomes a plain torch.nn.Linear (so the fused multi-linear and reassociated paths take it). A
    state_dict loaded before the first call sets the weight and the input size."""

    def __init__(self, out_features: int, bias: bool, weight_initializer: Optional[str]):
        self.weight_initializer = weight_initializer
        super().__init__(out_features, bias=bias)
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features))

    def initialize_parameters(self, input) -> None:
        if self.has_uninitialized_params():
            with torch.no_grad():
                self.in_features = input.shape[-1]
                self.weight.materialize((self.out_features, self.in_features))
                self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_linear(self, self.weight_initializer)  # (a no-op until the size is known)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if not torch.nn.parameter.is_lazy(self.weight):
            self.in_features = self.weight.shape[1]


def linear(in_features: int, out_features: int, bias: bool = True,
           weight_initializer: Optional[str] = None) -> torch.nn.Module:
    """torch.nn.Linear, or for ``in_features <= 0`` (PyG's lazy -1) one whose input size comes
    from its first input. The caller initialises a materialised one (reset_linear)."""
    if in_features > 0:
        return torch.nn.Linear(in_features, out_features, bias=bias)
    return _LazyLinear(out_features, bias, weight_initializer)


@torch.compiler.disable
def _materialise(pairs) -> None:
    for lin, x in pairs:
        if isinstance(lin, _LazyLinear) and x is not None:
            lin(x[:1])  # the size hook materialises it; the module becomes a torch.nn.Linear


def materialise_lazy(*pairs) -> None:
    """Gives each lazy linear of ``(linear, its input)`` its size, in the order given (PyG's
    order of first calls, so a seeded construction draws the same weights), before a layer
    chooses a path by whether its linears are plain: under torch.compile the choice must not
    change when a call materialises one mid-trace (outside the compiled graph). (A class test,
    which torch.compile folds: a _LazyLinear becomes a torch.nn.Linear at its first call.)"""
    if any(isinstance(lin, _LazyLinear) for lin, _ in pairs):
        _materialise(pairs)


def flat_edge_weight(edge_weight):
    """An edge_weight of shape [E, 1] as [E], as PyG's messages broadcast it."""
    if isinstance(edge_weight, torch.Tensor) and edge_weight.dim() == 2 and edge_weight.size(1) == 1:
        return edge_weight.view(-1)
    return edge_weight


def per_node(aggregate, x: torch.Tensor) -> torch.Tensor:
    """``aggregate(x)`` for x ``[N, F]``; for PyG's batched x ``[..., N, F]`` (node_dim=-2: one
    graph, several feature sets) the same aggregation of each, as one call on ``[N, B * F]``."""
    if x.dim() == 2:
        return aggregate(x)
    if x.dim() < 2:
        raise ValueError(f"node features must be [N, F] or [..., N, F], got shape {list(x.shape)}")
    lead, (n, f) = x.shape[:-2], x.shape[-2:]
    b = x[..., 0, 0].numel()
    out = aggregate(x.reshape(b, n, f).transpose(0, 1).reshape(n, b * f))
    out = out.view(out.size(0), b, f).transpose(0, 1).contiguous()  # contiguous, as PyG's
    return out.view(*lead, out.size(1), f)


def split_pair(x) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    if isinstance(x, torch.Tensor):
        return x, x
    if isinstance(x, (tuple, list)) and len(x) == 2:
        if not isinstance(x[0], torch.Tensor):
            raise TypeError("x[0] (source features) must be a Tensor")
        return x[0], x[1]
    raise TypeError(f"x must be a Tensor or a pair (x_src, x_dst), got {type(x).__name__}")


def version_of(t: torch.Tensor):
    """The in-place version counter, for cache keys. Inference tensors have none, and inside
    inference mode they can be modified in place without a trace: for them a new object on
    every call, equal to no earlier key, so nothing cached from them is reused."""
    return object() if t.is_inference() else t._version


class _SharedGraphs:
    """The Graphs built from tensors, shared by every layer's GraphCache: the layers of a model
    called with the same edge_index (each mini-batch's new one) build its Graph, and the
    structures derived from it (self loops, transposes, plans), once, not once a layer. (CPU,
    50K nodes / 500K edges: a new edge_index cost a GATConv call 35 ms, a SAGEConv 15, a GCNConv
    45 of building: bench/NOTES.md.) One entry a tensor, the last key built; it goes when the
    tensor does (a weak reference's callback), so a batch's Graph is freed with its batch; any
    layer's reset_parameters() empties it."""

    def __init__(self):
        self._entries = {}  # id(tensor) -> (weak reference, key, Graph)

    def get(self, tensor: torch.Tensor, key) -> Optional[Graph]:
        entry = self._entries.get(id(tensor))
        if entry is not None and entry[0]() is tensor and entry[1] == key:
            return entry[2]
        return None

    def put(self, tensor: torch.Tensor, key, graph: Graph) -> None:
        entries, i = self._entries, id(tensor)

        def forget(ref):
            if entries.get(i, (None,))[0] is ref:  # (not a later tensor's at the same id)
                del entries[i]
        entries[i] = (weakref.ref(tensor, forget), key, graph)

    def clear(self) -> None:
        self._entries.clear()


_SHARED = _SharedGraphs()


class GraphCache:
    """Per-layer cache of the Graph built from a plain edge_index Tensor or a sparse adjacency.

    The Graph is reused while the caller passes the same tensor object, unmodified (same
    version counter) and with the same node counts; anything else builds a new one, or takes
    the one another layer built from that tensor, unmodified, at those counts (_SharedGraphs).
    This is what PyG's ``cached=True`` gives for a fixed graph, but safe when the graph changes.
    ``clear()`` (``reset_parameters()``) forgets the layer's Graph and every shared one: the way
    to see writes that bypass the version counter.
    """

    def __init__(self):
        self._forget()

    def get(self, edge_index, num_src: int, num_dst: Optional[int], share: bool = True) -> Graph:
        if isinstance(edge_index, Graph):
            if edge_index.num_src != num_src or (num_dst is not None and edge_index.num_dst != num_dst):
                raise ValueError(
                    f"the Graph has (num_src, num_dst) = ({edge_index.num_src}, {edge_index.num_dst}) "
                    f"but the features give ({num_src}, {num_dst})")
            return edge_index
        if not isinstance(edge_index, torch.Tensor):
            raise TypeError("edge_index must be a Tensor [2, E], a torch_geometric.EdgeIndex, a "
                            "sparse adj_t [num_dst, num_src] (torch.sparse COO, CSR or CSC) or a "
                            f"gnnio.Graph, got {type(edge_index).__name__}")
        num_dst = num_src if num_dst is None else num_dst
        refuse_traced(edge_index)
        if is_sparse_adjacency(edge_index):
            key = adjacency_key(edge_index) + (num_src, num_dst, edge_index.device)
        else:
            key = (edge_index.data_ptr(), version_of(edge_index), tuple(edge_index.shape), num_src,
                   num_dst, edge_index.device)
        if self._key is not None and self._key[0]() is edge_index and self._key[1] == key:
            return self._graph
        graph = _SHARED.get(edge_index, key) if share else None
        if graph is None:
            graph = Graph(edge_index, size=(num_src, num_dst))
            if share:
                _SHARED.put(edge_index, key, graph)
        self._key, self._graph, self._unit_values = (weakref.ref(edge_index), key), graph, None
        return graph

    def get_weighted(self, layer: str, edge_index, edge_weight, num_src: int,
                     num_dst: Optional[int]) -> Tuple[Graph, Optional[torch.Tensor]]:
        """(graph, edge weights): ``edge_weight`` as given for an edge_index; for a sparse
        adjacency its values, which PyG's spmm multiplies by. None instead when they are all 1
        and need no gradient (checked once per adjacency, so the unweighted caches serve; values
        that require grad are always passed on, as training changes them in place)."""
        if not is_sparse_adjacency(edge_index):
            return self.get(edge_index, num_src, num_dst), flat_edge_weight(edge_weight)
        if edge_weight is not None:
            raise ValueError(f"gnnio.nn.{layer}: edge_weight cannot be given with a sparse "
                             "adjacency (PyG would ignore it): its values are the edge weights")
        if edge_index.layout == torch.sparse_coo and not edge_index.is_coalesced():
            # PyG's spmm makes CSR of a COO adjacency: duplicate entries become one, their
            # values summed (a mean counts them once, a max sees the sum).
            structure, values = self._coalesce(edge_index)
        else:
            structure, values = edge_index, adjacency_values(edge_index)
        # (the coalesced copy is this layer's own: no other layer is given it)
        graph = self.get(structure, num_src, num_dst, share=structure is edge_index)
        if values.dim() != 1:
            raise NotImplementedError(f"gnnio.nn.{layer}: a sparse adjacency with "
                                      f"{values.dim() - 1} dense value dimensions is not supported")
        if not values.dtype.is_floating_point:
            raise TypeError(f"gnnio.nn.{layer}: the sparse adjacency's values must be floating "
                            f"point, got {values.dtype}")
        if values.requires_grad:
            return graph, values
        if self._unit_values is None:
            self._unit_values = bool((values == 1).all())
        return graph, None if self._unit_values else values

    def coalesced(self, adj: torch.Tensor) -> torch.Tensor:
        """adj.coalesce(): the kept coalesced copy (see _coalesce) while the same unmodified
        adjacency comes back, a fresh coalesce when its values need a gradient."""
        return adj.coalesce() if adj.requires_grad else self._coalesce(adj)[0]

    def _coalesce(self, adj: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(structure, values) of adj.coalesce(). The structure (a coalesced copy without
        gradient) is kept while the same unmodified adjacency is passed, so its Graph is too; the
        values come through adj.coalesce() when they need a gradient (same entry order)."""
        key = adjacency_key(adj)
        if self._coalesced is None or self._coalesced[0]() is not adj or self._coalesced[1] != key:
            self._coalesced = (weakref.ref(adj), key, adj.detach().coalesce())
        structure = self._coalesced[2]
        return structure, adj.coalesce().values() if adj.requires_grad else structure.values()

    def clear(self):
        """Forgets this layer's Graph and every shared one: a tensor written through ``.data``
        (no version bump) may be any earlier one a layer got, not only this layer's last, and
        the shared Graphs are rebuilt at their next use."""
        _SHARED.clear()
        self._forget()

    def _forget(self):
        self._key = self._graph = self._unit_values = self._coalesced = None

    def __getstate__(self):  # a pickled layer (torch.save, multiprocessing) starts uncached
        return {}

    def __setstate__(self, state):
        self._forget()


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
    Function would have to repeat), for a single linear, and without grad mode (no backward to
    share a buffer in; the same F.linear calls, and torch.compile's fullgraph tracing of an
    autograd Function under no_grad fails)."""
    if (len(linears) < 2 or not torch.is_grad_enabled() or torch.is_autocast_enabled(x.device.type)
            or not all(_plain_linear(lin) for lin in linears)):
        return tuple(lin(x) for lin in linears)
    args = []
    for lin in linears:
        args += [lin.weight, lin.bias]
    return _LinearsOfOneInput.apply(x, *args)
