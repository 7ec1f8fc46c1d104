"""Lazy input sizes (``in_channels=-1``, PyG's lazy initialisation): the linears take their
input size from the first call, are then initialised as PyG initialises them, and become plain
torch.nn.Linear modules. Checked against PyG's lazy layers: same state_dict keys, same shapes
after the first call, same forward and backward once the weights are shared
(layer_pairs.check_against_pyg's precision rule), and checkpoints loading both ways."""
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
    """The parameters waiting for their input size: the weights (a lazy Linear sizes its bias at
    once, in PyG and in gnnio)."""
    return {k for k, p in layer.named_parameters() if torch.nn.parameter.is_lazy(p)}


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
    # The round trip keeps every parameter's bits, so back is pyg. (Its output is pyg's bits on
    # the CPU only: PyG's scatter on CUDA sums with atomics, so two runs of one layer differ.)
    mine, theirs = back.state_dict(), pyg.state_dict()
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    if device.type == "cpu":
        torch.testing.assert_close(call(back, t), ref, rtol=0, atol=0)


@pytest.mark.parametrize("name,in_channels,opts", LAZY, ids=IDS)
def test_lazy_weights_are_drawn_as_pyg_draws_them(name, in_channels, opts):
    """Seeded alike, the lazy layers draw the same weights as PyG's at their first call: the same
    initialiser per linear (glorot or kaiming_uniform, and the bias), in PyG's order of draws;
    reset_parameters() after it redraws them from the same initialisers."""
    def first_call(lib):
        torch.manual_seed(0)
        layer = getattr(lib, name)(in_channels, 4, **opts)
        t, call = _inputs(name, in_channels, opts, "cpu")
        torch.manual_seed(1)
        call(layer, t)
        return layer
    pyg, ours = first_call(pyg_nn), first_call(gnnio.nn)
    for key, value in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    torch.manual_seed(2)
    pyg.reset_parameters()
    torch.manual_seed(2)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ours.reset_parameters()
    for key, value in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert any(not torch.equal(before[k], v) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("name,in_channels,opts", LAZY, ids=IDS)
def test_checkpoints_of_uncalled_lazy_layers_load_both_ways(name, in_channels, opts):
    """PyG sizes a lazy Linear's bias at once and saves it; gnnio's does the same, so an uncalled
    layer's checkpoint loads into an uncalled layer of the other library, which then runs."""
    t, call = _inputs(name, in_channels, opts, "cpu")
    for src, dst in ((pyg_nn, gnnio.nn), (gnnio.nn, pyg_nn)):
        uncalled = getattr(src, name)(in_channels, 4, **opts)
        layer = getattr(dst, name)(in_channels, 4, **opts)
        layer.load_state_dict(uncalled.state_dict())
        assert call(layer, t).shape[0] == (t["x_dst"] if t["x_dst"] is not None else t["x_src"]).size(0)


@pytest.mark.parametrize("name", ["GATv2Conv", "TransformerConv"])
def test_torch_compile_of_an_uncalled_lazy_layer(name):
    """Both layers pick their fused linear path by whether the linears are plain: the first call
    under torch.compile gives the lazy ones their size before that choice."""
    x, ei = torch.randn(10, 7), torch.randint(0, 10, (2, 30))
    torch._dynamo.reset()
    layer = getattr(gnnio.nn, name)(-1, 4, heads=2)
    out = torch.compile(layer, backend="aot_eager")(x, ei)
    torch.testing.assert_close(out, layer(x, ei))


def test_lazy_sizes_that_pyg_refuses():
    with pytest.raises(ValueError, match="lazy"):
        gnnio.nn.SAGEConv(-1, 4, project=True)
    with pytest.raises(ValueError, match="positive"):
        gnnio.nn.GATConv(8, -1)
    with pytest.raises(ValueError, match="positive"):
        gnnio.nn.TransformerConv(8, 4, heads=0)
    with pytest.raises(ValueError, match="ints"):
        gnnio.nn.GCNConv(8.0, 4)
