"""The base class of gnnio's layers: PyG's ``MessagePassing`` when PyG is installed, so the tools
that find graph layers by that type see gnnio's too.

- ``to_hetero`` turns each MessagePassing call into one call per edge type (other modules are
  called per node type, where they would get no edge_index).
- ``Explainer`` sets an edge mask on each MessagePassing module and reads its gradient. A mask
  scales every message of its edge, a tensor gnnio's fused kernels never form, so while a layer
  is explained it runs PyG's own layer class on the same parameters and submodules (the same
  state_dict keys): the explanation is PyG's, by construction. Explaining is a small-graph tool;
  nothing else takes that path.

gnnio's layers never call ``propagate``; its hooks (``register_propagate_forward_hook`` and the
like) do not fire. Module hooks do.
"""
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

    def __call__(self, *args, **kwargs):
        if getattr(self, "_explain", None) is True:
            return _explained_call(self, args, kwargs)
        return super().__call__(*args, **kwargs)


def _explained_call(layer: torch.nn.Module, args, kwargs):
    from gnnio.graph import Graph

    if any(isinstance(a, Graph) for a in (*args, *kwargs.values())):
        raise NotImplementedError(
            f"gnnio.nn.{type(layer).__name__}: an explained layer needs the edge_index the "
            "Explainer's edge mask is laid over, not a gnnio.Graph")
    twin = _TWINS.get(layer)
    if twin is None:
        twin = _TWINS[layer] = _pyg_twin(layer)
    twin.train(layer.training)
    twin.explain = True
    twin._edge_mask, twin._loop_mask = layer._edge_mask, layer._loop_mask
    twin._apply_sigmoid = layer._apply_sigmoid
    return twin(*args, **kwargs)


def _pyg_twin(layer: torch.nn.Module) -> torch.nn.Module:
    """PyG's class of the same name, built from the layer's settings (its attributes of the
    constructor's argument names), then given the layer's own parameter, buffer and submodule
    dicts: the same objects, so gradients and later updates are shared."""
    import torch_geometric.nn as pyg_nn

    cls = getattr(pyg_nn, type(layer).__name__)
    settings = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or name == "self" or not hasattr(layer, name):
            continue
        value = getattr(layer, name)
        if isinstance(value, (torch.nn.Module, torch.nn.Parameter)) or (name == "bias" and value is None):
            continue  # a learnable part: it comes with the dicts below
        settings[name] = value
    twin = cls(**settings)
    twin._parameters, twin._buffers, twin._modules = layer._parameters, layer._buffers, layer._modules
    return twin
