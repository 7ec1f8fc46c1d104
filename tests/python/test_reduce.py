"""The reduction family: gnnio.ops.segment_reduce (max / min with arg indices), the max/min
aggregations of SAGEConv / GraphConv, and gnnio.nn.aggr.Max/MinAggregation inside PyG layers."""
import copy

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real


def scatter_reference(ei, num_src, num_dst, x, reduce):
    """torch.scatter_reduce in float64 on the CPU (PyG's own path without torch_scatter)."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    x = x.cpu().double()
    out = torch.zeros(num_dst, x.size(1), dtype=torch.float64)
    return out.scatter_reduce(0, dst[:, None].expand(-1, x.size(1)), x[src], "a" + reduce,
                              include_self=False)


def cases():
    return [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()


def distinct_features(n, width, device="cpu"):
    """Random features with no two values equal. float32 randn repeats values often enough
    (hundreds of thousands of comparisons per test) that ties between different sources would
    appear, and torch splits a tie's gradient where gnnio gives it to the earliest edge."""
    # Never exactly 0 either: torch's scatter_reduce backward counts the (excluded) zero
    # initial value as a tie and halves the gradient of a winning 0.0.
    total = n * width
    values = ((torch.randperm(total, dtype=torch.float64) + 0.25) / max(total, 1) - 0.5) * 4
    return values.float().view(n, width).to(device)


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("width", [1, 3, 33, 130])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_forward_backward_match_scatter_reduce(device, name, ei, n, width, reduce):
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = distinct_features(n, width, device).requires_grad_()
    out = gnnio.ops.segment_reduce(g, x, reduce)
    x64 = x.detach().cpu().double().requires_grad_()
    ref = scatter_reference(ei, n, n, x64, reduce)
    # A selection, not a sum: the winner is an input value, so the match is exact.
    assert torch.equal(out.detach().cpu().double(), ref.detach())
    gout = torch.randn_like(out)
    out.backward(gout)
    ref.backward(gout.cpu().double())
    # Distinct inputs have no ties between different sources, so torch's even split never
    # applies; grad_x[j] sums the gradients of the rows j won, in a different order from
    # torch's scatter: float32 summation of <= out-degree terms.
    out_deg = torch.bincount(ei[0], minlength=n).clamp(min=1)[:, None].double()
    mass = torch.zeros(n, width, dtype=torch.float64).index_add(
        0, ei[0], gout.detach().cpu().double().abs()[ei[1]])
    bound = (out_deg + 2) * torch.finfo(torch.float32).eps * mass
    assert ((x.grad.double().cpu() - x64.grad).abs() <= bound).all()


def test_arg_indices_and_isolated_nodes(device):
    ei = torch.tensor([[0, 1, 2, 3], [4, 4, 4, 5]])  # nodes 0..3 and 6 receive nothing
    x = torch.tensor([[1.0, 9.0], [3.0, -1.0], [2.0, 5.0], [7.0, 7.0], [0.0, 0.0], [0.0, 0.0],
                      [0.0, 0.0]], device=device, requires_grad=True)
    g = gnnio.Graph(ei.to(device), num_nodes=7)
    out, arg = gnnio.ops.segment_reduce(g, x, "max", return_arg=True)
    assert out.tolist() == [[0, 0]] * 4 + [[3.0, 9.0], [7.0, 7.0], [0, 0]]
    perm = g.csr_by_dst.perm.long().cpu()
    winners = [[int(perm[a]) if a >= 0 else -1 for a in row] for row in arg.cpu().tolist()]
    assert winners == [[-1, -1]] * 4 + [[1, 0], [3, 3], [-1, -1]]
    out.sum().backward()
    assert x.grad.tolist() == [[0, 1], [1, 0], [0, 0], [1, 1], [0, 0], [0, 0], [0, 0]]


def test_ties_go_to_the_earliest_edge(device):
    # Sources 3, 1, 2 all send the same value to node 0; edge order, not node id, decides.
    ei = torch.tensor([[3, 1, 2], [0, 0, 0]])
    x = torch.full((4, 2), 5.0, device=device, requires_grad=True)
    g = gnnio.Graph(ei.to(device), num_nodes=4)
    for reduce in ("max", "min"):
        out = gnnio.ops.segment_reduce(g, x, reduce)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert grad[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_nan_is_confined_to_its_rows(device):
    ei = torch.tensor([[0, 1, 2], [3, 3, 4]])
    x = torch.tensor([[float("nan")], [1.0], [2.0], [0.0], [0.0]], device=device)
    out = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), num_nodes=5), x, "max")
    assert torch.isnan(out[3]).all() and out[4].item() == 2.0 and out[:3].eq(0).all()


def test_deterministic_bitwise(device):
    ei, n = hub(50_000)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 37, device=device, requires_grad=True)
    gout = torch.randn(n, 37, device=device)
    runs = []
    for _ in range(2):
        out, arg = gnnio.ops.segment_reduce(g, x, "max", return_arg=True)
        runs.append((out, arg, torch.autograd.grad(out, x, gout)[0]))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_bipartite_both_ways(device):
    for ns, nd in [(13, 40), (40, 13)]:
        ei = torch.stack([torch.randint(ns, (150,)), torch.randint(nd, (150,))])
        x = torch.randn(ns, 6, device=device)
        out = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), size=(ns, nd)), x, "min")
        assert torch.equal(out.double().cpu(), scatter_reference(ei, ns, nd, x, "min"))


@pytest.mark.slow
def test_hub_of_100k_neighbours(device):
    ei, n = hub(100_000)
    x = torch.randn(n, 16, device=device)
    out = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), num_nodes=n), x, "max")
    assert torch.equal(out.double().cpu(), scatter_reference(ei, n, n, x, "max"))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_gradcheck_float64(reduce):
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: gnnio.ops.segment_reduce(g, x, reduce), (x,))


def test_sum_and_mean_route_to_spmm():
    ei, n = random_graph(20, 90)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 4)
    assert torch.equal(gnnio.ops.segment_reduce(g, x, "mean"), gnnio.ops.spmm(g, x, reduce="mean"))
    with pytest.raises(ValueError, match="reduce"):
        gnnio.ops.segment_reduce(g, x, "median")


def test_opcheck():
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    x = torch.randn(n, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.gnnio.segment_reduce.default,
                          (f.rowptr, f.col, x, n, n, "max", t.rowptr, t.col, g.src_slot_to_dst_slot,
                           None, None, 2**62))


# ---------------------------------------------------------------------------------------------
# Layers against PyG: the same weights, fresh inputs, outputs and every gradient.

def _pyg_pair(cls, f_in, f_out, device, **kwargs):
    import torch_geometric.nn as pyg_nn

    pyg = getattr(pyg_nn, cls)(f_in, f_out, **kwargs).to(device)
    ours = getattr(gnnio.nn, cls)(f_in, f_out, **kwargs).to(device)
    ours.load_state_dict(pyg.state_dict())
    return pyg, ours


def _check_layer(pyg, ours, run):
    exact = copy.deepcopy(pyg).double()
    out_pyg, out_ours, out_exact = run(pyg, torch.float32), run(ours, torch.float32), run(exact, torch.float64)
    gout = torch.randn_like(out_pyg[0])
    grads = [torch.autograd.grad(o[0], [o[1]] + list(m.parameters()), gout.to(o[0].dtype))
             for o, m in ((out_pyg, pyg), (out_ours, ours), (out_exact, exact))]
    assert_no_worse_than_reference(out_ours[0], out_pyg[0], out_exact[0])
    for g_ours, g_pyg, g_exact in zip(grads[1], grads[0], grads[2]):
        assert_no_worse_than_reference(g_ours, g_pyg, g_exact)


@pytest.mark.parametrize("cls,kwargs", [
    ("SAGEConv", {"aggr": "max"}), ("SAGEConv", {"aggr": "min"}),
    ("SAGEConv", {"aggr": "max", "project": True, "normalize": True}),
    ("GraphConv", {"aggr": "max"}), ("GraphConv", {"aggr": "min"}),
])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_layers_match_pyg(device, cls, kwargs, name, ei, n):
    pyg, ours = _pyg_pair(cls, 9, 5, device, **kwargs)
    ei = ei.to(device)
    x = distinct_features(n, 9, device)

    def run(layer, dtype):
        xi = x.to(dtype).requires_grad_()
        return layer(xi, ei), xi

    _check_layer(pyg, ours, run)


@pytest.mark.parametrize("cls", ["SAGEConv", "GraphConv"])
def test_pyg_layers_accept_gnnio_aggregations(device, cls):
    import torch_geometric.nn as pyg_nn

    ei, n = random_graph(60, 400)
    ei = ei.to(device)
    x = distinct_features(n, 8, device)
    for name, ours in (("max", gnnio.nn.aggr.MaxAggregation()), ("min", gnnio.nn.aggr.MinAggregation())):
        ref = getattr(pyg_nn, cls)(8, 4, aggr=name).to(device)
        layer = getattr(pyg_nn, cls)(8, 4, aggr=ours).to(device)
        layer.load_state_dict(ref.state_dict())
        # The same selection feeds the same float32 linear maps: the outputs are identical.
        assert torch.equal(ref(x, ei), layer(x, ei))

        def run(module, dtype):
            xi = x.to(dtype).requires_grad_()
            return module(xi, ei), xi

        _check_layer(ref, layer, run)
        graph = layer.aggr_module._graph
        layer(x, ei)  # the same edge_index again: the cached CSR is reused
        assert layer.aggr_module._graph is graph


def test_planner_splits_hubs_and_explains():
    ei, n = hub(100_000)
    g = gnnio.Graph(ei, num_nodes=n)
    plan = gnnio.plan.plan_reduce(g, torch.float32)
    assert plan.heavy_rows.tolist() == [0] and "degree-aware" in plan.reason
    items = plan.heavy_items
    assert items[:, 1].tolist() == list(range(0, 100_000, plan.edge_chunk))  # row 0 starts at slot 0
    assert items[-1, 2].item() == g.in_degree()[0].item()
    assert "node-parallel" in gnnio.plan.plan_reduce(g, torch.float32, degree_aware=False).reason
    assert "node-parallel" in gnnio.plan.plan_reduce(gnnio.Graph(*random_graph(50, 200)[:1], num_nodes=50),
                                                     torch.float32).reason


def test_planner_splits_source_hubs_for_the_backward():
    ei, n = hub(100_000)
    g = gnnio.Graph(ei.flip(0), num_nodes=n)  # node 0 is now a source with 10^5 out-edges
    plan = gnnio.plan.plan_reduce(g, torch.float32, backward=True)
    assert plan.heavy_rows is None and plan.heavy_src.tolist() == [0]
    assert "backward: 1 sources" in plan.reason
    items = plan.heavy_src_items
    assert items[0, 1].item() == 0 and items[-1, 2].item() == g.out_degree()[0].item()
    assert (items[1:, 1] == items[:-1, 2]).all()  # tiles cover the row without gaps


@pytest.mark.cuda
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("hub_side", ["dst", "src"])
@pytest.mark.parametrize("degree_aware", [True, False])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_matches_cpu_bitwise(reduce, dtype, degree_aware, hub_side, weighted):
    # A 10^6-neighbour hub (heavy tiles merged by packed atomics; as a source, backward tiles
    # summed in item order) plus light rows; few distinct values so that ties are everywhere:
    # the lowest slot must win on both devices. Integer inputs (and weights, for the messages
    # w x and the weights' gradient) make every product and every sum order exact.
    ei, n = hub(1_000_000)
    if hub_side == "src":
        ei = ei.flip(0)
    x = torch.randint(-4, 5, (n, 33)).to(dtype)
    w = torch.tensor([-2.0, -1.0, 1.0, 2.0])[torch.randint(4, (ei.size(1),))].to(dtype) if weighted else None

    def run(graph, xs, ws, **kwargs):
        out, arg = gnnio.ops.segment_reduce(graph, xs, reduce, return_arg=True, edge_weight=ws, **kwargs)
        return out, arg, torch.autograd.grad(out.float().sum(), [xs] + ([ws] if weighted else []))
    leaves = lambda t, dev: None if t is None else t.to(dev).requires_grad_()  # noqa: E731
    out_cpu, arg_cpu, grads_cpu = run(gnnio.Graph(ei, num_nodes=n), leaves(x.float(), "cpu"),
                                      leaves(None if w is None else w.float(), "cpu"))
    out, arg, grads = run(gnnio.Graph(ei.cuda(), num_nodes=n), leaves(x, "cuda"), leaves(w, "cuda"),
                          degree_aware=degree_aware)
    assert torch.equal(out.float().cpu(), out_cpu) and torch.equal(arg.cpu(), arg_cpu)
    # The CPU sums in float32 (exact: integers below 2^24); CUDA sums in float32 too and rounds
    # once to the dtype, which a source hub's ~10^5 needs.
    for ours, cpu in zip(grads, grads_cpu):
        assert torch.equal(ours.float().cpu(), cpu.to(dtype).float())
