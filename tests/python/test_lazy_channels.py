"""Lazy input sizes (``in_channels=-1``, PyG's lazy initialisation): the linears take their
input size from the first call, are then initialised as PyG initialises them, and become plain
torch.nn.Linear modules. Checked against PyG's lazy layers: same state_dict keys, same shapes
after the first call, same forward and backward once the weights are shared
(layer_pairs.check_against_pyg's precision rule), and checkpoints loading both ways."""
import math

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnio.nn
from graphs import random_graph
from layer_pairs import check_against_pyg

F_SRC, F_DST, F_EDGE = 7, 5, 3

# (layer, in_channels, options); a tuple in_channels is bipartite (F_SRC, F_DST features)
LAZY = [
    ("GCNConv", -1, {}), ("GCNConv", -1, {"normalize": False}),
    ("GraphConv", -1, {}), ("GraphConv", (-1, F_DST), {"aggr": "mean"}),
    ("GraphConv", (F_SRC, -1), {"aggr": "max"}),
    ("SAGEConv", -1, {}), ("SAGEConv", (-1, -1), {"aggr": "max", "normalize": True}),
    ("GATConv", -1, {"heads": 2}), ("GATConv", (-1, -1), {"heads": 2, "residual": True}),
    ("GATConv", -1, {"heads": 2, "edge_dim": F_EDGE}),
    ("GATv2Conv", -1, {"heads": 2, "share_weights": True}),
    ("GATv2Conv", (-1, -1), {"heads": 2, "residual": True, "add_self_loops": False}),
    ("TransformerConv", -1, {"heads": 2, "beta": True}),
    ("TransformerConv", (-1, -1), {"heads": 2, "concat": False}),
]
IDS = [f"{name}-{c}-{'-'.join(f'{k}={v}' for k, v in opts.items()) or 'default'}"
       for name, c, opts in LAZY]

# PyG's weight initialiser per layer: glorot where it passes weight_initializer='glorot'
GLOROT = {"GCNConv", "GATConv", "GATv2Conv"}


def _inputs(name, in_channels, opts, device):
    bipartite = isinstance(in_channels, tuple)
    n_src, n_dst = (40, 23) if bipartite else (40, 40)
    ei, _ = random_graph(n_src, 200)
    ei[1] %= n_dst
    t = {"x_src": torch.randn(n_src, F_SRC, device=device),
         "x_dst": torch.randn(n_dst, F_DST, device=device) if bipartite else None,
         "edge_attr": torch.randn(ei.size(1), F_EDGE, device=device) if "edge_dim" in opts else None}

    def call(layer, t):
        x = (t["x_src"], t["x_dst"]) if t["x_dst"] is not None else t["x_src"]
        return layer(x, ei.to(device), t["edge_attr"]) if t["edge_attr"] is not None \
            else layer(x, ei.to(device))
    return t, call


def _linears(layer):
    return {k: m for k, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}


def _lazy_params(layer):
    """The weights waiting for their input size (PyG's lazy Linear sizes its bias at once,
    torch's LazyLinear, under gnnio's, with the weight)."""
    return {k for k, p in layer.named_parameters()
            if torch.nn.parameter.is_lazy(p) and k.endswith("weight")}


@pytest.mark.parametrize("name,in_channels,opts", LAZY, ids=IDS)
def test_lazy_layer_materialises_like_pyg(device, name, in_channels, opts):
    pyg = getattr(pyg_nn, name)(in_channels, 4, **opts).to(device)
    ours = getattr(gnnio.nn, name)(in_channels, 4, **opts).to(device)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    assert _lazy_params(ours) == _lazy_params(pyg) != set()
    ours.reset_parameters()  # before materialisation: leaves the lazy ones alone
    t, call = _inputs(name, in_channels, opts, device)
    call(pyg, t)
    call(ours, t)
    assert not _lazy_params(ours)
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: v.shape for k, v in pyg.state_dict().items()}
    # plain Linear modules from now on, so the layers' fused linear paths take them
    assert all(type(m) is torch.nn.Linear for m in _linears(ours).values())
    ours.load_state_dict(pyg.state_dict())
    check_against_pyg(pyg, ours, call, t)


@pytest.mark.parametrize("name,in_channels,opts", LAZY, ids=IDS)
def test_lazy_layer_loads_a_materialised_checkpoint(device, name, in_channels, opts):
    """A checkpoint of a materialised layer (PyG's or gnnio's) loads into a fresh lazy layer of
    the other library before its first call."""
    pyg = getattr(pyg_nn, name)(in_channels, 4, **opts).to(device)
    t, call = _inputs(name, in_channels, opts, device)
    ref = call(pyg, t)
    ours = getattr(gnnio.nn, name)(in_channels, 4, **opts).to(device)
    ours.load_state_dict(pyg.state_dict())
    out = call(ours, t)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)  # float32 sums in another order
    back = getattr(pyg_nn, name)(in_channels, 4, **opts).to(device)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(call(back, t), ref, rtol=0, atol=0)


@pytest.mark.parametrize("name,in_channels,opts", LAZY, ids=IDS)
def test_lazy_weights_are_initialised_as_pyg_initialises_them(device, name, in_channels, opts):
    """After the first call each materialised linear is drawn from PyG's initialiser for that
    layer: glorot U(-a, a), a = sqrt(6 / (fan_in + fan_out)), or kaiming_uniform(a=sqrt(5)),
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), with a bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    torch.manual_seed(0)
    ours = getattr(gnnio.nn, name)(in_channels, 4, **opts).to(device)
    lazy = {k.rsplit(".", 1)[0] for k in _lazy_params(ours)}
    t, call = _inputs(name, in_channels, opts, device)
    call(ours, t)
    for key, lin in _linears(ours).items():
        if key not in lazy:
            continue
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out)) if name in GLOROT else 1.0 / math.sqrt(fan_in)
        w = lin.weight.detach().abs()
        # within the bound, and spread over it: the max of >= 20 uniform draws is past 0.5 a
        # with probability 1 - 2^-20
        assert w.max() <= bound and w.max() > 0.5 * bound, (key, w.max().item(), bound)
        if lin.bias is not None:
            assert lin.bias.detach().abs().max() <= 1.0 / math.sqrt(fan_in)
    ours.reset_parameters()  # after materialisation: redraws, same bounds
    for key, lin in _linears(ours).items():
        if key in lazy:
            fan_out, fan_in = lin.weight.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out)) if name in GLOROT else 1.0 / math.sqrt(fan_in)
            assert lin.weight.detach().abs().max() <= bound


def test_lazy_sizes_that_pyg_refuses():
    with pytest.raises(ValueError, match="lazy"):
        gnnio.nn.SAGEConv(-1, 4, project=True)
    with pytest.raises(ValueError, match="positive"):
        gnnio.nn.GATConv(8, -1)
    with pytest.raises(ValueError, match="positive"):
        gnnio.nn.TransformerConv(8, 4, heads=0)
    with pytest.raises(ValueError, match="ints"):
        gnnio.nn.GCNConv(8.0, 4)
