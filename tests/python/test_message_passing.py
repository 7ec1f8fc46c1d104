"""gnnio's layers as PyG ``MessagePassing`` modules (gnnio/nn/_base.py): PyG's tools that find
graph layers by that type (to_hetero, to_hetero_with_bases, the explainers, get_num_hops), each
against the same tool on PyG's layers with the same weights. Outputs and gradients follow
layer_pairs.check_against_pyg's rule (float64 PyG as the reference); the explainers' masks
are compared exactly, since an explained gnnio layer runs PyG's own class on its parameters."""
import copy
import gc
import subprocess
import weakref
import sys
import textwrap

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import AttentionExplainer, GNNExplainer, GraphMaskExplainer
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.nn import MessagePassing, to_hetero, to_hetero_with_bases

import gnnio
import gnnio.nn
from gnnio.nn import _base
from conftest import assert_no_worse_than_reference
from graphs import hetero_papers
from layer_pairs import check_against_pyg, make_pair

# (layer, args, kwargs) of homogeneous layers; the attention layers add self loops by default.
LAYERS = [
    ("GCNConv", (8, 6), {}),
    ("GraphConv", (8, 6), {"aggr": "max"}),
    ("SAGEConv", (8, 6), {}),
    ("GATConv", (8, 3), {"heads": 2}),
    ("GATv2Conv", (8, 3), {"heads": 2}),
    ("TransformerConv", (8, 3), {"heads": 2}),
]
# The same on bipartite (source type, destination type) pairs, with lazy sizes: to_hetero.
HETERO_LAYERS = [
    ("GraphConv", ((-1, -1), 6), {}),
    ("SAGEConv", ((-1, -1), 6), {"aggr": "max"}),
    # (negative_slope=1: two layers' scores over three edge types put some score near LeakyReLU's
    # kink in most draws; the kink is tested in test_attention.py, the rewrite here)
    ("GATConv", ((-1, -1), 3), {"heads": 2, "add_self_loops": False, "negative_slope": 1.0}),
    ("GATv2Conv", ((-1, -1), 3), {"heads": 2, "add_self_loops": False, "negative_slope": 1.0}),
    ("TransformerConv", ((-1, -1), 3), {"heads": 2}),
]
IDS = [name for name, _, _ in LAYERS]


def _graph(n=12, e=40, loops=3):
    """A random graph with a few self loops of its own (the attention layers drop them and add
    their own, so the explainers' loop mask matters)."""
    ei = torch.randint(0, n, (2, e))
    ei[1, :loops] = ei[0, :loops]
    return ei


class _TwoLayers(torch.nn.Module):
    def __init__(self, lib, name, args, kwargs):
        super().__init__()
        self.conv1 = getattr(lib, name)(*args, **kwargs)
        out = self.conv1.out_channels * (kwargs.get("heads", 1) if kwargs.get("concat", True) else 1)
        first = args[0] if isinstance(args[0], int) else -1
        self.conv2 = getattr(lib, name)(out if first > 0 else (-1, -1), *args[1:], **kwargs)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _same_weights(pyg, ours, *inputs):
    """Runs both once (lazy sizes), then loads PyG's weights into gnnio's, keys checked."""
    with torch.no_grad():
        pyg(*inputs)
        ours(*inputs)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    ours.load_state_dict(pyg.state_dict())


@pytest.mark.parametrize("name, args, kwargs", LAYERS, ids=IDS)
def test_layers_are_message_passing_modules(name, args, kwargs):
    pyg, ours = make_pair(name, *args, **kwargs)
    assert isinstance(ours, MessagePassing)
    assert (ours.aggr, ours.flow, ours.node_dim) == (pyg.aggr, pyg.flow, pyg.node_dim)
    assert repr(ours) == repr(pyg)
    from torch_geometric.utils._subgraph import get_num_hops
    assert get_num_hops(_TwoLayers(gnnio.nn, name, args, kwargs)) == 2


def _hetero_call(edge_index_dict):
    def call(model, t):
        out = model({"paper": t["paper"], "author": t["author"]}, edge_index_dict)
        return torch.cat([out["paper"], out["author"]])
    return call


@pytest.mark.parametrize("name, args, kwargs", HETERO_LAYERS, ids=[n for n, _, _ in HETERO_LAYERS])
def test_to_hetero_of_gnnio_layers_matches_pyg(name, args, kwargs):
    """to_hetero rewrites each MessagePassing call into one per edge type and sums them per
    destination type; gnnio's layers, as such modules, get edge_index per edge type."""
    data = hetero_papers()
    pyg = to_hetero(_TwoLayers(pyg_nn, name, args, kwargs), data.metadata(), aggr="sum")
    ours = to_hetero(_TwoLayers(gnnio.nn, name, args, kwargs), data.metadata(), aggr="sum")
    _same_weights(pyg, ours, data.x_dict, data.edge_index_dict)
    check_against_pyg(pyg, ours, _hetero_call(data.edge_index_dict), dict(data.x_dict))


def test_to_hetero_with_bases_of_gnnio_layers_matches_pyg():
    """to_hetero_with_bases weights each edge type's messages by a message hook: the layer
    holding one runs as PyG's class, which calls it."""
    data = hetero_papers()
    models = []
    for lib in (pyg_nn, gnnio.nn):
        torch.manual_seed(0)
        models.append(to_hetero_with_bases(_TwoLayers(lib, "GraphConv", (16, 16), {}),
                                           data.metadata(), num_bases=3, in_channels={"x": 16}))
    pyg, ours = models
    _same_weights(pyg, ours, data.x_dict, data.edge_index_dict)
    check_against_pyg(pyg, ours, _hetero_call(data.edge_index_dict), dict(data.x_dict))


@pytest.mark.parametrize("apply_sigmoid", [True, False])
@pytest.mark.parametrize("name, args, kwargs", LAYERS, ids=IDS)
def test_edge_mask_scales_messages_as_pyg(name, args, kwargs, apply_sigmoid):
    """The explainers' mask (set_masks): it scales each edge's message, the layers' own self
    loops take 1; the mask's gradient is what an explainer learns from."""
    pyg, ours = make_pair(name, *args, **kwargs)
    ei = _graph()

    def call(layer, t):
        set_masks(layer, t["mask"], ei, apply_sigmoid=apply_sigmoid)
        try:
            return layer(t["x"], ei)
        finally:
            clear_masks(layer)

    check_against_pyg(pyg, ours, call, {"x": torch.randn(12, 8), "mask": torch.randn(ei.size(1))})
    # Unmasked again, the layer takes its own path: PyG's class is not called.
    x = torch.randn(12, 8)
    before = ours(x, ei)
    try:
        _base._call_as_pyg, saved = None, _base._call_as_pyg
        torch.testing.assert_close(ours(x, ei), before, rtol=0, atol=0)
    finally:
        _base._call_as_pyg = saved


def _explainer(model, algorithm, edge_mask_type="object", node_mask_type="attributes"):
    return Explainer(model, algorithm, explanation_type="model", node_mask_type=node_mask_type,
                     edge_mask_type=edge_mask_type,
                     model_config=dict(mode="multiclass_classification", task_level="node",
                                       return_type="raw"))


@pytest.mark.parametrize("name, args, kwargs", LAYERS, ids=IDS)
def test_gnn_explainer_explains_gnnio_model_as_pyg(name, args, kwargs):
    ei, x = _graph(), torch.randn(12, 8)
    pyg, ours = _TwoLayers(pyg_nn, name, args, kwargs), _TwoLayers(gnnio.nn, name, args, kwargs)
    _same_weights(pyg, ours, x, ei)
    explanations = []
    for model in (pyg, ours):
        torch.manual_seed(1)  # the masks' initial draw
        explanations.append(_explainer(model, GNNExplainer(epochs=5))(x, ei, index=int(ei[1, -1])))
    for key in ("edge_mask", "node_mask"):
        assert torch.equal(explanations[1][key], explanations[0][key]), key
    assert ours.conv1._edge_mask is None and ours.conv1.explain is None  # cleared after


def test_graph_mask_explainer_explains_gnnio_model_as_pyg():
    """GraphMaskExplainer sets its own explain_message on each layer and reads the messages it
    leaves there (latest_messages)."""
    ei, x = _graph(), torch.randn(12, 8)
    pyg, ours = (_TwoLayers(lib, "GATConv", (8, 3), {"heads": 2}) for lib in (pyg_nn, gnnio.nn))
    _same_weights(pyg, ours, x, ei)
    explanations = []
    for model in (pyg, ours):
        torch.manual_seed(2)
        explanations.append(_explainer(model, GraphMaskExplainer(2, epochs=3), None)(
            x, ei, index=int(ei[1, -1])))
    assert torch.equal(explanations[1].node_mask, explanations[0].node_mask)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_explainer_reads_gnnio_attention(name):
    """AttentionExplainer collects alpha by message hooks."""
    ei, x = _graph(), torch.randn(12, 8)
    pyg, ours = (_TwoLayers(lib, name, (8, 3), {"heads": 2}) for lib in (pyg_nn, gnnio.nn))
    _same_weights(pyg, ours, x, ei)
    index = int(ei[1, -1])  # a destination of an edge, so its mask is not all 0
    masks = [_explainer(m, AttentionExplainer(), "object", None)(x, ei, index=index).edge_mask
             for m in (pyg, ours)]
    assert masks[0].abs().sum() > 0
    assert torch.equal(masks[1], masks[0])


def test_message_hooks_see_gnnio_layers_messages():
    pyg, ours = make_pair("GATConv", 8, 3, heads=2)
    ei, x = _graph(), torch.randn(12, 8)
    seen = {}
    for key, layer in (("pyg", pyg), ("ours", ours)):
        handle = layer.register_message_forward_hook(
            lambda module, inputs, out, key=key: seen.__setitem__(key, (inputs[0]["alpha"], out)))
        out = layer(x, ei)
        handle.remove()
        seen[key + "_out"] = out
    for a, b in zip(seen["ours"], seen["pyg"]):
        assert torch.equal(a, b)
    assert torch.equal(seen["ours_out"], seen["pyg_out"])
    assert not ours._message_forward_hooks  # removed: the layer is back on its own path


def test_explained_layer_refuses_a_graph():
    ours = gnnio.nn.GCNConv(8, 6)
    ei = _graph()
    set_masks(ours, torch.randn(ei.size(1)), ei)
    with pytest.raises(NotImplementedError, match="gnnio.Graph"):
        ours(torch.randn(12, 8), gnnio.Graph(ei, num_nodes=12))


def test_layers_work_without_pyg():
    """PyG is optional: without it the layers are plain Modules with PyG's attributes."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch_geometric"] = None  # import torch_geometric now raises ImportError
        import torch_geometric
    """)
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0
    code = textwrap.dedent("""
        import sys
        sys.modules["torch_geometric"] = None
        import torch, gnnio.nn
        ei = torch.randint(0, 12, (2, 40))
        for layer in [gnnio.nn.GCNConv(8, 6), gnnio.nn.SAGEConv(8, 6, aggr="max"),
                      gnnio.nn.GATConv(8, 3, heads=2), gnnio.nn.TransformerConv(8, 3, heads=2)]:
            assert type(layer).__mro__[2] is torch.nn.Module, type(layer).__mro__
            assert layer.flow == "source_to_target"
            layer(torch.randn(12, 8), ei).sum().backward()
            print(type(layer).__name__, layer.aggr, layer.node_dim)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:4] == ["GCNConv add -2", "SAGEConv max -2", "GATConv add 0",
                                          "TransformerConv add 0"]


def test_get_embeddings_and_module_hooks_see_gnnio_layers():
    """get_embeddings hooks each MessagePassing module's forward; module hooks run whether the
    layer takes its own kernels or, explained, PyG's class."""
    from torch_geometric.utils import get_embeddings
    ei, x = _graph(), torch.randn(12, 8)
    pyg, ours = (_TwoLayers(lib, "SAGEConv", (8, 6), {}) for lib in (pyg_nn, gnnio.nn))
    _same_weights(pyg, ours, x, ei)
    theirs, mine = get_embeddings(pyg, x, ei), get_embeddings(ours, x, ei)
    exact = get_embeddings(copy.deepcopy(pyg).double(), x.double(), ei)
    assert len(mine) == len(theirs) == len(exact) == 2
    for a, b, e in zip(mine, theirs, exact):
        assert_no_worse_than_reference(a, b, e)
    calls = []
    handle = ours.conv1.register_forward_hook(lambda module, inputs, out: calls.append(out.shape))
    set_masks(ours, torch.randn(ei.size(1)), ei)
    ours(x, ei)
    clear_masks(ours)
    ours(x, ei)
    handle.remove()
    assert calls == [torch.Size([12, 6])] * 2


def test_explained_subclass_of_a_gnnio_layer_runs_as_its_pyg_class():
    class Scaled(gnnio.nn.GCNConv):
        def forward(self, x, edge_index):
            return 2 * super().forward(x, edge_index)

    ours, pyg = Scaled(8, 6), pyg_nn.GCNConv(8, 6)
    pyg.load_state_dict(ours.state_dict())
    ei, x, mask = _graph(), torch.randn(12, 8), torch.randn(40)
    for layer in (ours, pyg):
        set_masks(layer, mask, ei)
    # The subclass's forward runs, and its super().forward explains as PyG's GCNConv does.
    torch.testing.assert_close(ours(x, ei), 2 * pyg(x, ei), rtol=0, atol=0)


def test_graph_mask_explainer_leaves_no_layer_alive():
    """GraphMaskExplainer's explain_message is bound to the layer; the twin calls it through a
    weak reference, so the layer and its parameters are freed with the model."""
    ei, x = _graph(), torch.randn(12, 8)
    model = _TwoLayers(gnnio.nn, "GATConv", (8, 3), {"heads": 2})
    layer = weakref.ref(model.conv1)
    _explainer(model, GraphMaskExplainer(2, epochs=2), None)(x, ei, index=int(ei[1, -1]))
    del model
    gc.collect()
    assert layer() is None


def test_settings_changed_after_an_explained_call_reach_it():
    ei, x, mask = _graph(), torch.randn(12, 8), torch.randn(40)
    pyg, ours = make_pair("GATConv", 8, 3, heads=2)
    for layer in (pyg, ours):
        set_masks(layer, mask, ei)
        layer(x, ei)
        layer.add_self_loops, layer.negative_slope = False, 0.5
    torch.testing.assert_close(ours(x, ei), pyg(x, ei), rtol=0, atol=0)


def test_explained_cached_gcn_follows_the_edge_index():
    """gnnio's GCNConv(cached=True) caches per edge_index object; explained, it recomputes for
    each call (PyG's would keep the first graph's normalisation)."""
    ei, ei2, x, mask = _graph(), _graph(), torch.randn(12, 8), torch.randn(40)
    ours = gnnio.nn.GCNConv(8, 6, cached=True)
    uncached = pyg_nn.GCNConv(8, 6)
    uncached.load_state_dict(ours.state_dict())
    for edges in (ei, ei2):
        for layer in (ours, uncached):
            set_masks(layer, mask, edges)  # (its loop mask is the graph's)
        torch.testing.assert_close(ours(x, edges), uncached(x, edges), rtol=0, atol=0)


def test_propagate_hook_keeps_the_weighted_adjacency():
    """With a hook the layer runs PyG's class, fused where PyG's is (a sparse adj_t whose values
    weight the messages); to_hetero_with_bases clears ``fuse`` to see every message."""
    ei, x = _graph(), torch.randn(12, 8)
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.rand(40), (12, 12)).coalesce().to_sparse_csr()
    ours = gnnio.nn.SAGEConv(8, 6)
    plain = ours(x, adj)
    calls = []
    handle = ours.register_propagate_forward_pre_hook(lambda module, inputs: calls.append(1))
    hooked = ours(x, adj)
    handle.remove()
    assert calls == [1]
    assert_no_worse_than_reference(hooked, plain, _sage64(ours, x, adj))  # PyG's spmm vs gnnio's


def _sage64(layer, x, adj):
    exact = copy.deepcopy(layer).double()
    adj64 = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), adj.values().double(),
                                    adj.shape)
    return exact(x.double(), adj64)


def test_explained_call_leaves_submodule_modes_alone():
    ei, x = _graph(), torch.randn(12, 8)
    ours = gnnio.nn.GATConv(8, 3, heads=2)
    ours.lin.eval()
    set_masks(ours, torch.randn(40), ei)
    ours(x, ei)
    assert ours.training and not ours.lin.training


def test_a_layer_pickled_before_it_was_message_passing_loads():
    """A whole model pickled by a gnnio whose layers were plain Modules lacks MessagePassing's
    state (its inspector, aggr_module, ...): loading fills it in from a fresh base."""
    ei, x = _graph(), torch.randn(12, 8)
    layer = gnnio.nn.SAGEConv(8, 6, aggr="max")
    fresh = torch.nn.Module()
    state = {k: v for k, v in layer.__dict__.items() if k in fresh.__dict__ or not k.startswith("_")
             or k in ("_graphs",)}
    state = {k: v for k, v in state.items() if k not in ("inspector", "fuse")}
    state["_modules"] = {k: m for k, m in layer._modules.items() if k != "aggr_module"}
    old = type(layer).__new__(type(layer))
    old.__setstate__(state)
    torch.testing.assert_close(old(x, ei), layer(x, ei), rtol=0, atol=0)
    set_masks(old, torch.randn(40), ei)
    old(x, ei)  # explainable too
