"""gnnio.nn.GINConv against torch_geometric.nn.GINConv (PyG 2.8) on the same weights and fresh
random inputs: outputs and every gradient (x, nn's parameters, a trainable eps, an adjacency's
values) by layer_pairs' rule (at most 2x PyG's own float32 error against float64), on real and
adversarial graphs, bipartite inputs, sparse adjacencies, batched features; gradcheck in float64;
and what the layer shares with PyG: state_dict keys, repr, reset_parameters, explainers' hooks,
from_pyg."""
import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

import gnnio
import gnnio.nn
from graphs import adversarial, hub, random_graph, real
from layer_pairs import check_against_pyg


def _mlp(f_in, f_out=5):
    return torch.nn.Sequential(torch.nn.Linear(f_in, 16), torch.nn.ReLU(), torch.nn.Linear(16, f_out))


def _pair(f_in=8, device="cpu", **kwargs):
    """PyG's and gnnio's GINConv with equal, informative weights (eps too) and their own nn
    copies (a shared module would add both libraries' gradients into one .grad)."""
    pyg = pyg_nn.GINConv(_mlp(f_in), **kwargs)
    ours = gnnio.nn.GINConv(_mlp(f_in), **kwargs)
    assert list(ours.state_dict()) == list(pyg.state_dict())
    with torch.no_grad():
        for p in pyg.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        pyg.eps.add_(0.25)  # (a buffer when not trained)
    ours.load_state_dict(pyg.state_dict())
    return pyg.to(device), ours.to(device)


def _graphs():
    cora, n = real("cora")
    return [("cora", cora, n), ("as20000102",) + real("as20000102")] + adversarial()


GRAPHS = _graphs()


@pytest.mark.parametrize("train_eps", [False, True], ids=["eps_buffer", "train_eps"])
@pytest.mark.parametrize("graph_id, ei, n", GRAPHS, ids=[g[0] for g in GRAPHS])
def test_matches_pyg(device, graph_id, ei, n, train_eps):
    pyg, ours = _pair(8, device, eps=0.1, train_eps=train_eps)
    ei = ei.to(device)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": torch.randn(n, 8, device=device)})


@pytest.mark.parametrize("root", [True, False], ids=["x_dst", "no_x_dst"])
def test_bipartite_and_size(device, root):
    """(x_src, x_dst) of different node counts, and (x_src, None) with size: no root term."""
    ei = torch.stack([torch.randint(0, 40, (150,)), torch.randint(0, 25, (150,))]).to(device)
    pyg, ours = _pair(8, device, train_eps=True)
    t = {"x_src": torch.randn(40, 8, device=device), "x_dst": torch.randn(25, 8, device=device)}

    def call(m, t):
        return m((t["x_src"], t["x_dst"] if root else None), ei, size=(40, 25))
    out = check_against_pyg(pyg, ours, call, t)
    assert out.shape == (25, 5)


@pytest.mark.parametrize("layout", ["csr", "coo"])
def test_sparse_adjacency_values_weight_the_sum(device, layout):
    """A torch.sparse adj_t [N_dst, N_src]: PyG's spmm multiplies by its values (GINConv drops
    them only for a torch_sparse SparseTensor); their gradient too."""
    ei, n = random_graph(50, 300)
    build = to_torch_csr_tensor if layout == "csr" else to_torch_coo_tensor
    pyg, ours = _pair(8, device)
    t = {"x": torch.randn(n, 8, device=device), "w": torch.rand(ei.size(1), device=device)}

    def call(m, t):
        return m(t["x"], build(ei.flip(0).to(device), t["w"], size=(n, n)))
    check_against_pyg(pyg, ours, call, t)


def test_batched_features(device):
    """x [B, N, F] (node_dim=-2): several feature sets on one graph, as PyG's propagate takes."""
    ei, n = random_graph(30, 120)
    ei = ei.to(device)
    pyg, ours = _pair(8, device, train_eps=True)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": torch.randn(3, n, 8, device=device)})


def test_one_node_with_100k_neighbours(device):
    ei, n = hub(100_000)
    ei = ei.to(device)
    pyg, ours = _pair(8, device)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": torch.randn(n, 8, device=device)})


def test_gradcheck_float64():
    ei, n = random_graph(12, 40)
    layer = gnnio.nn.GINConv(_mlp(4, 3), eps=0.2, train_eps=True).double()
    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    names, params = zip(*[(k, p.detach().clone().requires_grad_()) for k, p in layer.named_parameters()])

    def f(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x, ei))
    assert "eps" in names
    assert torch.autograd.gradcheck(f, (x,) + params)


def test_settings_state_and_reset_as_pyg():
    pyg, ours = _pair(8, eps=0.3, train_eps=True)
    assert repr(ours) == repr(pyg) and ours.initial_eps == 0.3
    assert isinstance(ours.eps, torch.nn.Parameter) and "eps" in dict(ours.named_parameters())
    assert "eps" in dict(gnnio.nn.GINConv(_mlp(8)).named_buffers())
    ours.reset_parameters()
    assert ours.eps.item() == pytest.approx(0.3)  # eps back to its initial value, nn redrawn
    with pytest.raises(NotImplementedError, match="aggr='mean'"):
        gnnio.nn.GINConv(_mlp(8), aggr="mean")
    gnnio.nn.GINConv(_mlp(8), aggr="sum")  # PyG's 'add'


def test_edge_mask_and_message_hook_run_pyg_class():
    """An explained GINConv (edge mask) or one with a message hook runs PyG's class on its own
    nn and eps (gnnio/nn/_base.py's twin): the same result and mask gradient as PyG's layer."""
    ei, n = random_graph(20, 80)
    pyg, ours = _pair(8, train_eps=True)

    def call(layer, t):
        set_masks(layer, t["mask"], ei, apply_sigmoid=True)
        try:
            return layer(t["x"], ei)
        finally:
            clear_masks(layer)
    check_against_pyg(pyg, ours, call, {"x": torch.randn(n, 8), "mask": torch.randn(ei.size(1))})
    seen = []
    ours.register_message_forward_hook(lambda m, i, o: seen.append(o.shape))
    x = torch.randn(n, 8)
    torch.testing.assert_close(ours(x, ei), pyg(x, ei))
    assert seen == [(80, 8)]


def test_from_pyg_keeps_the_nn_module():
    """PyG's GIN model (torch_geometric.nn.models.GIN) converted: the same nn objects (not
    rebuilt or redrawn), eps's kind kept, the PyG model's results."""
    from torch_geometric.nn.models import GIN
    ei, n = random_graph(40, 200)
    torch.manual_seed(0)
    pyg = GIN(8, 16, 3, 4, train_eps=True).eval()
    ours = copy.deepcopy(pyg)
    nets = [c.nn for c in ours.convs]
    gnnio.nn.from_pyg(ours)
    assert all(type(c) is gnnio.nn.GINConv for c in ours.convs)
    assert all(c.nn is net for c, net in zip(ours.convs, nets))
    assert all(isinstance(c.eps, torch.nn.Parameter) for c in ours.convs)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei), {"x": torch.randn(n, 8)})


def test_bad_inputs_raise_before_any_kernel(device):
    """PYG_CONTRACTS' checklist: out-of-range or negative ids (IndexError), a float or
    misshapen edge_index, rows that disagree with size or a Graph (ValueError); the layer works
    afterwards."""
    layer = gnnio.nn.GINConv(_mlp(4)).to(device)
    x = torch.randn(5, 4, device=device)
    for bad in ([[0, 1], [1, 5]], [[0, -1], [1, 2]], [[5, 0], [0, 1]]):
        with pytest.raises(IndexError):
            layer(x, torch.tensor(bad, device=device))
    with pytest.raises(ValueError, match="integer"):
        layer(x, torch.tensor([[0.0, 1.0], [1.0, 2.0]], device=device))
    with pytest.raises(ValueError, match="shape"):
        layer(x, torch.tensor([[0, 1, 2]], device=device))
    with pytest.raises(ValueError, match="x_dst"):
        layer((x, torch.randn(6, 4, device=device)), torch.tensor([[0], [1]], device=device), size=(5, 7))
    with pytest.raises(ValueError):
        layer(torch.randn(6, 4, device=device), gnnio.Graph(torch.tensor([[0], [1]], device=device), num_nodes=5))
    ei = torch.tensor([[0, 1], [1, 2]], device=device)
    assert layer(x, ei).shape == (5, 5)


def test_empty_graph_and_int32_ids(device):
    pyg, ours = _pair(8, device)
    empty = torch.empty(2, 0, dtype=torch.long, device=device)
    out = ours(torch.randn(0, 8, device=device), empty)
    assert out.shape == (0, 5)
    ei, n = random_graph(30, 100)
    ei = ei.to(device)
    check_against_pyg(pyg, ours, lambda m, t: m(t["x"], ei.int() if m is ours else ei),
                      {"x": torch.randn(n, 8, device=device)})


def test_pickled_layer_runs_after():
    import io
    ei, n = random_graph(20, 60)
    x = torch.randn(n, 8)
    layer = gnnio.nn.GINConv(_mlp(8), train_eps=True)
    before = layer(x, ei)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer, weights_only=False)(x, ei), before, rtol=0, atol=0)
