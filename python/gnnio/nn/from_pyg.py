"""Moving an existing PyG model onto gnnio's layers: ``model = gnnio.nn.from_pyg(model)``.

Most PyG users do not construct ``GATConv`` themselves: they build ``torch_geometric.nn.models.GAT``
(or GCN, GraphSAGE), a model from a tutorial, a ``to_hetero`` graph module, or load a checkpoint
of one. Changing imports does not reach the layers those build. ``from_pyg`` walks the module
tree and puts gnnio's layer in place of each PyG layer it has, built from that layer's settings
and holding the **same Parameter objects**: the state_dict keys and values do not change, an
optimizer built before the call keeps updating the model, and a later ``load_state_dict`` of a
PyG checkpoint loads as before.
"""
import inspect
import warnings
from typing import Dict, List, Tuple

import torch
from torch.nn.parameter import is_lazy

from gnnio.nn._base import _HOOK_DICTS

_LAYERS = ("GCNConv", "GINConv", "GraphConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv")

# Constructor arguments PyG keeps under another name or as state.
_SETTING_OF = {"eps": lambda old: old.initial_eps,  # GINConv: eps is its tensor
               "train_eps": lambda old: isinstance(old.eps, torch.nn.Parameter)}

# torch's per-module hook dicts that a user (or a library) fills through register_*_hook; the
# handles they returned hold the dict, so the new layer takes the dict object itself.
_MODULE_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                      "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                      "_backward_pre_hooks")

# MessagePassing settings that are not constructor arguments of the layers: passed on where they
# differ from PyG's defaults, so gnnio's layer refuses what it does not support.
_PASSED_IF_SET = {"flow": "source_to_target", "decomposed_layers": 1}


def from_pyg(module: torch.nn.Module, *, strict: bool = False) -> torch.nn.Module:
    r"""Replaces, in place, each PyG ``GCNConv``, ``GINConv``, ``GraphConv``, ``SAGEConv``,
    ``GATConv``, ``GATv2Conv`` and ``TransformerConv`` inside ``module`` by gnnio's layer of the
    same class and settings, and returns ``module`` (or the new layer, when ``module`` is itself
    one of those).

    The new layer holds the old one's Parameter and buffer objects (not copies; frozen ones stay
    frozen), its training flags, and its forward, backward and message-passing hooks; a
    ``GINConv`` keeps its ``nn`` module itself. A layer used at several places becomes one gnnio
    layer used at the same places.

    A layer gnnio cannot run the same way stays PyG's, and a warning names it and says why
    (``strict=True`` raises ``NotImplementedError`` and replaces nothing). That is: a subclass of
    a PyG layer (it may override message passing), a setting gnnio does not support
    (``SAGEConv`` with an ``'lstm'`` aggregation, ``decomposed_layers > 1``, ...), changed parts
    (a hooked or subclassed linear, a replaced ``aggr_module``), and a layer an ``Explainer`` is
    explaining right now (convert the model before building the explainer). Other modules are
    left as they are, and their children are searched.
    """
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError as e:  # gnnio's layers run without PyG; converting from it needs it
        raise ImportError("gnnio.nn.from_pyg needs torch_geometric installed") from e
    import gnnio.nn

    ours = {getattr(pyg_nn, name): getattr(gnnio.nn, name) for name in _LAYERS}
    done: Dict[int, torch.nn.Module] = {}  # id(a visited module) -> what takes its place
    kept: List[Tuple[str, str]] = []

    def replacement(path: str, old: torch.nn.Module) -> torch.nn.Module:
        if id(old) in done:
            return done[id(old)]
        new, reason = old, None
        if type(old) in ours:
            try:
                new = _converted(old, ours[type(old)])
            except (NotImplementedError, ValueError, AttributeError) as e:
                reason = str(e)
        else:
            parent = next((c for c in ours if isinstance(old, c)), None)
            if parent is not None:
                reason = (f"a subclass of PyG's {parent.__name__} ({type(old).__qualname__}), "
                          "which may change its message passing")
        if reason is not None:
            where = path or "the module"
            if strict:
                raise NotImplementedError(f"gnnio.nn.from_pyg: {where}: {reason}")
            kept.append((where, reason))
        done[id(old)] = new
        return new

    # The replacements are found first and made at the end, so a strict failure leaves the
    # module as it was (building them changes nothing in the old layers).
    places: List[Tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def visit(parent: torch.nn.Module, prefix: str) -> None:
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            seen = id(child) in done
            new = replacement(path, child)
            if new is not child:
                places.append((parent, name, new))
            elif not seen and type(child) not in ours:
                visit(child, path)

    top = replacement("", module)
    if top is module and type(module) not in ours:
        visit(module, "")
    for parent, name, new in places:
        parent._modules[name] = new
    if kept:
        lines = "\n".join(f"  {where}: {reason}" for where, reason in kept)
        warnings.warn(f"gnnio.nn.from_pyg left {len(kept)} layer(s) as PyG's:\n{lines}", stacklevel=2)
    return top


def _converted(old: torch.nn.Module, cls: type) -> torch.nn.Module:
    """gnnio's ``cls`` with ``old``'s settings, parameters, buffers, mode and hooks."""
    if old._explain or "explain_message" in old.__dict__:
        raise ValueError("an Explainer is explaining it (convert the model before building the "
                         "Explainer)")
    settings, modules = {}, {}
    signature = inspect.signature(cls.__init__).parameters
    for name, p in signature.items():
        if name in ("self", "bias") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if name in _SETTING_OF:
            settings[name] = _SETTING_OF[name](old)
            continue
        value = getattr(old, name)  # PyG keeps each constructor argument by its name
        if isinstance(value, torch.nn.Module):  # GINConv's nn: the user's module itself, kept
            modules[name] = value
            value = torch.nn.Identity()  # (at construction: its reset_parameters would redraw it)
        settings[name] = value
    if "aggr" not in settings and old.aggr != "add":
        settings["aggr"] = old.aggr
    for name, default in _PASSED_IF_SET.items():
        if getattr(old, name, default) != default:
            settings[name] = getattr(old, name)

    state = old.state_dict(keep_vars=True)
    requires_grad = {k: v.requires_grad for k, v in state.items() if not is_lazy(v)}
    new, tried = None, []
    # bias=False drops every bias of the layer in PyG and in gnnio alike; which one old was
    # built with shows in its keys (PyG keeps no flag).
    for bias in (True, False) if "bias" in signature else (None,):
        with torch.device("meta"):  # no memory and no random draws: the parameters are old's
            candidate = cls(**settings, **({} if bias is None else {"bias": bias}))
        for name, module in modules.items():
            setattr(candidate, name, module)
        theirs = candidate.state_dict(keep_vars=True)
        if set(theirs) == set(state) and all(_fits(state[k], theirs[k]) for k in state):
            new = candidate
            break
        tried.append(f"bias={bias}: {sorted(theirs)}")
    if new is None:
        raise ValueError(f"its parameters {sorted(state)} match neither of gnnio's layer's "
                         f"({'; '.join(tried)})")
    if new.node_dim != old.node_dim:
        raise ValueError(f"node_dim={old.node_dim} (gnnio's layer has {new.node_dim})")
    _check_submodules(old, kept=tuple(modules))
    # PyG aggregates with aggr_module, which a user may have replaced after construction.
    if type(new.aggr_module) is not type(old.aggr_module):
        raise ValueError(f"its aggr_module is a {type(old.aggr_module).__name__}, not what "
                         f"aggr={old.aggr!r} makes")
    # The same objects: assign=True puts each Parameter (keep_vars) in place of the meta one. A
    # lazy weight (in_channels=-1, not yet called), which load_state_dict cannot take, is put in
    # place directly: gnnio's lazy linear materialises that object at its first call.
    lazy = {k for k, v in state.items() if is_lazy(v)}
    new.load_state_dict({k: v for k, v in state.items() if k not in lazy}, strict=False, assign=True)
    for k in lazy:
        owner, _, leaf = k.rpartition(".")
        new.get_submodule(owner)._parameters[leaf] = state[k]
    for name, value in new.state_dict(keep_vars=True).items():
        if value is not state[name]:
            raise ValueError(f"{name} could not be shared")
        if name not in lazy:  # (assign=True gave these the meta layer's flags)
            value.requires_grad_(requires_grad[name])
    new.training = old.training  # (the submodules are new: gnnio's own linears, in old's modes)
    for (name, sub) in new.named_modules():
        if name:
            sub.training = old.get_submodule(name).training if _has(old, name) else old.training
    for d in _MODULE_HOOK_DICTS + _HOOK_DICTS:
        hooks = getattr(old, d, None)
        if hooks:
            if getattr(new, d):
                raise ValueError(f"both layers have {d}")
            setattr(new, d, hooks)
    new._is_full_backward_hook = old._is_full_backward_hook  # (which kind _backward_hooks holds)
    return new


def _check_submodules(old: torch.nn.Module, kept: Tuple[str, ...]) -> None:
    """The new layer has gnnio's own linears, given old's parameters: so old's must be plain
    linears without hooks of their own (a user's Linear subclass or a hooked sublayer would
    silently lose its behaviour), and nothing else but its aggregation module and the modules
    the new layer keeps (``kept``: GINConv's nn)."""
    from torch_geometric.nn.aggr import Aggregation
    from torch_geometric.nn.dense.linear import Linear as PyGLinear

    for name, sub in old.named_modules():
        if not name:
            continue
        if name.split(".")[0] == "aggr_module" and isinstance(old.aggr_module, Aggregation):
            continue  # (compared with what aggr makes by the caller)
        if name.split(".")[0] in kept:
            continue
        if type(sub) not in (PyGLinear, torch.nn.Linear):
            raise ValueError(f"its submodule {name} is a {type(sub).__qualname__}, where gnnio's "
                             "layer has a plain linear")
        own = getattr(sub, "_hook", None)  # PyG's lazy Linear sizes itself by a pre-hook
        if any(k != getattr(own, "id", None) for d in _MODULE_HOOK_DICTS for k in getattr(sub, d, {})):
            raise ValueError(f"its submodule {name} has hooks (gnnio's layer has its own linears)")


def _fits(value: torch.Tensor, place: torch.Tensor) -> bool:
    """old's parameter or buffer can stand in place of the new layer's. PyG keeps in_channels=-1
    after its lazy linear got its size, so gnnio's layer of those settings has a lazy weight
    where old has a real one: that loads (and gives the size)."""
    if is_lazy(place):
        return True
    return not is_lazy(value) and value.shape == place.shape


def _has(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False
