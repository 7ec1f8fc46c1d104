"""Regression tests for defects found in review (each failed before its fix)."""
import pytest
import torch

import gnnio
from graphs import random_graph
from layer_pairs import make_pair


def test_width_one_column_slice_keeps_its_row_stride(device):
    ei = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]])
    g = gnnio.Graph(ei.to(device), num_nodes=4)
    x = torch.arange(16.0, device=device).view(4, 4)[:, 1:2]  # strides (4, 1)
    assert gnnio.ops.spmm(g, x).view(-1).tolist() == [5 + 9 + 13, 1, 0, 0]
    assert gnnio.ops.segment_reduce(g, x, "max").view(-1).tolist() == [13, 1, 0, 0]


def test_layers_inside_and_after_inference_mode():
    ei, n = random_graph(30, 120)
    layer = gnnio.nn.GCNConv(4, 3)
    x = torch.randn(n, 4)
    with torch.inference_mode():
        ei_inf = ei.clone()
        out_inf = layer(x, ei_inf)
    out = layer(x, ei_inf)  # caches filled in inference mode must serve training
    out.sum().backward()
    assert torch.equal(out_inf, out.detach()) and layer.lin.weight.grad is not None


def test_ids_beyond_int32_are_rejected_before_narrowing():
    with pytest.raises(IndexError, match="source"):
        gnnio.Graph(torch.tensor([[2**32 + 1, 2], [0, 1]]), num_nodes=4)


def test_double_backward_of_max_raises_instead_of_going_silent():
    ei, n = random_graph(10, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(gnnio.ops.segment_reduce(g, x, "max").sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gx.sum(), x)


def test_raw_segment_reduce_backward_rejects_non_contiguous_t2c():
    ei, n = random_graph(4, 4)
    g = gnnio.Graph(ei, num_nodes=n)
    t = g.csr_by_src
    arg = torch.zeros(n, 2, dtype=t.col.dtype)
    with pytest.raises(ValueError, match="t2c"):
        torch.ops.gnnio.segment_reduce_backward(t.rowptr, t.col, t.col[:1].expand(4), arg,
                                                torch.randn(n, 2), n)


# --- Session of 2026-12-05 (sixth): two reviewers' findings, each test failing before its fix.

@pytest.mark.parametrize("opts", [{}, {"improved": True}, {"add_self_loops": False}])
@pytest.mark.parametrize("first,later", [("w1", None), (None, "w1"), ("w1", "w2")])
def test_gcn_cached_keeps_the_first_calls_edge_weight(opts, first, later):
    # PyG's cached=True keeps gcn_norm's edge_index and edge_weight of the first call; later
    # calls' edge_weight is ignored (gnnio renormalised each call's weight).
    x, ei = torch.randn(8, 5), torch.randint(0, 8, (2, 20))
    weights = {None: None, "w1": torch.rand(20), "w2": torch.rand(20)}
    pyg, ours = make_pair("GCNConv", 5, 3, cached=True, **opts)
    torch.testing.assert_close(ours(x, ei, weights[first]), pyg(x, ei, weights[first]))
    for _ in range(2):
        torch.testing.assert_close(ours(x, ei, weights[later]), pyg(x, ei, weights[later]))


def test_gcn_cached_without_normalize_caches_nothing():
    # PyG caches only what gcn_norm returns, so nothing when normalize=False: a second graph and
    # a second edge_weight are used as given.
    x = torch.randn(8, 5)
    ei1, ei2 = torch.randint(0, 8, (2, 20)), torch.randint(0, 8, (2, 15))
    w1, w2 = torch.rand(20), torch.rand(15)
    pyg, ours = make_pair("GCNConv", 5, 3, cached=True, normalize=False, add_self_loops=False)
    torch.testing.assert_close(ours(x, ei1, w1), pyg(x, ei1, w1))
    torch.testing.assert_close(ours(x, ei2), pyg(x, ei2))
    torch.testing.assert_close(ours(x, ei2, w2), pyg(x, ei2, w2))


INFERENCE_LAYERS = ["GCNConv", "GraphConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv"]


@pytest.mark.parametrize("name", INFERENCE_LAYERS)
def test_in_place_change_of_an_inference_edge_index_is_seen(name):
    # Inference tensors have no version counter but can be written inside inference mode: the
    # layers' Graph cache must not serve the old edges.
    pyg, ours = make_pair(name, 4, 3)
    x = torch.randn(6, 4)
    with torch.inference_mode():
        ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        torch.testing.assert_close(ours(x, ei), pyg(x, ei))
        ei[1, 0] = 5
        torch.testing.assert_close(ours(x, ei), pyg(x, ei))


@pytest.mark.parametrize("name", INFERENCE_LAYERS)
def test_sparse_adjacency_made_in_inference_mode(name):
    # adjacency_key read adj._version, which inference tensors do not have (RuntimeError).
    pyg, ours = make_pair(name, 4, 3)
    x, ei = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    with torch.inference_mode():
        adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(4), (6, 6)).coalesce()
        torch.testing.assert_close(ours(x, adj_t), pyg(x, adj_t))


def test_graph_does_not_alias_an_int32_edge_index():
    # .to(int32) of an int32 edge_index is the same memory: a later in-place write by the caller
    # reached the lazily built formats (csr_by_src: the backward) but not csr_by_dst.
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]], dtype=torch.int32)
    g = gnnio.Graph(ei, num_nodes=3)
    before = ei.clone()
    ei[0].fill_(2)
    assert torch.equal(g.edge_index, before)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    gnnio.ops.spmm(g, x).sum().backward()
    xr = x.detach().clone().requires_grad_()
    torch.zeros(3, 4, dtype=torch.float64).index_add(0, before[1].long(),
                                                     xr[before[0].long()]).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("aggr", ["add", "sum"])
def test_plan_takes_a_sageconv_sum_instance(aggr):
    g = gnnio.Graph(torch.randint(0, 50, (2, 400)), num_nodes=50)
    assert g.plan(gnnio.nn.SAGEConv(8, 8, aggr=aggr)).family == "spmm"


@pytest.mark.parametrize("name", ["GCNConv", "GATConv", "GATv2Conv"])
def test_plan_of_an_instance_without_self_loops(name):
    # The plan's statistics must come from the graph the layer runs on.
    g = gnnio.Graph(torch.randint(0, 50, (2, 400)), num_nodes=50)
    layer = getattr(gnnio.nn, name)(8, 8, add_self_loops=False)
    assert not g.plan(layer).self_loops
    assert g.plan(type(layer)).self_loops


def test_reordered_refuses_a_sparse_adjacency():
    # Reordered hands the module a relabelled Graph, which carries no values: an adj_t's
    # weights were silently dropped.
    n = 20
    ei = torch.randint(0, n, (2, 60))
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.rand(60) + 0.5, (n, n)).coalesce()
    with pytest.raises(NotImplementedError, match="sparse adj_t"):
        gnnio.reorder.Reordered(gnnio.nn.GraphConv(8, 4), "degree")(torch.randn(n, 8), adj)


@pytest.mark.parametrize("name,kwargs", [("GCNConv", {}), ("GATConv", {"heads": 2}),
                                         ("GATv2Conv", {}), ("GraphConv", {}), ("SAGEConv", {}),
                                         ("SAGEConv", {"aggr": "max"}),
                                         ("TransformerConv", {"heads": 2})])
def test_zero_node_graph_backward(name, kwargs):
    # The gradient of an empty output's sum is a stride-0 view (refused by the stride checks),
    # and reshape({0, -1}) of the fused bias gradient is ambiguous.
    pyg, ours = make_pair(name, 4, 2, **kwargs)
    ei = torch.empty(2, 0, dtype=torch.long)
    x, xp = torch.randn(0, 4, requires_grad=True), torch.randn(0, 4, requires_grad=True)
    out = ours(x, ei)
    assert out.shape == pyg(xp, ei).shape
    out.sum().backward()
    assert x.grad.shape == x.shape
    for param in ours.parameters():
        assert param.grad is None or not param.grad.any()


def test_gcn_output_dtype_follows_a_wider_edge_weight():
    # PyG's message edge_weight * x_j promotes: float32 x with float64 weights gives float64.
    x, ei, w = torch.randn(8, 5), torch.randint(0, 8, (2, 20)), torch.rand(20, dtype=torch.float64)
    pyg, ours = make_pair("GCNConv", 5, 3)
    out, ref = ours(x, ei, w), pyg(x, ei, w)
    assert out.dtype == ref.dtype == torch.float64
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("in_channels", [-1, (-1, -1), (7, -1)])
@pytest.mark.parametrize("bipartite", [False, True])
def test_lazy_transformer_without_root_weight_leaves_lin_skip_lazy(in_channels, bipartite):
    # PyG never calls lin_skip without root_weight, so it stays lazy: gnnio drew its weight
    # (another random stream, and PyG's state_dict no longer loaded).
    import torch_geometric.nn as pyg_nn
    from torch.nn.parameter import is_lazy

    if not bipartite and in_channels == (7, -1):
        pytest.skip("one feature size")
    n_src, n_dst = (12, 9) if bipartite else (12, 12)
    x_src = torch.randn(n_src, 7)
    x = (x_src, torch.randn(n_dst, 7)) if bipartite else x_src
    ei = torch.stack([torch.randint(0, n_src, (40,)), torch.randint(0, n_dst, (40,))])
    torch.manual_seed(0)
    pyg = pyg_nn.TransformerConv(in_channels, 4, heads=2, root_weight=False)
    torch.manual_seed(0)
    ours = gnnio.nn.TransformerConv(in_channels, 4, heads=2, root_weight=False)
    torch.manual_seed(1)
    pyg(x, ei)
    after_p = torch.rand(4)
    torch.manual_seed(1)
    ours(x, ei)
    after_o = torch.rand(4)
    assert is_lazy(ours.lin_skip.weight) and is_lazy(pyg.lin_skip.weight)
    assert torch.equal(after_o, after_p)  # the same draws as PyG's first call
    ours.load_state_dict(pyg.state_dict())
    torch.testing.assert_close(ours(x, ei), pyg(x, ei), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv"])
def test_uncoalesced_coo_with_self_loops_is_coalesced_as_pyg_does(layer):
    # PyG's loop utilities coalesce a COO adj_t: a duplicated entry is one edge, one weight.
    import warnings

    n = 6
    ei = torch.tensor([[0, 1, 2, 3, 0, 4, 2], [1, 2, 3, 4, 1, 5, 2]])  # (0->1) twice, a loop
    x = torch.randn(n, 4, dtype=torch.double)

    def adj_t():  # a fresh one per call: PyG marks its input coalesced in place
        return torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1), dtype=torch.double), (n, n))

    pyg, ours = (m.double() for m in make_pair(layer, 4, 3, heads=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_p, (adj_p, a_p) = pyg(x, adj_t(), return_attention_weights=True)
        out_o, (adj_o, a_o) = ours(x, adj_t(), return_attention_weights=True)
    torch.testing.assert_close(out_o, out_p)
    torch.testing.assert_close(a_o, a_p)
    assert torch.equal(adj_o.coalesce().indices(), adj_p.coalesce().indices())
    adj = adj_t()  # the same unmodified adjacency again: served from the cache, same result
    first = ours(x, adj)
    assert torch.equal(ours(x, adj), first)


@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
@pytest.mark.parametrize("wdtype", [torch.int64, torch.int32, torch.bool])
def test_graph_conv_integer_edge_weight_promotes_as_pyg(aggr, wdtype):
    # PyG's message edge_weight * x_j promotes integer and bool weights to x's dtype; gnnio
    # refused them (TypeError). GCNConv stays a TypeError: PyG's gcn_norm fails on them too.
    gen = torch.Generator().manual_seed(11)
    x, ei = torch.randn(8, 5, generator=gen), torch.randint(0, 8, (2, 20), generator=gen)
    w = torch.randint(0, 3, (20,), generator=gen).to(wdtype)
    pyg, ours = make_pair("GraphConv", 5, 3, aggr=aggr)
    out, ref = ours(x, ei, w), pyg(x, ei, w)
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref)
