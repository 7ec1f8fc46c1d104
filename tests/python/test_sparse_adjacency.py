"""Sparse adjacency inputs: every layer given a torch.sparse ``adj_t`` [num_dst, num_src] (COO,
CSR, CSC) in place of edge_index, against PyG 2.8 given the same adj_t.

PyG's conventions for a sparse adjacency differ from its edge_index ones, and these tests pin
them: the values are spmm weights (GCNConv, GraphConv, SAGEConv: a mean divides by the number of
entries), GCNConv adds a loop of weight 1 (2 when improved) to every node beside any loop it has,
an uncoalesced COO's duplicates are merged by PyG's spmm but kept as separate edges by the
attention layers, and GATConv / GATv2Conv return their weights as a sparse tensor. Precision:
layer_pairs.check_against_pyg (at most 2x PyG's own float32 error against float64), on outputs
and on the gradients of x, every parameter and the adjacency's values.
"""
import copy

import pytest
import torch
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor, to_torch_csr_tensor

import gnnio
import gnnio.nn
from gnnio.adjacency import adjacency_edges
from conftest import assert_no_worse_than_reference
from graphs import hub, random_graph, real
from layer_pairs import check_against_pyg, make_pair

_BUILD = {"csr": to_torch_csr_tensor, "coo": to_torch_coo_tensor, "csc": to_torch_csc_tensor}


def adjacency(ei, size, values, layout):
    """adj_t [num_dst, num_src] of the edges (source, destination) ``ei``; PyG's builders
    coalesce, so the storage order is (destination, source) sorted for CSR and COO."""
    num_src, num_dst = size
    return _BUILD[layout](ei.flip(0), values, size=(num_dst, num_src))


def coalesced_edges(ei, size):
    """ei without duplicates, in the storage order of its coalesced adj_t."""
    return adjacency_edges(adjacency(ei, size, None, "csr")).edge_index


def graphs():
    cora, n = real("cora")
    ei_r, n_r = random_graph(60, 400)
    loops = torch.tensor([[0, 1, 1, 2, 2, 3, 4], [0, 1, 2, 2, 3, 0, 4]])
    return [("cora", cora, (n, n)), ("random", ei_r, (n_r, n_r)),
            ("self_loops", loops, (6, 6)),  # node 5 isolated
            ("no_edges", torch.empty(2, 0, dtype=torch.long), (5, 5))]


GRAPHS = graphs()
GRAPH_IDS = [g[0] for g in GRAPHS]

# (layer, options, spmm family: the values weight the messages)
LAYERS = [
    ("GCNConv", {}, True), ("GCNConv", {"improved": True}, True),
    ("GCNConv", {"normalize": False}, True), ("GCNConv", {"add_self_loops": False}, True),
    ("GCNConv", {"cached": True}, True),
    ("GraphConv", {}, True), ("GraphConv", {"aggr": "mean"}, True),
    ("GraphConv", {"aggr": "max"}, True),
    ("SAGEConv", {}, True), ("SAGEConv", {"aggr": "max"}, True),
    ("SAGEConv", {"project": True, "normalize": True}, True), ("SAGEConv", {"aggr": "add"}, True),
    ("GATConv", {"heads": 2}, False), ("GATConv", {"heads": 2, "add_self_loops": False}, False),
    ("GATv2Conv", {"heads": 2}, False),
    ("TransformerConv", {"heads": 2}, False), ("TransformerConv", {"heads": 2, "beta": True}, False),
]
LAYER_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in opts.items()) or 'default'}"
             for name, opts, _ in LAYERS]


def _layout_for_pyg(layer, layout, device, weighted):
    """The layout PyG 2.8 is given the same matrix in: its own where it runs it, else CSR (it
    takes CSC only in spmm outside gcn_norm and differentiates no CSC values; gcn_norm does not
    differentiate COO values); None on CUDA for max/min, which PyG has no sparse kernel for
    (the reference is then its edge_index call, with the values as GraphConv's edge_weight)."""
    name = type(layer).__name__
    if device.type == "cuda" and getattr(layer, "aggr", None) in ("max", "min"):
        return None
    if layout == "csc" and (weighted or (name not in ("GraphConv", "SAGEConv")
                                         and not (name == "GCNConv" and not layer.normalize))):
        return "csr"
    if weighted and layout == "coo" and name == "GCNConv" and layer.normalize:
        return "csr"
    return layout


# weighted: values other than 1, where a layer reads them (not the attention layers)
WEIGHTINGS = [(name, opts, weighted) for name, opts, spmm_family in LAYERS
              for weighted in (False, True) if not weighted or spmm_family]
WEIGHTING_IDS = [f"{LAYER_IDS[[(n, o) for n, o, _ in LAYERS].index((name, opts))]}-"
                 f"{'weighted' if weighted else 'unit'}" for name, opts, weighted in WEIGHTINGS]


@pytest.mark.parametrize("layout", ["csr", "coo", "csc"])
@pytest.mark.parametrize("name,opts,weighted", WEIGHTINGS, ids=WEIGHTING_IDS)
@pytest.mark.parametrize("graph_id,ei,size", GRAPHS, ids=GRAPH_IDS)
def test_layer_on_adjacency_matches_pyg(device, graph_id, ei, size, name, opts, weighted, layout):
    if device.type == "cuda" and weighted and name == "SAGEConv" and opts.get("aggr") == "max":
        pytest.skip("PyG has no CUDA path for a max over a weighted sparse adjacency (its spmm "
                    "raises; SAGEConv takes no edge_weight): the CPU case is the PyG check, "
                    "test_reduce's CUDA cases check the kernel against float64")
    f_in = 9
    pyg, ours = make_pair(name, f_in, 6, device=device, **opts)
    ei = coalesced_edges(ei, size).to(device)
    inputs = {"x": torch.randn(size[0], f_in, device=device),
              "edge_weight": torch.rand(ei.size(1), device=device) + 0.5 if weighted else None}

    def call(layer, t):
        values = t["edge_weight"]
        if values is None:  # PyG's builders give float32 ones; the layers need x's dtype
            values = torch.ones(ei.size(1), dtype=t["x"].dtype, device=device)
        if type(layer).__module__.startswith("gnnio"):
            return layer(t["x"], adjacency(ei, size, values, layout))
        pyg_layout = _layout_for_pyg(layer, layout, device, weighted)
        if pyg_layout is None:
            return layer(t["x"], ei, t["edge_weight"]) if weighted else layer(t["x"], ei)
        return layer(t["x"], adjacency(ei, size, values, pyg_layout))

    check_against_pyg(pyg, ours, call, inputs, calls=2 if opts.get("cached") else 1)


@pytest.mark.parametrize("name,opts,spmm_family", LAYERS, ids=LAYER_IDS)
def test_csc_and_coo_give_the_bits_of_csr(device, name, opts, spmm_family):
    """One matrix in three layouts: the edges reach the kernels in the same order within each
    destination (CSC's storage is sorted by (source, destination)), so every output and
    gradient is bit-identical, and a second CSR call repeats them. On CUDA under
    torch.use_deterministic_algorithms: CUDA's default paths (cuSPARSE's SpMM, atomics) are not
    bitwise repeatable even on one layout (spmm/policy.h)."""
    if opts.get("cached"):
        pytest.skip("a cached layer keeps its first adjacency")
    if device.type == "cuda":
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            _layouts_give_the_same_bits(device, name, opts, spmm_family)
        finally:
            torch.use_deterministic_algorithms(deterministic)
    else:
        _layouts_give_the_same_bits(device, name, opts, spmm_family)


def _layouts_give_the_same_bits(device, name, opts, spmm_family):
    ei, n = real("cora")
    ei = coalesced_edges(ei, (n, n)).to(device)
    torch.manual_seed(0)
    _, layer = make_pair(name, 9, 6, device=device, **opts)
    x = torch.randn(n, 9, device=device)
    w = torch.rand(ei.size(1), device=device) + 0.5
    if not spmm_family:
        w = torch.ones_like(w)
    learnable = spmm_family
    params = list(layer.parameters())
    runs = []
    for layout in ("csr", "coo", "csc", "csr"):
        # The adjacency itself is the leaf whose values learn. (Values built into a CSR / CSC
        # tensor from a tensor that needs a gradient send it through torch's backward of the
        # constructor, which on CUDA under deterministic algorithms raises "expected scalar type
        # Long but found Bool": seen on the H200, torch's, not gnnio's; docs/api.md.) Gradients by
        # autograd.grad: accumulating into a CSC leaf raises in torch.
        xl = x.clone().requires_grad_()
        adj = adjacency(ei, (n, n), w.clone(), layout).requires_grad_(learnable)
        out = layer(xl, adj)
        wrt = [xl] + ([adj] if learnable else []) + params
        grads = list(torch.autograd.grad(out, wrt, torch.ones_like(out), allow_unused=True))
        if learnable:
            grads[1] = grads[1].to_dense()  # the layouts store the entries in different orders
        runs.append([out.detach()] + grads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("name,opts,spmm_family", LAYERS, ids=LAYER_IDS)
def test_adjacency_is_its_edge_list(device, name, opts, spmm_family):
    """gnnio on a CSR adj_t computes what gnnio computes on its edges in storage order with its
    values as edge weights (the spmm layers other than GCNConv's normalisation, whose loops
    differ by PyG's design, and every attention layer): bit for bit."""
    if name == "GCNConv" and opts.get("normalize", True):
        pytest.skip("GCNConv's sparse loops differ from its edge_index loops by PyG's design")
    if name == "SAGEConv" and opts.get("project"):
        pytest.skip("the SAGEConv reference below is the layer without a projection")
    ei, n = random_graph(80, 900)
    ei = coalesced_edges(ei, (n, n)).to(device)
    _, layer = make_pair(name, 9, 6, device=device, **opts)
    x = torch.randn(n, 9, device=device)
    w = torch.rand(ei.size(1), device=device) + 0.5
    weighted = spmm_family
    values = w if weighted else torch.ones_like(w)
    from_adjacency = layer(x, adjacency(ei, (n, n), values, "csr"))
    takes_weight = name in ("GCNConv", "GraphConv")
    if weighted and not takes_weight:  # SAGEConv's weighted reduction is the op's
        aggr = opts.get("aggr", "mean")
        reduce = {"add": "sum"}.get(aggr, aggr)
        from_edges = layer.lin_l(gnnio.ops.segment_reduce(gnnio.Graph(ei, n), x, reduce, edge_weight=w))
        if layer.root_weight:
            from_edges = from_edges + layer.lin_r(x)
    else:
        from_edges = layer(x, ei, w) if weighted else layer(x, ei)
    assert torch.equal(from_adjacency, from_edges)


@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("name,opts", [("GATConv", {}), ("GATConv", {"add_self_loops": False}),
                                       ("GATv2Conv", {}), ("GATv2Conv", {"add_self_loops": False}),
                                       ("TransformerConv", {})])
def test_returned_attention_weights_match_pyg(device, name, opts, layout):
    """GATConv and GATv2Conv return (adj, alpha): adj_t with its loops replaced, entries sorted,
    alpha [E, H] as its values and in its entry order; TransformerConv returns the given adj_t.
    On CUDA (whose attention runs float32, float16 and bfloat16) in float32 under the suite's
    rule against PyG's float32 and float64; on the CPU in float64 against PyG's float64."""
    ei, n = GRAPHS[2][1], GRAPHS[2][2][0]
    ei_r, n_r = random_graph(40, 300)
    dtype = _attention_dtype(device)
    for edges, size in ((ei, (n, n)), (ei_r, (n_r, n_r))):
        edges = coalesced_edges(edges, size).to(device)
        pyg, ours = make_pair(name, 5, 3, heads=2, device=device, **opts)
        # drawn in the dtype under test: the float64 reference sees the same inputs
        x = torch.randn(size[0], 5, dtype=torch.float64, device=device).to(dtype).double()

        def run(layer, dt):
            adj = adjacency(edges, size, torch.ones(edges.size(1), dtype=dt, device=device), layout)
            return adj, copy.deepcopy(layer).to(dt)(x.to(dt), adj, return_attention_weights=True)
        adj, (out_o, (adj_o, alpha_o)) = run(ours, dtype)
        _, (out_p, (adj_p, alpha_p)) = run(pyg, dtype)
        _, (out_e, (adj_e, alpha_e)) = run(pyg, torch.float64)
        _close_to_pyg(out_o, out_p, out_e)
        _close_to_pyg(alpha_o, alpha_p, alpha_e)
        assert adj_o.layout == adj_p.layout and adj_o.shape == adj_p.shape
        if name == "TransformerConv":
            assert adj_o is adj
            continue
        if layout == "csr":
            assert torch.equal(adj_o.crow_indices(), adj_p.crow_indices())
            assert torch.equal(adj_o.col_indices(), adj_p.col_indices())
        else:
            assert adj_o.is_coalesced() and torch.equal(adj_o.indices(), adj_p.indices())
        _close_to_pyg(adj_o.values(), adj_p.values(), adj_e.values())


def _attention_dtype(device):
    """float64 where gnnio's attention runs it (the CPU), else float32."""
    return torch.float64 if device.type == "cpu" else torch.float32


def _close_to_pyg(ours, pyg, exact):
    """float64: PyG's float64 to 1e-12 (the same sums in another order); float32: the suite's
    rule (at most 2x PyG's float32 error against its float64)."""
    assert ours.shape == pyg.shape == exact.shape
    if ours.dtype == torch.float64:
        torch.testing.assert_close(ours, pyg, rtol=1e-12, atol=1e-12)
    else:
        assert ours.dtype == pyg.dtype
        assert_no_worse_than_reference(ours, pyg, exact)


def test_uncoalesced_coo_duplicates_follow_pyg(device):
    """Duplicate entries of an uncoalesced COO: PyG's spmm merges them (values summed, counted
    once by a mean, the sum seen by a max), and so do GATConv's self-loop utilities (they rebuild
    the tensor coalesced). Without loops PyG's attention layers refuse such a tensor; gnnio's
    keep the duplicates as separate edges in storage order, as PyG does for an edge_index."""
    ij = torch.tensor([[1, 1, 0, 2, 1, 2, 3], [0, 0, 2, 1, 2, 1, 1]], device=device)  # [dst, src]
    n = 4
    x = torch.randn(n, 5, dtype=torch.float64, device=device)
    x32 = x.float().double()  # what the float32 runs and their float64 reference share
    for name, opts, weighted in [("SAGEConv", {}, True), ("GraphConv", {"aggr": "mean"}, True),
                                 ("GraphConv", {}, True), ("GCNConv", {}, True),
                                 ("GATConv", {"add_self_loops": False}, False),
                                 ("GATConv", {}, False), ("TransformerConv", {}, False)]:
        pyg, ours = make_pair(name, 5, 3, device=device, **opts)
        dtype = torch.float64 if weighted else _attention_dtype(device)
        w = torch.rand(ij.size(1), dtype=torch.float64, device=device) + 0.5 if weighted \
            else torch.ones(ij.size(1), dtype=torch.float64, device=device)

        def adj(dt):  # PyG marks a COO it builds coalesced; this one is not
            return torch.sparse_coo_tensor(ij, w.to(dt), (n, n))
        assert not adj(dtype).is_coalesced()

        xs = x if dtype == torch.float64 else x32

        pyg_takes_it = weighted or (name == "GATConv" and opts.get("add_self_loops", True))

        def pyg_run(dt):
            layer = copy.deepcopy(pyg).to(dt)
            return layer(xs.to(dt), adj(dt)) if pyg_takes_it else layer(xs.to(dt), ij.flip(0))
        out = copy.deepcopy(ours).to(dtype)(xs.to(dtype), adj(dtype))
        _close_to_pyg(out, pyg_run(dtype), pyg_run(torch.float64))
    # Merged duplicates of unit entries hold 2: PyG's max is over 2 x_j there. PyG runs a max
    # over a sparse adjacency on the CPU only, so it is the reference for both devices.
    pyg, ours = make_pair("SAGEConv", 5, 3, device="cpu", aggr="max")
    ones = torch.ones(ij.size(1), dtype=torch.float64)
    expected = pyg.double()(x.cpu(), torch.sparse_coo_tensor(ij.cpu(), ones, (n, n)))
    out = ours.to(device).double()(x, torch.sparse_coo_tensor(ij, ones.to(device), (n, n)))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-12, atol=1e-12)


def test_bipartite_adjacency(device):
    ei, _ = random_graph(30, 200)
    ei[1] %= 17
    size = (30, 17)
    ei = coalesced_edges(ei, size).to(device)
    x = (torch.randn(30, 7, device=device), torch.randn(17, 5, device=device))
    w = torch.rand(ei.size(1), device=device) + 0.5
    for name, opts, values in [("SAGEConv", {}, w), ("GraphConv", {}, w),
                               ("GATConv", {"add_self_loops": False}, None),
                               ("GATv2Conv", {"add_self_loops": False}, None),
                               ("TransformerConv", {}, None)]:
        pyg, ours = make_pair(name, (7, 5), 4, device=device, **opts)
        ones = torch.ones(ei.size(1), device=device)
        inputs = {"x0": x[0], "x1": x[1], "edge_weight": values}

        def call(layer, t):
            v = t["edge_weight"] if t["edge_weight"] is not None else ones.to(t["x0"].dtype)
            return layer((t["x0"], t["x1"]), adjacency(ei, size, v, "csr"))
        check_against_pyg(pyg, ours, call, inputs)


@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GATConv"])
def test_pyg_to_sparse_tensor_transform(device, name):
    """What a PyG user migrates: data.adj_t from T.ToSparseTensor(layout=torch.sparse_csr),
    with the edge weights it moves into the values (GCNConv) or none (ones)."""
    import torch_geometric.transforms as T
    from torch_geometric.data import Data
    ei, n = real("cora")
    data = Data(edge_index=ei, num_nodes=n)
    if name == "GCNConv":
        data.edge_weight = torch.rand(ei.size(1)) + 0.5
    data = T.ToSparseTensor(layout=torch.sparse_csr)(data).to(device)
    assert data.adj_t.layout == torch.sparse_csr and "edge_index" not in data
    adj = data.adj_t
    adj64 = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), adj.values().double(),
                                    adj.shape)  # for PyG's float64 reference run
    pyg, ours = make_pair(name, 16, 8, device=device)
    check_against_pyg(pyg, ours, lambda layer, t: layer(t["x"], adj),
                      {"x": torch.randn(n, 16, device=device)},
                      exact_call=lambda layer, t: layer(t["x"], adj64))


@pytest.mark.slow
def test_hub_of_100k_neighbours_as_adjacency(device):
    ei, n = hub()
    ei = coalesced_edges(ei, (n, n)).to(device)
    for name, opts in [("SAGEConv", {}), ("GATConv", {"heads": 2}), ("TransformerConv", {"heads": 2})]:
        pyg, ours = make_pair(name, 8, 4, device=device, **opts)
        ones = torch.ones(ei.size(1), device=device)

        def call(layer, t):
            return layer(t["x"], adjacency(ei, (n, n), ones.to(t["x"].dtype), "csr"))
        check_against_pyg(pyg, ours, call, {"x": torch.randn(n, 8, device=device)})


# ---------------------------------------------------------------------------------------------
# the Graph of an adjacency, its cache, and bad inputs

@pytest.mark.parametrize("layout", ["csr", "coo", "csc"])
@pytest.mark.parametrize("graph_id,ei,size", GRAPHS, ids=GRAPH_IDS)
def test_graph_of_adjacency_is_the_graph_of_its_edges(device, graph_id, ei, size, layout):
    ei = coalesced_edges(ei, size).to(device)
    adj = adjacency(ei, size, None, layout)
    ours = gnnio.Graph(adj)
    stored = adjacency_edges(adj).edge_index
    ref = gnnio.Graph(stored, size=size)
    assert (ours.num_src, ours.num_dst, ours.num_edges) == (ref.num_src, ref.num_dst, ref.num_edges)
    assert torch.equal(ours.edge_index, ref.edge_index)
    for a, b in zip(ours.csr_by_dst, ref.csr_by_dst):
        assert torch.equal(a, b)
    for a, b in zip(ours.csr_by_src, ref.csr_by_src):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout,sorts", [("csr", 0), ("coo", 0), ("csc", 1)])
def test_graph_of_adjacency_sorts_only_what_it_lacks(monkeypatch, layout, sorts):
    """A CSR (or coalesced COO) adj_t is the destination-major CSR already; a CSC one is the
    source-major CSR, so only csr_by_dst is sorted; the transpose of a CSR is sorted once."""
    built = []
    original = gnnio.Graph._build
    monkeypatch.setattr(gnnio.Graph, "_build", lambda self, *a: built.append(1) or original(self, *a))
    ei, n = random_graph(50, 300)
    g = gnnio.Graph(adjacency(coalesced_edges(ei, (n, n)), (n, n), None, layout))
    assert len(built) == sorts
    g.csr_by_src
    assert len(built) == 1


def test_graph_of_uncoalesced_coo_keeps_its_storage_order(device):
    ij = torch.tensor([[2, 0, 2, 1, 2], [1, 2, 1, 0, 0]], device=device)  # rows are destinations
    g = gnnio.Graph(torch.sparse_coo_tensor(ij, torch.ones(5, device=device), (3, 3)))
    assert g.edge_index.tolist() == [[1, 2, 1, 0, 0], [2, 0, 2, 1, 2]]
    assert g.csr_by_dst.perm.tolist() == [1, 3, 0, 2, 4]


def test_graph_size_must_match_the_adjacency():
    adj = adjacency(torch.tensor([[0, 1], [1, 2]]), (3, 4), None, "csr")  # 3 sources, 4 dst
    assert (gnnio.Graph(adj).num_src, gnnio.Graph(adj).num_dst) == (3, 4)
    assert gnnio.Graph(adj, size=(3, 4)).num_edges == 2
    with pytest.raises(ValueError, match="shape"):
        gnnio.Graph(adj, size=(4, 3))
    with pytest.raises(ValueError, match="shape"):
        gnnio.Graph(adj, num_nodes=4)


def test_layer_reuses_the_graph_of_an_unmodified_adjacency():
    ei, n = random_graph(30, 100)
    ei = coalesced_edges(ei, (n, n))
    adj = adjacency(ei, (n, n), torch.ones(ei.size(1)), "csr")
    layer = gnnio.nn.GraphConv(4, 3, bias=False)  # linear in the aggregation
    x = torch.randn(n, 4)
    first = layer(x, adj)
    graph = layer._graphs._graph
    assert torch.equal(layer(x, adj), first) and layer._graphs._graph is graph
    adj.values().mul_(3.0)  # in place: the values are no longer all 1
    out = layer(x, adj)
    assert layer._graphs._graph is not graph
    torch.testing.assert_close(out - layer.lin_root(x), 3.0 * (first - layer.lin_root(x)))


def test_values_that_need_a_gradient_are_read_on_every_call():
    """Learnable edge weights that start at 1: an evaluation under no_grad before training must
    not fix them at 1 for later calls (the optimiser changes them in place, through the tensor
    the adjacency was built from, which torch does not version with it)."""
    ei, n = random_graph(30, 100)
    ei = coalesced_edges(ei, (n, n))
    w = torch.ones(ei.size(1), requires_grad=True)
    structure = adjacency(ei, (n, n), None, "csr")
    adj = torch.sparse_csr_tensor(structure.crow_indices(), structure.col_indices(), w,
                                  structure.shape)  # its values are w's storage
    layer = gnnio.nn.GraphConv(4, 3, bias=False)
    x = torch.randn(n, 4)
    with torch.no_grad():
        first = layer(x, adj) - layer.lin_root(x)
        w.mul_(3.0)
        torch.testing.assert_close(layer(x, adj) - layer.lin_root(x), 3.0 * first)


@pytest.mark.parametrize("name,opts", [("SAGEConv", {}), ("GraphConv", {}),
                                       ("GATConv", {"add_self_loops": False})])
def test_missing_destination_features_take_the_adjacency_shape(name, opts):
    """(x_src, None) with a rectangular adj_t: the destination count is adj_t.size(0), as in PyG."""
    ei, _ = random_graph(12, 60)
    ei[1] %= 5
    ei = coalesced_edges(ei, (12, 5))
    pyg, ours = make_pair(name, 6, 4, **opts)
    x = torch.randn(12, 6)
    adj = adjacency(ei, (12, 5), torch.ones(ei.size(1)), "csr")
    out = ours((x, None), adj)
    assert out.shape[0] == 5
    torch.testing.assert_close(out, pyg((x, None), adj), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_reads_values_only_as_missing_edge_features(name):
    """1-D values are not read; [E, D] values are the edge features of a layer with edge_dim that
    is given no edge_attr (PyG's message passing takes them so)."""
    ei, n = random_graph(25, 120)
    ei = coalesced_edges(ei, (n, n))
    x = torch.randn(n, 6, dtype=torch.float64)
    _, plain = make_pair(name, 6, 4, heads=2, **({} if name == "TransformerConv" else
                                                  {"add_self_loops": False}))
    plain = plain.double()
    w = torch.rand(ei.size(1), dtype=torch.float64) + 0.5
    ones = torch.ones_like(w)
    assert torch.equal(plain(x, adjacency(ei, (n, n), w, "csr")),
                       plain(x, adjacency(ei, (n, n), ones, "csr")))
    opts = {"edge_dim": 3} if name == "TransformerConv" else {"edge_dim": 3, "add_self_loops": False}
    pyg, ours = make_pair(name, 6, 4, heads=2, **opts)
    pyg, ours = pyg.double(), ours.double()
    feats = torch.randn(ei.size(1), 3, dtype=torch.float64)
    adj = adjacency(ei, (n, n), feats, "coo")
    out = ours(x, adj)
    torch.testing.assert_close(out, ours(x, adj, feats), rtol=0, atol=0)
    torch.testing.assert_close(out, pyg(x, adj), rtol=1e-12, atol=1e-12)


def test_uncoalesced_coo_with_learnable_values_builds_its_graph_once(monkeypatch):
    built = []
    original = gnnio.Graph.__init__
    monkeypatch.setattr(gnnio.Graph, "__init__",
                        lambda self, *a, **k: built.append(1) or original(self, *a, **k))
    ij = torch.tensor([[1, 1, 0, 2, 1], [0, 0, 2, 1, 2]])
    w = torch.rand(5, requires_grad=True)
    adj = torch.sparse_coo_tensor(ij, w, (3, 3))
    layer = gnnio.nn.GraphConv(4, 2, aggr="mean")
    x = torch.randn(3, 4)
    for _ in range(3):  # adj's own autograd node is reused: keep it
        layer(x, adj).sum().backward(retain_graph=True)
    assert len(built) == 1
    assert w.grad[0] == w.grad[1]  # one merged entry: the two duplicates get its gradient


def test_returned_weights_of_an_uncoalesced_coo_line_up_with_alpha():
    ij = torch.tensor([[1, 1, 0, 2, 1], [0, 0, 2, 1, 2]])  # the duplicate (1, 0) stays two edges
    layer = gnnio.nn.GATConv(4, 2, heads=2, add_self_loops=False)
    _, (adj, alpha) = layer(torch.randn(3, 4), torch.sparse_coo_tensor(ij, torch.ones(5), (3, 3)),
                            return_attention_weights=True)
    assert adj._nnz() == alpha.size(0) == 5
    assert torch.equal(adj._indices(), ij) and torch.equal(adj._values(), alpha)


def _csr(n=4):
    return adjacency(torch.tensor([[0, 1, 2], [1, 2, 3]]), (n, n), torch.rand(3), "csr")


def test_bad_adjacency_inputs():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="edge_weight cannot be given"):
        gnnio.nn.GCNConv(3, 2)(x, _csr(), torch.rand(3))
    with pytest.raises(ValueError, match="edge_weight cannot be given"):
        gnnio.nn.GraphConv(3, 2)(x, _csr(), torch.rand(3))
    hybrid = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), torch.rand(2, 5), (4, 4, 5))
    with pytest.raises(NotImplementedError, match="dense value dimensions"):
        gnnio.nn.GraphConv(3, 2)(x, hybrid)
    ints = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 2]]), torch.tensor([1, 2]), (4, 4))
    with pytest.raises(TypeError, match="floating point"):
        gnnio.nn.GCNConv(3, 2)(x, ints)
    with pytest.raises(ValueError, match="rows"):  # 4 feature rows, 5 x 5 adjacency
        gnnio.nn.GATConv(3, 2)(x, _csr(5))
    with pytest.raises(ValueError, match="shape"):  # GCNConv needs a square adjacency
        gnnio.nn.GCNConv(3, 2)(x, adjacency(torch.tensor([[0], [1]]), (4, 3), None, "csr"))
    bad_ptr = torch.sparse_csr_tensor(torch.tensor([0, 2, 1, 3, 3]), torch.tensor([1, 2, 3]),
                                      torch.ones(3), (4, 4))
    with pytest.raises(ValueError, match="compressed pointer"):
        gnnio.Graph(bad_ptr)
    out_of_range = torch.sparse_csr_tensor(torch.tensor([0, 1, 2, 3, 3]), torch.tensor([1, 2, 9]),
                                           torch.ones(3), (4, 4))
    with pytest.raises(IndexError):
        gnnio.Graph(out_of_range)
    batched = torch.stack([_csr().to_dense()] * 2).to_sparse_csr()
    with pytest.raises(ValueError, match="2-D"):
        gnnio.Graph(batched)
    with pytest.raises(NotImplementedError, match="layout"):
        gnnio.Graph(_csr().to_sparse_bsr((2, 2)))
    grad_values = torch.rand(2, requires_grad=True)
    uncoalesced = torch.sparse_coo_tensor(torch.tensor([[1, 1], [0, 0]]), grad_values, (4, 4))
    out = gnnio.nn.GraphConv(3, 2)(x, uncoalesced)  # coalesced for the spmm: gradients flow
    out.sum().backward()
    assert grad_values.grad is not None and grad_values.grad[0] == grad_values.grad[1]
