"""The base class of gnnio's layers: PyG's ``MessagePassing`` when PyG is installed, so the tools
that find graph layers by that type see gnnio's too.

- ``to_hetero`` turns each MessagePassing call into one call per edge type (other modules are
  called per node type, where they would get no edge_index).
- ``Explainer`` sets an edge mask on each MessagePassing module and reads its gradient;
  GraphMaskExplainer replaces its ``explain_message``; PyG's message-passing hooks
  (``register_message_forward_hook`` and the like: AttentionExplainer, ``to_hetero_with_bases``)
  see each edge's message. All need the per-edge messages that gnnio's fused kernels never form.
  So while a layer is explained, or holds such a hook, it runs PyG's own layer class (its
  "twin") on the same parameters, buffers, submodules (the same state_dict keys) and hook dicts;
  attributes the twin lacks (what explainers and hooks set on the module) are read from the
  layer. The result is PyG's, by construction; hooks are called with the twin as their module.
  These are small-graph tools; nothing else takes that path.
"""
import functools
import inspect
import weakref

import torch

try:
    from torch_geometric.nn import MessagePassing as _Base
except ImportError:  # PyG is optional for gnnio's layers
    _Base = None

# Explained layer -> its PyG twin (built on the first explained call).
_TWINS: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()


class LayerBase(_Base if _Base is not None else torch.nn.Module):
    def __init__(self, aggr: str, node_dim: int):
        if _Base is None:
            super().__init__()
            self.aggr, self.flow, self.node_dim = aggr, "source_to_target", node_dim
        else:
            super().__init__(aggr=aggr, node_dim=node_dim)
            # MessagePassing's flag, False for a class without message_and_aggregate. Here it
            # means "PyG's fused path allowed" for the twin (to_hetero_with_bases clears it).
            self.fuse = True

    def __setstate__(self, data):
        if _Base is not None and "inspector" not in data:
            # Pickled by a gnnio whose layers were plain Modules: MessagePassing's own state
            # (its inspector, flags, hook dicts, aggr_module) from a fresh base.
            fresh = torch.nn.Module.__new__(type(self))
            LayerBase.__init__(fresh, aggr=data.get("aggr", "add"), node_dim=data.get("node_dim", -2))
            data = {**{k: v for k, v in fresh.__dict__.items() if k not in data}, **data}
            data["_modules"] = {**fresh._modules, **data["_modules"]}
        super().__setstate__(data)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # gnnio's own layers only: a user's subclass runs its forward, whose super() call
        # reaches the dispatch.
        if _Base is not None and "forward" in cls.__dict__ and _is_gnnio_layer(cls):
            cls.forward = _per_message_when_needed(cls.__dict__["forward"])


def _is_gnnio_layer(cls: type) -> bool:
    """One of gnnio's own layer classes (each has a PyG class of the same name)."""
    return cls.__module__.startswith("gnnio.nn.conv")


def _per_message_when_needed(forward):
    """The layer's forward, or its twin's while it is explained or holds a message-passing hook
    (inside forward, so the layer's own module hooks run either way)."""
    @functools.wraps(forward)
    def dispatch(self, *args, **kwargs):
        if self._explain is True or any(getattr(self, d) for d in _HOOK_DICTS):
            return _call_as_pyg(self, args, kwargs)
        return forward(self, *args, **kwargs)
    return dispatch


# MessagePassing's per-stage hook dicts (filled by its register_*_hook methods).
_HOOK_DICTS = tuple(f"_{stage}_forward{kind}_hooks" for stage in
                    ("propagate", "message", "aggregate", "message_and_aggregate", "edge_update")
                    for kind in ("_pre", ""))


def _call_as_pyg(layer: torch.nn.Module, args, kwargs):
    from gnnio.graph import Graph

    if any(isinstance(a, Graph) for a in (*args, *kwargs.values())):
        raise NotImplementedError(
            f"gnnio.nn.{type(layer).__name__}: explained or hooked per message, a layer needs the "
            "edge_index its edges are numbered by, not a gnnio.Graph")
    twin = _TWINS.get(layer)
    if twin is None:
        twin = _TWINS[layer] = _pyg_twin(layer)
    twin.training = layer.training  # (the shared submodules keep their own modes)
    twin.fuse = twin._pyg_fuse and layer.fuse
    # The explain setter inspects explain_message's signature only when the flag changes.
    twin.explain = None
    if "explain_message" in layer.__dict__:
        # GraphMaskExplainer's, bound to the layer, where it leaves its messages: called through
        # a weak reference, so the twin (a value of _TWINS) does not keep its key alive.
        twin.explain_message = _weakly_bound(layer, "explain_message")
    else:
        twin.__dict__.pop("explain_message", None)
    twin.explain = layer._explain
    twin._edge_mask, twin._loop_mask = layer._edge_mask, layer._loop_mask
    twin._apply_sigmoid = layer._apply_sigmoid
    return twin(*args, **kwargs)


def _weakly_bound(layer: torch.nn.Module, name: str):
    ref = weakref.ref(layer)

    def call(*args, **kwargs):
        return getattr(ref(), name)(*args, **kwargs)
    # its name and signature, which PyG's inspector reads (functools.wraps would keep the bound
    # method, and with it the layer)
    call.__name__ = call.__qualname__ = name
    call.__signature__ = inspect.signature(layer.__dict__[name])
    return call


# PyG layer class -> its subclass whose instances read missing attributes from their layer.
_TWIN_CLASSES = {}


def _twin_class(cls: type) -> type:
    if cls not in _TWIN_CLASSES:
        def __getattr__(self, name):
            try:
                return cls.__getattr__(self, name)  # torch's: parameters, buffers, submodules
            except AttributeError:
                ref = self.__dict__.get("_gnnio_layer")  # None while PyG's __init__ runs
                layer = ref() if ref is not None else None
                if layer is None:
                    raise
                return getattr(layer, name)

        _TWIN_CLASSES[cls] = type(cls.__name__, (cls,), {"__getattr__": __getattr__,
                                                         "__module__": cls.__module__})
    return _TWIN_CLASSES[cls]


def _pyg_twin(layer: torch.nn.Module) -> torch.nn.Module:
    """PyG's class of the same name, built from the layer's settings (its attributes of the
    constructor's argument names), then given the layer's own parameter, buffer, submodule and
    hook dicts: the same objects, so gradients, later updates and new hooks are shared."""
    import torch_geometric.nn as pyg_nn

    # The gnnio class PyG has (a user's subclass of one is explained as it)
    ours = next(c for c in type(layer).__mro__ if _is_gnnio_layer(c))
    cls = getattr(pyg_nn, ours.__name__)
    settings = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or name == "self" or not hasattr(layer, name):
            continue
        value = getattr(layer, name)
        if isinstance(value, torch.nn.Module) and p.default is p.empty:
            settings[name] = torch.nn.Identity()  # GINConv's nn: the layer's, with _modules below
            continue
        if isinstance(value, torch.nn.Module) or (isinstance(value, torch.Tensor) and name in layer._buffers) \
                or isinstance(value, torch.nn.Parameter) or (name == "bias" and value is None):
            continue  # a learnable part or a buffer (GINConv's eps): it comes with the dicts below
        settings[name] = value
    with torch.device("meta"):  # its own parameters are dropped: no memory, no random draws
        twin = _twin_class(cls)(**settings)
    twin._parameters, twin._buffers, twin._modules = layer._parameters, layer._buffers, layer._modules
    for d in _HOOK_DICTS:
        setattr(twin, d, getattr(layer, d))
    # The settings are read from the layer at each call (through __getattr__), so changes made
    # to it later (add_self_loops, dropout, ...) reach the twin too.
    for name in settings:
        twin.__dict__.pop(name, None)
    # Except GCNConv's cache: gnnio's follows the edge_index object, PyG's keeps the first one's
    # normalisation; the twin recomputes it each call, whatever edge_index comes.
    if "cached" in settings:
        twin.__dict__["cached"] = False
    twin.__dict__["_pyg_fuse"] = twin.fuse
    twin.__dict__["_gnnio_layer"] = weakref.ref(layer)  # not a submodule; the layer owns the twin
    return twin
