"""Graph reorderings (gnnio.reorder, Graph.reorder): every order is a permutation, the reordered
graph is the same graph under it, orders are deterministic, layers give the same outputs and
gradients with and without reordering, RCM shrinks the bandwidth, bad input is refused."""
import json
import sys

import pytest
import torch

import gnnio
import gnnio.nn
import gnnio.reorder as reorder
from gnnio import cli, datasets
from graphs import adversarial, real

METHODS = list(reorder.METHODS)


def powerlaw_graph():
    return datasets.powerlaw(3000, 30000, seed=0), 3000


GRAPHS = ([("cora",) + real("cora"), ("as20000102",) + real("as20000102"),
           ("powerlaw-3K-30K",) + powerlaw_graph()]
          + [(name, ei, n) for name, ei, n in adversarial()])
GRAPH_IDS = [g[0] for g in GRAPHS]


def edge_multiset(ei):
    """Edges as sorted (src, dst) rows: equal for two edge lists with the same multiset."""
    key = ei[0].long() * (int(ei.max()) + 1 if ei.numel() else 1) + ei[1].long()
    return key.sort().values


# ---------------------------------------------------------------------------------------------
# permutations and the reordered graph

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name,ei,n", GRAPHS, ids=GRAPH_IDS)
def test_order_is_a_permutation_of_the_same_graph(name, ei, n, method):
    graph = gnnio.Graph(ei, num_nodes=n)
    new, perm = graph.reorder(method)
    assert perm.dtype == torch.int64 and perm.shape == (n,)
    assert torch.equal(perm.sort().values, torch.arange(n))
    r = reorder.reordering(graph, method)
    assert r.graph is new and torch.equal(r.perm, perm)
    assert torch.equal(r.inv[perm], torch.arange(n))
    assert new.num_src == new.num_dst == n and new.num_edges == graph.num_edges
    # Edge k of the new graph is edge k of the old one with both ends renamed (order kept, so
    # per-edge inputs line up) ...
    assert torch.equal(new.edge_index.long(), r.inv[ei])
    # ... hence, mapped back through perm, the same multiset of edges.
    assert torch.equal(edge_multiset(perm[new.edge_index.long()]), edge_multiset(ei))
    assert graph.reorder(method)[0] is new  # cached on the Graph


@pytest.mark.parametrize("method", METHODS)
def test_orders_are_deterministic_and_ignore_edge_order(method):
    ei, n = powerlaw_graph()
    a = reorder.permutation(gnnio.Graph(ei, num_nodes=n), method)
    b = reorder.permutation(gnnio.Graph(ei, num_nodes=n), method)  # uncached: computed again
    assert torch.equal(a.perm, b.perm) and torch.equal(a.inv, b.inv)
    shuffled = ei[:, torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(1))]
    c = reorder.permutation(gnnio.Graph(shuffled, num_nodes=n), method)
    assert torch.equal(a.perm, c.perm)


def test_degree_order_is_descending_and_stable():
    ei = torch.tensor([[0, 1, 2, 3, 3, 4], [1, 2, 3, 4, 0, 0]])  # degrees 3, 2, 2, 3, 2; 5 isolated
    perm = reorder.degree(gnnio.Graph(ei, num_nodes=6)).perm
    assert perm.tolist() == [0, 3, 1, 2, 4, 5]


def test_rcm_reduces_the_bandwidth_of_a_shuffled_grid():
    h = w = 30
    shuffle = torch.randperm(h * w, generator=torch.Generator().manual_seed(0))
    ei = shuffle[datasets.grid(h, w)]
    graph = gnnio.Graph(ei, num_nodes=h * w)
    new, _ = graph.reorder("rcm")
    before, after = reorder.bandwidth(graph), reorder.bandwidth(new)
    # A shuffled grid has bandwidth close to N; Cuthill-McKee numbers it front by front (anti-
    # diagonals), so the bandwidth is about one front, at most 2 * width here.
    assert before > h * w // 2
    assert after <= 2 * w, (before, after)


def test_metis_groups_parts_and_takes_a_part_size():
    ei, n = real("cora")
    graph = gnnio.Graph(ei, num_nodes=n)
    one = reorder.metis(graph, part_size=n)  # one part: id order
    assert torch.equal(one.perm, torch.arange(n))
    small = reorder.metis(graph, part_size=64)
    assert torch.equal(small.perm.sort().values, torch.arange(n))
    assert not torch.equal(small.perm, torch.arange(n))
    # Grouping by parts cuts far fewer edges than id order between blocks of the same size.
    new = reorder.relabel(graph, small)
    block = lambda g: (g.edge_index.long() // 64)  # noqa: E731
    crossing = lambda g: (block(g)[0] != block(g)[1]).float().mean().item()  # noqa: E731
    assert crossing(new) < crossing(graph)
    with pytest.raises(ValueError, match="part_size must be a positive int"):
        reorder.metis(graph, part_size=0)


# ---------------------------------------------------------------------------------------------
# layers: same outputs and gradients, in the caller's node order

F = 12
LAYERS = {
    "GCNConv": lambda: gnnio.nn.GCNConv(F, 8),
    "SAGEConv(max)": lambda: gnnio.nn.SAGEConv(F, 8, aggr="max"),
    "GATv2Conv": lambda: gnnio.nn.GATv2Conv(F, 4, heads=2),
    "TransformerConv": lambda: gnnio.nn.TransformerConv(F, 4, heads=2),
}
LAYER_GRAPHS = [("cora",) + real("cora"), ("powerlaw-3K-30K",) + powerlaw_graph(),
                next(g for g in adversarial() if g[0] == "isolated")]


def outputs_and_grads(module, x, *args, **kwargs):
    x = x.detach().clone().requires_grad_()
    out = module(x, *args, **kwargs)
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x] + params, gout)
    return out.detach(), grads


def assert_agree(a, b):
    # float64: each output is the same sum over the same neighbours in the same (edge) order, so
    # node outputs agree to a few ulp; the parameter gradients sum over all N nodes in another
    # order, which moves them by at most ~N * eps * |terms| ~ 1e-12 relative for N = 3000.
    # rtol 1e-10 leaves two orders of margin and is far below any real error (>= 1e-3).
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("name,ei,n", LAYER_GRAPHS, ids=[g[0] for g in LAYER_GRAPHS])
def test_layer_outputs_and_gradients_agree(name, ei, n, layer, method):
    torch.manual_seed(0)
    module = LAYERS[layer]().double()
    x = torch.randn(n, F, dtype=torch.float64)
    out, grads = outputs_and_grads(module, x, ei)
    wrapped = reorder.Reordered(module, method)
    out_r, grads_r = outputs_and_grads(wrapped, x, ei)
    assert_agree(out_r, out)
    for g_r, g in zip(grads_r, grads):
        assert_agree(g_r, g)
    # keep_order=False: the output stays in the new order.
    r = wrapped.reordering(ei, n)
    kept = reorder.Reordered(module, method, keep_order=False)(x, ei)
    assert_agree(kept.detach(), out[r.perm])


def test_per_edge_inputs_line_up():
    ei, n = real("cora")
    torch.manual_seed(0)
    module = gnnio.nn.GCNConv(F, 8).double()
    x = torch.randn(n, F, dtype=torch.float64)
    w = torch.rand(ei.size(1), dtype=torch.float64) + 0.5
    graph = gnnio.Graph(ei, num_nodes=n)
    out = module(x, graph, w)
    assert_agree(reorder.Reordered(module, "rcm")(x, graph, w), out)
    assert_agree(reorder.Reordered(module, "degree")(x, graph, edge_weight=w), out)
    sage = gnnio.nn.SAGEConv(F, 8).double()  # and a pair (x_src, x_dst) of one node set
    assert_agree(reorder.Reordered(sage, "rcm")((x, x), ei), sage((x, x), ei))


def test_wrapping_a_model():
    ei, n = real("cora")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = gnnio.nn.SAGEConv(F, 16), gnnio.nn.GATv2Conv(16, 4, heads=2)

        def forward(self, x, edge_index):
            return self.b(self.a(x, edge_index).relu(), edge_index)

    model = Model().double()
    x = torch.randn(n, F, dtype=torch.float64)
    assert_agree(reorder.Reordered(model, "metis")(x, ei), model(x, ei))


@pytest.mark.cuda
@pytest.mark.parametrize("method", METHODS)
def test_cuda_graph_gives_cuda_permutation(method):
    if method == "metis":  # the GPU machine's image has no pymetis (CI installs it for the CPU tests)
        pytest.importorskip("pymetis")
    ei, n = real("cora")
    cpu = reorder.permutation(gnnio.Graph(ei, num_nodes=n), method)
    new, perm = gnnio.Graph(ei.cuda(), num_nodes=n).reorder(method)
    assert perm.is_cuda and new.device.type == "cuda"
    assert torch.equal(perm.cpu(), cpu.perm)


# ---------------------------------------------------------------------------------------------
# bad input

def test_unknown_method_and_bipartite_graph_are_refused():
    ei, n = real("cora")
    graph = gnnio.Graph(ei, num_nodes=n)
    with pytest.raises(ValueError, match="unknown reordering method 'random'; choose from degree"):
        graph.reorder("random")
    with pytest.raises(ValueError, match="unknown reordering method"):
        reorder.permutation(graph, "RCM")
    with pytest.raises(ValueError, match="unknown reordering method"):
        reorder.Reordered(torch.nn.Identity(), "nope")
    bipartite = gnnio.Graph(torch.tensor([[0, 1], [2, 0]]), size=(2, 3))
    for method in METHODS:
        with pytest.raises(ValueError, match="non-bipartite graph.*num_src=2, num_dst=3"):
            bipartite.reorder(method)
    with pytest.raises(TypeError, match="needs a gnnio.Graph"):
        reorder.degree(ei)


def test_missing_library_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # makes `import pymetis` fail
    graph = gnnio.Graph(*real("cora"))
    with pytest.raises(ImportError, match="needs the pymetis package.*pip install pymetis"):
        graph.reorder("metis")
    graph.reorder("degree")  # the others still work


# ---------------------------------------------------------------------------------------------
# the benchmark hook

def test_bench_reorder_option(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["bench", "--graphs", "grid-8x8", "--layers", "spmm,GCNConv", "--repeat", "1",
                     "--warmup", "0", "--features", "4", "--device", "cpu", "--reorder", "rcm",
                     "--out", str(out), "--no-plot"]) == 0
    assert "reorder(rcm):" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["reorder"] == "rcm"
    rows = {(r["layer"], r["impl"]): r for r in result["rows"]}
    assert rows["reorder(rcm)", "gnnio"]["fwd_ms"] > 0
    assert {("spmm", "gnnio"), ("GCNConv", "gnnio"), ("GCNConv", "pyg")} <= set(rows)
    assert rows["GCNConv", "pyg"]["max_rel_diff_vs_gnnio"] < 1e-3
    with pytest.raises(SystemExit):
        cli.main(["bench", "--graphs", "grid-8x8", "--reorder", "random"])
    assert "invalid choice: 'random'" in capsys.readouterr().err
