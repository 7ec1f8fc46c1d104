"""gnnio.nn.from_pyg: PyG models (PyG's own GCN / GraphSAGE / GAT, user models, to_hetero graph
modules) moved onto gnnio's layers in place. Each converted model against the PyG model it came
from (layer_pairs' rule: outputs and every gradient against PyG float32 and float64), plus what
the conversion must keep: the Parameter objects themselves, hooks, modes, shared layers, lazy
sizes, and PyG's layer where gnnio's would differ."""
import copy
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import models, to_hetero

import gnnio.nn
from graphs import hetero_papers, random_graph, real
from layer_pairs import check_against_pyg

ALL = ("GCNConv", "GraphConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv")

# (layer, args, kwargs): every constructor option the layers share with PyG, bias off included.
LAYERS = [
    ("GCNConv", (8, 6), {}),
    ("GCNConv", (8, 6), {"improved": True, "bias": False}),
    ("GCNConv", (8, 6), {"normalize": False, "add_self_loops": False}),
    ("GraphConv", (8, 6), {"aggr": "mean"}),
    ("GraphConv", ((8, 5), 6), {"aggr": "max", "bias": False}),
    ("SAGEConv", (8, 6), {}),
    ("SAGEConv", (8, 6), {"aggr": "max", "project": True, "bias": False}),
    ("SAGEConv", (8, 6), {"normalize": True, "root_weight": False}),
    ("GATConv", (8, 3), {"heads": 2}),
    ("GATConv", (8, 3), {"heads": 2, "concat": False, "negative_slope": 0.1, "fill_value": "add",
                         "residual": True, "bias": False}),
    ("GATConv", (8, 3), {"heads": 2, "edge_dim": 4, "add_self_loops": False}),
    ("GATv2Conv", (8, 3), {"heads": 2, "share_weights": True}),
    ("GATv2Conv", (8, 3), {"heads": 3, "edge_dim": 4, "residual": True, "bias": False}),
    ("TransformerConv", (8, 3), {"heads": 2}),
    ("TransformerConv", (8, 3), {"heads": 2, "beta": True, "edge_dim": 4, "concat": False}),
    ("TransformerConv", (8, 3), {"heads": 2, "root_weight": False, "bias": False}),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for n, _, kw in LAYERS]


def _inputs(args, kwargs, n=30, e=120, device="cpu"):
    ei, _ = random_graph(n, e)
    first = args[0] if isinstance(args[0], int) else args[0][0]
    t = {"x": torch.randn(n, first, device=device)}
    if kwargs.get("edge_dim"):
        t["edge_attr"] = torch.randn(e, kwargs["edge_dim"], device=device)
    return ei.to(device), t


def _layer_call(ei, args):
    def call(layer, t):
        x = t["x"] if isinstance(args[0], int) else (t["x"], t["x"][:, :args[0][1]])
        return layer(x, ei, t["edge_attr"]) if "edge_attr" in t else layer(x, ei)
    return call


def _pyg_layer(name, args, kwargs):
    layer = getattr(pyg_nn, name)(*args, **kwargs)
    with torch.no_grad():  # PyG zeros some biases: make every parameter informative
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


@pytest.mark.parametrize("name, args, kwargs", LAYERS, ids=IDS)
def test_converted_layer_has_pyg_settings_and_results(device, name, args, kwargs):
    pyg = _pyg_layer(name, args, kwargs).to(device)
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    assert type(ours) is getattr(gnnio.nn, name)
    assert repr(ours) == repr(pyg)
    for k, v in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    ei, t = _inputs(args, kwargs, device=device)
    check_against_pyg(pyg, ours, _layer_call(ei, args), t)


@pytest.mark.parametrize("name, args, kwargs", LAYERS[::3], ids=IDS[::3])
def test_conversion_keeps_the_parameter_objects(name, args, kwargs):
    """In place: the same Parameter objects (an optimizer built before keeps training the model),
    gradients land in them, and the state_dict is unchanged."""
    model = torch.nn.Sequential(_pyg_layer(name, args, kwargs))
    params = dict(model.named_parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gnnio.nn.from_pyg(model) is model
    assert type(model[0]) is getattr(gnnio.nn, name)
    now = dict(model.named_parameters())
    assert now.keys() == params.keys() and all(now[k] is params[k] for k in params)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    ei, t = _inputs(args, kwargs)
    _layer_call(ei, args)(model[0], t).square().sum().backward()
    unused = {"0.lin_skip.weight"} if kwargs.get("root_weight") is False else set()  # (PyG has it)
    assert [k for k, p in params.items() if p.grad is None and k not in unused] == []
    optimizer.step()
    assert any(not torch.equal(params[k], before[k]) for k in params)


# PyG's own models (torch_geometric.nn.models), as users build them.
MODELS = [
    ("GCN", lambda: models.GCN(16, 32, 2, 7)),
    ("GraphSAGE-mean", lambda: models.GraphSAGE(16, 32, 2, 7)),
    ("GraphSAGE-max-jk", lambda: models.GraphSAGE(16, 32, 3, 7, aggr="max", jk="cat")),
    ("GAT", lambda: models.GAT(16, 32, 2, 7, heads=4)),
    ("GATv2-jk-edge_dim", lambda: models.GAT(16, 32, 3, 7, heads=2, v2=True, jk="max", edge_dim=3)),
]


@pytest.mark.parametrize("make", [m for _, m in MODELS], ids=[i for i, _ in MODELS])
def test_pyg_models_on_cora_match_pyg(device, make):
    ei, n = real("cora")
    ei = ei.to(device)
    torch.manual_seed(0)
    pyg = make().to(device).eval()  # (feature dropout off: PyG and gnnio draw it alike anyway)
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    assert [type(c).__module__.split(".")[0] for c in ours.convs] == ["gnnio"] * len(ours.convs)
    t = {"x": torch.randn(n, 16, device=device)}
    if pyg.supports_edge_attr:
        t["edge_attr"] = torch.randn(ei.size(1), 3, device=device)
        check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei, edge_attr=t["edge_attr"]), t)
    else:
        check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), t)


def test_to_hetero_model_converts_per_edge_type():
    """to_hetero's graph module holds one layer per edge type in ModuleDicts; each is converted
    and the module's generated code calls it there."""
    data = hetero_papers()

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = pyg_nn.SAGEConv((-1, -1), 16)
            self.conv2 = pyg_nn.GATConv((-1, -1), 8, add_self_loops=False)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    pyg = to_hetero(Two(), data.metadata(), aggr="sum")
    with torch.no_grad():
        pyg(data.x_dict, data.edge_index_dict)  # the lazy sizes
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    layers = [m for m in ours.modules() if type(m).__name__ in ALL]
    assert len(layers) == 6 and all(type(m).__module__.startswith("gnnio") for m in layers)

    def call(model, t):
        out = model({"paper": t["paper"], "author": t["author"]}, data.edge_index_dict)
        return torch.cat([out["paper"], out["author"]])
    check_against_pyg(pyg, ours, call, dict(data.x_dict))


def test_pyg_sequential_converts():
    from torch_geometric.nn import Sequential
    torch.manual_seed(0)
    pyg = Sequential("x, edge_index", [(pyg_nn.GCNConv(16, 32), "x, edge_index -> x"),
                                       torch.nn.ReLU(inplace=True),
                                       (pyg_nn.GATConv(32, 8, heads=2), "x, edge_index -> x")])
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    assert [type(m).__module__.split(".")[0] for m in ours.children()] == ["gnnio", "torch", "gnnio"]
    ei, _ = random_graph(40, 200)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": torch.randn(40, 16)})


def test_lazy_layers_convert_before_their_first_call():
    """in_channels=-1 not yet called: the lazy weight object is shared, and gnnio's first call
    gives it its size and draws it as PyG's would (same seed, same weights)."""
    ei, _ = random_graph(40, 160)
    x = torch.randn(40, 12)
    torch.manual_seed(3)
    pyg = models.GAT(-1, 16, 2, 5, heads=2)
    pyg(x, ei)
    torch.manual_seed(3)
    ours = models.GAT(-1, 16, 2, 5, heads=2)
    lazy_weight = ours.convs[0].lin.weight
    gnnio.nn.from_pyg(ours)
    assert ours.convs[0].lin.weight is lazy_weight
    ours(x, ei)
    assert ours.convs[0].lin.weight is lazy_weight and lazy_weight.shape == (16, 12)
    for (k, a), (_, b) in zip(pyg.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b), k
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": x})


def test_hooks_mode_and_shared_layers_carry_over():
    layer = _pyg_layer("GATConv", (8, 4), {"heads": 2})
    seen = []
    handle = layer.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    message_seen = []
    layer.register_message_forward_hook(lambda m, i, o: message_seen.append(o.shape))
    model = torch.nn.ModuleList([layer, torch.nn.Linear(8, 8), layer]).eval()
    reference = copy.deepcopy(model)
    gnnio.nn.from_pyg(model)
    assert type(model[0]) is gnnio.nn.GATConv and model[2] is model[0]
    assert not model[0].training
    ei, t = _inputs((8, 4), {})
    out = model[0](t["x"], ei)
    assert seen == [out.shape] and len(message_seen) == 1  # (with a message hook: PyG's class)
    handle.remove()  # the handle from before the conversion still reaches the hook
    model[0](t["x"], ei)
    assert len(seen) == 1
    torch.testing.assert_close(out, reference[0](t["x"], ei))


def _pyg_subclass():
    class MyGAT(pyg_nn.GATConv):
        def message(self, x_j, alpha_j, alpha_i, edge_attr, index, ptr, size_i):
            return 2 * super().message(x_j, alpha_j, alpha_i, edge_attr, index, ptr, size_i)
    return MyGAT(8, 4)


@pytest.mark.parametrize("make, why", [
    (lambda: pyg_nn.SAGEConv(8, 4, aggr="lstm"), "aggr='lstm'"),
    (lambda: pyg_nn.GCNConv(8, 4, decomposed_layers=2), "decomposed_layers=2"),
    (lambda: pyg_nn.GraphConv(8, 4, flow="target_to_source"), "flow='target_to_source'"),
    (_pyg_subclass, "a subclass of PyG's GATConv"),
], ids=["lstm", "decomposed", "flow", "subclass"])
def test_layers_gnnio_would_run_differently_stay_pyg(make, why):
    model = torch.nn.Sequential(make(), pyg_nn.GCNConv(4, 4))
    kept = model[0]
    with pytest.warns(UserWarning, match="left 1 layer") as record:
        gnnio.nn.from_pyg(model)
    assert model[0] is kept and type(model[1]) is gnnio.nn.GCNConv
    assert why in str(record[0].message) and "0: " in str(record[0].message)
    with pytest.raises(NotImplementedError, match=rf"from_pyg: 0: .*{why[:12]}"):
        gnnio.nn.from_pyg(torch.nn.Sequential(make()), strict=True)


def test_an_explained_layer_is_left_to_pyg():
    layer = pyg_nn.GCNConv(8, 4)
    layer._explain = True  # what an Explainer sets while it runs
    with pytest.warns(UserWarning, match="Explainer"):
        assert gnnio.nn.from_pyg(layer) is layer


def test_a_layer_converts_itself_and_other_modules_stay():
    assert type(gnnio.nn.from_pyg(pyg_nn.TransformerConv(8, 4, heads=2))) is gnnio.nn.TransformerConv
    gin = pyg_nn.GINEConv(torch.nn.Linear(8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a layer gnnio does not have is no warning
        assert gnnio.nn.from_pyg(gin) is gin


def test_from_pyg_without_pyg_says_so():
    code = textwrap.dedent("""
        import sys
        sys.modules["torch_geometric"] = None
        import torch, gnnio.nn
        try:
            gnnio.nn.from_pyg(torch.nn.Linear(2, 2))
        except ImportError as e:
            print(e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "needs torch_geometric" in run.stdout


def test_frozen_parameters_stay_frozen():
    """(load_state_dict(assign=True) hands the new layer's requires_grad to what it loads: a
    fine-tuning script's frozen layer would have trained again.)"""
    model = torch.nn.Sequential(pyg_nn.GCNConv(8, 4), pyg_nn.GATConv(4, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)
    frozen = {k: v.clone() for k, v in model[0].state_dict().items()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    gnnio.nn.from_pyg(model)
    assert [p.requires_grad for p in model.parameters()] == [False] * 2 + [True] * 4
    ei, t = _inputs((8, 4), {})
    model[1](model[0](t["x"], ei), ei).sum().backward()
    optimizer.step()
    assert all(torch.equal(model[0].state_dict()[k], v) for k, v in frozen.items())


@pytest.mark.parametrize("register", ["register_full_backward_hook", "register_backward_hook"])
def test_backward_hooks_carry_over(register):
    """(A module's backward hooks run only with its _is_full_backward_hook flag set.)"""
    layer, calls = pyg_nn.GCNConv(8, 4), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # register_backward_hook is deprecated
        getattr(layer, register)(lambda *a: calls.append(1))
    ours = gnnio.nn.from_pyg(layer)
    ei, t = _inputs((8, 4), {})
    t["x"].requires_grad_()
    ours(t["x"], ei).sum().backward()
    assert calls == [1]


class _ScaledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("change, why", [
    (lambda l: l.lin.register_forward_hook(lambda m, i, o: None), "submodule lin has hooks"),
    (lambda l: setattr(l, "lin", _ScaledLinear(8, 4, bias=False)), "submodule lin is a _ScaledLinear"),
    (lambda l: setattr(l, "aggr_module", __import__("torch_geometric").nn.aggr.MaxAggregation()),
     "aggr_module is a MaxAggregation"),
], ids=["sublayer_hook", "sublayer_subclass", "aggr_module"])
def test_changed_parts_keep_the_layer_pyg(change, why):
    """What a PyG layer does through its parts: a hook on its linear, a user's linear with the
    same keys, an aggregation module swapped after construction. gnnio's layer has its own."""
    layer = pyg_nn.GCNConv(8, 4)
    change(layer)
    with pytest.warns(UserWarning, match=why):
        assert gnnio.nn.from_pyg(layer) is layer


def test_gcn_sum_is_add():
    torch.manual_seed(0)
    pyg = pyg_nn.GCNConv(8, 4, aggr="sum")
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    assert type(ours) is gnnio.nn.GCNConv
    ei, t = _inputs((8, 4), {})
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), t)


def test_strict_failure_leaves_the_model_as_it_was():
    model = torch.nn.Sequential(pyg_nn.GCNConv(8, 8), pyg_nn.SAGEConv(8, 8, aggr="lstm"))
    first = model[0]
    with pytest.raises(NotImplementedError, match="1: .*lstm"):
        gnnio.nn.from_pyg(model, strict=True)
    assert model[0] is first
