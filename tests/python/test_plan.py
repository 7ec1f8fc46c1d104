"""The planner's user-facing part: Graph.plan (the choice and its reason for a layer or family)
and the SpMM backend choice that gnnio.ops.spmm, gcn_propagate and the SpMM layers use by
default (WSB on CUDA for locally dense graphs, CSR elsewhere and on the CPU), with its
overrides (backend= argument, GNNIO_SPMM_BACKEND). CPU only: the CUDA choice is computed from
the same statistics on any device."""
import os

import pytest
import torch

import gnnio
import gnnio.nn
import gnnio.plan as planner
from gnnio.datasets import blockdiag, powerlaw
from graphs import adversarial, hub, random_graph


@pytest.fixture
def blockdiag_graph():
    return gnnio.Graph(blockdiag(2000, 32_000, seed=0), num_nodes=2000)


@pytest.fixture
def powerlaw_graph():
    return gnnio.Graph(powerlaw(2000, 32_000, seed=0), num_nodes=2000)


@pytest.fixture
def tf32(monkeypatch):
    """The planner sees tf32 allowed (torch.set_float32_matmul_precision('high'))."""
    monkeypatch.setattr(planner, "_tf32_allowed", lambda: True)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    for var in ("GNNIO_SPMM_BACKEND", "GNNIO_SPMM_ALG", "GNNIO_REDUCE", "GNNIO_ATTENTION"):
        monkeypatch.delenv(var, raising=False)


def fields(plan):
    return {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in plan._asdict().items()}


# ---------------------------------------------------------------------------------------------
# the choice

def test_wsb_for_blockdiag_csr_for_powerlaw_and_random(blockdiag_graph, powerlaw_graph, tf32):
    ei, n = random_graph(2000, 32_000, torch.Generator().manual_seed(0))
    rand = gnnio.Graph(ei, num_nodes=n)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert blockdiag_graph.plan("spmm", dtype=dtype).backend == "wsb"
        assert powerlaw_graph.plan("spmm", dtype=dtype).backend == "cusparse"
        assert rand.plan("spmm", dtype=dtype).backend == "cusparse"
    # The CPU keeps CSR whatever the graph: its WSB kernel is the reference implementation.
    assert blockdiag_graph.plan("spmm", dtype=torch.bfloat16).cpu_backend == "csr"
    # float64 has no CUDA WSB kernel.
    assert blockdiag_graph.plan("spmm", dtype=torch.float64).backend == "cusparse"


def test_float32_needs_tf32_allowed(blockdiag_graph):
    # PyTorch's default: full-precision float32 matmuls. (2000 rows: the small-graph threshold;
    # 8.5 for a training call, Graph.plan's default, 32 for an inference call.)
    p = blockdiag_graph.plan("spmm")
    assert p.backend == "cusparse" and "tf32" in p.reason and ">= threshold 8.5" in p.reason
    p = blockdiag_graph.plan("spmm", training=False)
    assert p.backend == "cusparse" and "tf32" in p.reason and ">= threshold 32.0" in p.reason
    assert blockdiag_graph.plan("spmm", dtype=torch.bfloat16).backend == "wsb"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert planner._tf32_allowed()
        assert blockdiag_graph.plan("spmm").backend == "wsb"
    finally:
        torch.set_float32_matmul_precision(before)
    assert not planner._tf32_allowed()


def test_threshold_follows_the_measurements_and_the_width():
    assert planner.wsb_threshold(128, torch.float32) == 32.0
    assert planner.wsb_threshold(128, torch.bfloat16) == planner.wsb_threshold(128, torch.float16) == 16.0
    assert planner.wsb_threshold(128, torch.float64) == float("inf")
    # Narrower features raise it (a tile's 256 values weigh more), wider never lower it.
    widths = [1, 4, 16, 64, 128, 512]
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (None, 1000):
            t = [planner.wsb_threshold(w, dtype, rows) for w in widths]
            assert t == sorted(t, reverse=True) and t[-1] == t[-2]
    assert planner.wsb_threshold(1, torch.float32) > 128  # one column: only nearly full tiles
    # The rule sits between the measured points (bench/results/nvidia-h200-wsb-*.md and
    # -planner.*): float32 (tf32) WSB at 39.4 and 45.0 edges per tile (bcsstk13, IMDB-BINARY
    # in the planner study), CSR at 20.5 (bcsstk25's forward); 16-bit WSB at 20.5, CSR at 9.2
    # (the 1M-row grid); on small graphs 16-bit WSB at 9.7 (NCI1, 122,747 rows), CSR at 7.3
    # (delaunay-n16, 65,536 rows).
    assert 20.5 < planner.wsb_threshold(128, torch.float32) <= 39.4
    assert 9.2 < planner.wsb_threshold(128, torch.bfloat16) <= 20.5
    assert 9.2 < planner.wsb_threshold(128, torch.bfloat16, 10**6) <= 20.5
    assert 7.3 < planner.wsb_threshold(128, torch.bfloat16, 122_747) <= 9.7
    assert 7.3 < planner.wsb_threshold(128, torch.float16, 65_536) <= 9.7
    # tf32 has no small-graph threshold (PROTEINS' tf32 forward is 1.32x slower on WSB).
    assert planner.wsb_threshold(128, torch.float32, 43_471) == 32.0


def test_small_graph_rule_boundary(tf32):
    """16-bit on a graph of at most WSB_SMALL_ROWS destination rows: WSB from 8 edges per tile
    (not 16), and from 4 for a training call; one row more and the large-graph threshold
    applies. float32 (tf32) keeps 32 for inference and takes 8.5 for training."""
    limit = planner.WSB_SMALL_ROWS
    assert planner.wsb_threshold(128, torch.bfloat16, limit) == 8.0
    assert planner.wsb_threshold(128, torch.bfloat16, limit, training=True) == 4.0
    assert planner.wsb_threshold(128, torch.float32, limit, training=True) == 8.5
    for training in (False, True):
        assert planner.wsb_threshold(128, torch.bfloat16, limit + 1, training=training) == 16.0
        assert planner.wsb_threshold(128, torch.float32, limit + 1, training=training) == 32.0
    # 12 edges in each 16 x 16 diagonal tile (rows 0-11 of each block, one edge each): 12
    # edges per tile, between the two thresholds.
    def ladder(n):
        dst = (torch.arange(n // 16) * 16).repeat_interleave(12) + torch.arange(12).repeat(n // 16)
        return torch.stack([dst + 1, dst])

    class FakeCuda:
        is_cuda = True

        def __init__(self, dtype, requires_grad):
            self.dtype, self.requires_grad = dtype, requires_grad

        def size(self, dim):
            return 128

    for n, small in ((limit, True), (limit + 16, False)):
        g = gnnio.Graph(ladder(n), num_nodes=n)
        ept = g.wsb_stats()["edges_per_tile"]
        assert 8.0 <= ept < 16.0, ept
        for dtype in (torch.bfloat16, torch.float16):
            for training, small_threshold in ((False, 8.0), (True, 4.0)):
                p = g.plan("spmm", dtype=dtype, training=training)
                assert p.backend == ("wsb" if small else "cusparse"), (n, dtype)
                assert p.wsb_threshold == (small_threshold if small else 16.0)
                assert ("small-graph" in p.reason) == small
                assert planner.spmm_backend(g, FakeCuda(dtype, training)) == ("wsb" if small else "csr")
        # float32 as tf32: 12 < 32 for inference whatever the size; 12 >= 8.5 for training on
        # the small graph.
        p = g.plan("spmm", training=False)
        assert p.backend == "cusparse" and "small-graph" not in p.reason
        assert g.plan("spmm").backend == ("wsb" if small else "cusparse")
        assert planner.spmm_backend(g, FakeCuda(torch.float32, True)) == ("wsb" if small else "csr")
        # The choice is a function of the statistics: the same on a fresh Graph, twice.
        twin = gnnio.Graph(ladder(n), num_nodes=n)
        assert fields(twin.plan("spmm", dtype=torch.bfloat16)) == fields(g.plan("spmm", dtype=torch.bfloat16))


def test_plans_are_deterministic(tf32):
    ei = blockdiag(1000, 16_000, seed=1)
    h, hn = hub(3000)
    for edges, n in ((ei, 1000), (h, hn), (powerlaw(1000, 16_000, seed=2), 1000)):
        a, b = gnnio.Graph(edges, num_nodes=n), gnnio.Graph(edges.clone(), num_nodes=n)
        for name in gnnio.plan_layer.PLAN_NAMES:
            for dtype in (torch.float32, torch.bfloat16):
                pa, pb = a.plan(name, 64, dtype), b.plan(name, 64, dtype)
                assert fields(pa) == fields(pb) and str(pa) == str(pb)
                assert fields(a.plan(name, 64, dtype)) == fields(pa)  # cached statistics: same again


def test_reduce_and_attention_report_the_split():
    ei, n = hub(3000)
    g = gnnio.Graph(ei, num_nodes=n)
    r = g.plan("SAGEConv(max)")
    assert r.family == "reduce" and r.backend == "degree-aware" and r.cpu_backend == "node-parallel"
    assert r.heavy_rows == 1 and r.light_max_degree == 256 and r.chunk == planner.EDGE_CHUNK
    max_in = g.stats()["max_in_degree"]
    assert r.heavy_items == -(-max_in // planner.EDGE_CHUNK) and r.stats["max_in_degree"] == max_in
    assert f"1 rows above 256 slots (max {max_in}" in r.reason
    a = g.plan("GATv2Conv", features=64)
    assert a.family == "attention" and a.backend == "csr-split" and a.heavy_rows == 1
    assert a.chunk == planner.ATTENTION_CHUNK and a.self_loops
    t = g.plan("TransformerConv", features=64, training=False)
    assert not t.self_loops and t.light_max_out_degree is None and "max_out_degree" not in t.stats
    # A graph without hubs: no split.
    flat = gnnio.Graph(blockdiag(1000, 16_000), num_nodes=1000)
    assert flat.plan("GraphConv(max)").backend == "node-parallel"
    assert flat.plan("GATConv").backend == "csr"
    assert "max in-degree" in flat.plan("reduce").reason
    assert "in-degree" in flat.plan("attention").reason


@pytest.mark.parametrize("longest", [200, 256, 257, 300])
def test_attention_splits_only_a_longest_row_above_two_chunks(longest):
    """Rows above max(160, 8 x mean) are heavy, but a graph is split only if its longest row
    (in-degree forward, out-degree in the backward) is above 2 x ATTENTION_CHUNK = 256."""
    gen = torch.Generator().manual_seed(longest)
    n = 2000
    ei = torch.randint(n, (2, 4000), generator=gen)  # mean 2: the threshold is 160
    star = torch.stack([torch.arange(1, longest + 1) % n, torch.zeros(longest, dtype=torch.long)])
    ei = torch.cat([ei[:, (ei[1] != 0) & (ei[0] != 0)], star, star.flip(0)], 1)
    g = gnnio.Graph(ei, num_nodes=n)
    assert g.stats()["max_in_degree"] == longest == g.max_out_degree()
    a = planner.plan_attention(g, 64, backward=True)
    split = longest > 2 * planner.ATTENTION_CHUNK
    assert (a.heavy_rows is not None) == split and (a.heavy_src is not None) == split
    if split:
        assert a.heavy_rows.tolist() == [0] and a.light_max_degree == planner.ATTENTION_MIN_HEAVY
        assert a.light_max_out_degree == planner.ATTENTION_MIN_HEAVY
    else:
        assert a.light_max_degree == a.light_max_out_degree == planner.NODE_PARALLEL
        assert f"max in-degree {longest} is above 160 but not two chunks (256)" in a.reason
    # The layers' plans ask the same rule; GATv2Conv's self-loop adds one to the longest row.
    assert g.plan("TransformerConv", features=64).backend == ("csr-split" if split else "csr")
    assert g.plan("GATv2Conv", features=64).backend == ("csr-split" if longest >= 256 else "csr")


@pytest.mark.parametrize("max_items", [None, 1, 3, 8])
def test_split_rows_covers_each_heavy_row_in_order(max_items):
    """Items tile each heavy row's slots contiguously in slot order; with max_items a row has at
    most that many items (longer ones, ceil(degree / max_items) slots) and rows of at most
    chunk x max_items slots keep chunk-slot items."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    deg = torch.randint(0, 12, (200,), generator=gen)
    deg[torch.randint(0, 200, (6,), generator=gen)] = torch.tensor([5, 33, 64, 65, 300, 10_007])
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long), deg.cumsum(0)])
    threshold, chunk = 6, 4
    heavy, items = planner.split_rows(rowptr, threshold, chunk, max_items)
    assert heavy.tolist() == (deg > threshold).nonzero().view(-1).tolist()
    for h, row in enumerate(heavy.tolist()):
        mine = items[items[:, 0] == h]
        d = int(deg[row])
        row_chunk = chunk if max_items is None else max(chunk, -(-d // max_items))
        assert mine[0, 1] == rowptr[row] and mine[-1, 2] == rowptr[row + 1]
        assert torch.equal(mine[1:, 1], mine[:-1, 2])  # contiguous, in slot order
        lengths = mine[:, 2] - mine[:, 1]
        assert bool((lengths > 0).all()) and bool((lengths <= row_chunk).all())
        assert mine.size(0) == -(-d // row_chunk)
        if max_items is not None:
            assert mine.size(0) <= max_items
            if d <= chunk * max_items:
                assert row_chunk == chunk
    assert torch.equal(items[:, 0], items[:, 0].sort().values)  # row then slot order


def test_attention_caps_a_hubs_items():
    """A hub of more than ATTENTION_CHUNK x ATTENTION_MAX_ITEMS in-edges gets ATTENTION_MAX_ITEMS
    longer items; the merge kernels' block size relies on it (score.cuh, kMergeThreads)."""
    n = planner.ATTENTION_CHUNK * planner.ATTENTION_MAX_ITEMS + 1000
    src = torch.arange(1, n + 1)
    ei = torch.stack([src, torch.zeros_like(src)])
    a = gnnio.Graph(ei, num_nodes=n + 1).plan("GATv2Conv", features=64)
    row_chunk = -(-n // planner.ATTENTION_MAX_ITEMS)  # 129 slots
    assert a.heavy_rows == 1 and a.heavy_items == -(-n // row_chunk) <= planner.ATTENTION_MAX_ITEMS
    assert f"at most {planner.ATTENTION_MAX_ITEMS} per row" in a.reason


def test_reason_names_the_deciding_statistic(blockdiag_graph, powerlaw_graph, tf32):
    for g in (blockdiag_graph, powerlaw_graph):
        p = g.plan("spmm", dtype=torch.bfloat16)
        ept = g.wsb_stats()["edges_per_tile"]
        # 2000 rows: the small-graph threshold of 16-bit types (4 for a training call, 8 for
        # an inference call)
        assert f"{ept:.1f} edges per 16x16 tile" in p.reason and "threshold 4.0" in p.reason
        assert "small-graph training threshold: 2,000 rows" in p.reason
        p = g.plan("spmm", dtype=torch.bfloat16, training=False)
        assert "threshold 8.0" in p.reason and "small-graph threshold: 2,000 rows" in p.reason
        assert "H200" in p.reason and p.stats["edges_per_tile"] == ept
        assert "fill ratio" in p.reason
        text = str(p)
        assert "CUDA: " in text and "CPU:  csr" in text and "why: " in text and "edges_per_tile" in text
    assert "blockdiag-1M-16M" in blockdiag_graph.plan("spmm").reason
    assert "powerlaw-1M-16M" in powerlaw_graph.plan("spmm").reason


def test_csr_algorithm_follows_the_cuda_policy(powerlaw_graph, monkeypatch):
    assert powerlaw_graph.plan("spmm").backend == "cusparse"
    assert powerlaw_graph.plan("spmm", features=1).backend == "rowwarp"  # SpMV
    monkeypatch.setenv("GNNIO_SPMM_ALG", "rowwarp")
    assert powerlaw_graph.plan("spmm").backend == "rowwarp"
    monkeypatch.delenv("GNNIO_SPMM_ALG")
    torch.use_deterministic_algorithms(True)
    try:
        p = powerlaw_graph.plan("spmm")
        assert p.backend == "rowwarp" and "deterministic" in p.reason
    finally:
        torch.use_deterministic_algorithms(False)


def test_gcn_is_planned_with_its_self_loops(blockdiag_graph):
    p = blockdiag_graph.plan("GCNConv", dtype=torch.bfloat16)
    loops = blockdiag_graph.with_remaining_self_loops()[0]
    assert p.self_loops and p.stats["edges_per_tile"] == loops.wsb_stats()["edges_per_tile"]
    bip = gnnio.Graph(torch.stack([torch.randint(30, (200,)), torch.randint(20, (200,))]), size=(30, 20))
    assert not bip.plan("GCNConv").self_loops
    # GATConv adds min(num_src, num_dst) loops to a bipartite graph too, and plans on that graph.
    gat = bip.plan("GATConv")
    looped = bip.with_self_loops(20)[0]
    assert gat.self_loops and gat.stats["max_in_degree"] == looped.stats()["max_in_degree"]


# ---------------------------------------------------------------------------------------------
# names

def test_every_layer_name_is_accepted(blockdiag_graph):
    expected = {"GCNConv": "spmm", "GraphConv(add)": "spmm", "GraphConv(mean)": "spmm",
                "GraphConv(max)": "reduce", "GraphConv(min)": "reduce", "SAGEConv(mean)": "spmm",
                "SAGEConv(max)": "reduce", "SAGEConv(min)": "reduce", "GATConv": "attention",
                "GATv2Conv": "attention", "TransformerConv": "attention", "spmm": "spmm",
                "reduce": "reduce", "attention": "attention", "MaxAggregation": "reduce",
                "MinAggregation": "reduce", "gcn_propagate": "spmm", "spmm(mean)": "spmm",
                "segment_reduce(max)": "reduce", "segment_reduce(mean)": "spmm",
                "graph_attention(gatv2)": "attention"}
    for name, family in expected.items():
        for spelling in (name, name.lower(), name.upper()):
            p = blockdiag_graph.plan(spelling, 16)
            assert p.family == family and p.layer == name, spelling
    for name in gnnio.plan_layer.PLAN_NAMES:
        assert blockdiag_graph.plan(name).layer == name
    # Defaults of the layers, PyG's keyword spelling, classes and instances.
    assert blockdiag_graph.plan("GraphConv").layer == "GraphConv(add)"
    assert blockdiag_graph.plan("SAGEConv").layer == "SAGEConv(mean)"
    assert blockdiag_graph.plan("SAGEConv(aggr='max')").layer == "SAGEConv(max)"
    assert blockdiag_graph.plan(gnnio.nn.GCNConv).layer == "GCNConv"
    assert blockdiag_graph.plan(gnnio.nn.SAGEConv(4, 4, aggr="max")).layer == "SAGEConv(max)"
    assert blockdiag_graph.plan(gnnio.nn.GraphConv(4, 4, aggr="mean")).family == "spmm"
    assert blockdiag_graph.plan("GATConv", dtype="bfloat16").dtype == torch.bfloat16


@pytest.mark.parametrize("layer", ["GINConv", "SAGEConv(lstm)", "spmm(max)", "GraphConv(lstm)", "",
                                   "gat", 42, None])
def test_bad_names_raise_value_error(blockdiag_graph, layer):
    with pytest.raises(ValueError, match="unknown layer or family|takes a layer"):
        blockdiag_graph.plan(layer)


def test_bad_arguments_raise_value_error(blockdiag_graph):
    with pytest.raises(ValueError, match="accepted"):
        blockdiag_graph.plan("GINConv")
    with pytest.raises(ValueError, match="dtype"):
        blockdiag_graph.plan("spmm", dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype"):
        blockdiag_graph.plan("spmm", dtype="fp33")
    with pytest.raises(ValueError, match="features"):
        blockdiag_graph.plan("spmm", features=-1)
    with pytest.raises(ValueError, match="backend"):
        blockdiag_graph.plan("spmm", backend="bsr")
    with pytest.raises(ValueError, match="SpMM backend"):
        blockdiag_graph.plan("SAGEConv(max)", backend="wsb")


# ---------------------------------------------------------------------------------------------
# the SpMM path actually taken, and its overrides

def built_wsb(g):
    return ("wsb", False) in g._values


def test_auto_on_the_cpu_is_csr_without_tile_statistics(blockdiag_graph):
    x = torch.randn(2000, 8)
    out = gnnio.ops.spmm(blockdiag_graph, x)
    assert not built_wsb(blockdiag_graph) and "wsb_stats" not in blockdiag_graph._values
    assert torch.equal(out, gnnio.ops.spmm(blockdiag_graph, x, backend="csr"))
    assert torch.equal(out, gnnio.ops.spmm(blockdiag_graph, x, backend="auto"))


def test_overrides(blockdiag_graph, powerlaw_graph, monkeypatch, tf32):
    x = torch.randn(2000, 8)
    wsb = gnnio.ops.spmm(powerlaw_graph, x, backend="wsb")
    csr = gnnio.ops.spmm(powerlaw_graph, x, backend="csr")
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "wsb")
    assert torch.equal(gnnio.ops.spmm(powerlaw_graph, x), wsb)
    assert torch.equal(gnnio.ops.spmm(powerlaw_graph, x, backend="csr"), csr)  # the argument wins
    assert torch.equal(gnnio.ops.spmm(powerlaw_graph, x, backend="auto"), csr)  # CPU auto
    p = powerlaw_graph.plan("spmm")
    assert p.backend == p.cpu_backend == "wsb" and "GNNIO_SPMM_BACKEND=wsb" in p.reason
    assert "unforced: " in p.reason and "CSR" in p.reason
    assert powerlaw_graph.plan("spmm", backend="auto").backend == "cusparse"
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "csr")
    assert blockdiag_graph.plan("spmm").backend == "cusparse"
    assert blockdiag_graph.plan("spmm", backend="wsb").backend == "wsb"
    assert "backend='wsb'" in blockdiag_graph.plan("spmm", backend="wsb").reason
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "auto")
    assert blockdiag_graph.plan("spmm").backend == "wsb"
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "tiles")
    with pytest.raises(ValueError, match="GNNIO_SPMM_BACKEND"):
        gnnio.ops.spmm(powerlaw_graph, x)
    with pytest.raises(ValueError, match="GNNIO_SPMM_BACKEND"):
        powerlaw_graph.plan("spmm")
    with pytest.raises(ValueError, match="backend"):
        gnnio.ops.spmm(powerlaw_graph, x, backend="bsr")


def test_rule_against_the_planner_studies():
    """The rule's pick for each pass of the committed H200 planner studies' SpMM rows (tf32 and
    bfloat16; the inference rule for the forward, the training rule for forward+backward), run
    with the statistics the studies recorded, is within 10% of that pass's faster backend,
    except in the rows listed here, all calls under 0.4 ms on graphs of at most 2^17 nodes,
    where the host's time is most of the call: citeseer and cora bfloat16 training (WSB ahead at
    1.2 / 1.4 edges per tile in three studies, below pubmed's 1.1 where it loses; not in the
    latest), and rows whose order flips between studies of the same rule and kernels because
    CSR's (cuSPARSE's) host time moved 2-5x between machines while WSB's moved less (PROTEINS
    tf32 fwd+bwd, CSR 0.395 / 0.180 / 0.080 ms and WSB 0.330 / 0.147 / 0.099 ms at e86a9a0 /
    804bade / 7374e72: WSB ahead in two, CSR in the third; bcsstk13 tf32 forward: WSB 1.11x
    ahead at da5855b, CSR 1.25x at noise-fix, CSR 1.79x at 7374e72), or whose times were all
    about twice the same graph's float32 row (PROTEINS tf32 forward at e86a9a0); at c986796
    bcsstk13's tf32 forward (CSR 1.16x) and delaunay-n16's bfloat16 training (CSR 1.28x, WSB
    ahead in three earlier studies). Every study that records each pass's pick picked what the
    rule says."""
    import json
    import os
    known = {("nvidia-h200-planner-da5855b", "citeseer", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-da5855b", "cora", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-noise-fix", "bcsstk13", "float32+tf32", "fwd_ms"),
             ("nvidia-h200-planner-e86a9a0", "citeseer", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-e86a9a0", "cora", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-e86a9a0", "PROTEINS", "float32+tf32", "fwd_ms"),
             ("nvidia-h200-planner-804bade", "bcsstk25", "float32+tf32", "fwd_ms"),
             ("nvidia-h200-planner-804bade", "citeseer", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-804bade", "citeseer", "bfloat16", "fwd_ms"),
             ("nvidia-h200-planner-804bade", "citeseer", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-804bade", "cora", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-804bade", "cora", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-804bade", "delaunay-n16", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-7374e72", "NCI1", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-7374e72", "PROTEINS", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-7374e72", "bcsstk13", "float32+tf32", "fwd_ms"),
             ("nvidia-h200-planner-7374e72", "bcsstk25", "float32+tf32", "fwd_bwd_ms"),
             ("nvidia-h200-planner-7374e72", "delaunay-n16", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner-7374e72", "luxembourg-osm", "bfloat16", "fwd_bwd_ms"),
             ("nvidia-h200-planner", "bcsstk13", "float32+tf32", "fwd_ms"),
             ("nvidia-h200-planner", "delaunay-n16", "bfloat16", "fwd_bwd_ms")}
    misses, checked = set(), 0
    for name in ("nvidia-h200-planner-da5855b", "nvidia-h200-planner-noise-fix", "nvidia-h200-planner-e86a9a0",
                 "nvidia-h200-planner-804bade", "nvidia-h200-planner-7374e72", "nvidia-h200-planner"):
        path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "results", name + ".json")
        with open(path) as f:
            res = json.load(f)
        for r in res["rows"]:
            if r["family"] != "spmm" or r["dtype"] == "float32":  # float32 without tf32: CSR
                continue
            s = res["graphs"][r["graph"]]
            dtype = torch.bfloat16 if r["dtype"] == "bfloat16" else torch.float32
            for training, key in ((False, "fwd_ms"), (True, "fwd_bwd_ms")):
                threshold = planner.wsb_threshold(res["features"], dtype, s["num_nodes"], training)
                pick = "wsb" if s["edges_per_tile"] >= threshold else "csr"
                if "planner_pick_fwd" in r:
                    assert r["planner_pick_fwd" if key == "fwd_ms" else "planner_pick"] == pick
                times = {b: m[key] for b, m in r["backends"].items()}
                checked += 1
                if times[pick] > 1.10 * min(times.values()):
                    misses.add((name, r["graph"], r["dtype"], key))
    assert checked == 2 * (36 + 17 + 36 + 36 + 36 + 36) and misses == known  # the files' tf32 / bf16 rows


def test_cuda_rule_is_what_spmm_would_run(blockdiag_graph, powerlaw_graph, monkeypatch, tf32):
    # The CUDA branch of spmm_backend, with a stand-in for a CUDA tensor.
    class FakeCuda:  # with a gradient: a training call, as Graph.plan's default
        is_cuda = True
        requires_grad = True

        def __init__(self, width, dtype):
            self.width, self.dtype = width, dtype

        def size(self, dim):
            return self.width

    for g in (blockdiag_graph, powerlaw_graph):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            for width in (1, 16, 128):
                plan = g.plan("spmm", width, dtype)
                got = planner.spmm_backend(g, FakeCuda(width, dtype))
                assert got == ("wsb" if plan.backend == "wsb" else "csr"), (g, dtype, width)
    monkeypatch.setattr(planner, "_tf32_allowed", lambda: False)
    assert planner.spmm_backend(blockdiag_graph, FakeCuda(128, torch.float32)) == "csr"
    assert planner.spmm_backend(blockdiag_graph, FakeCuda(128, torch.bfloat16)) == "wsb"


@pytest.mark.parametrize("layer,kwargs", [("GCNConv", {}), ("GraphConv", {"aggr": "add"}),
                                          ("GraphConv", {"aggr": "mean"}), ("SAGEConv", {})],
                         ids=["GCNConv", "GraphConv(add)", "GraphConv(mean)", "SAGEConv(mean)"])
def test_spmm_layers_take_the_default_path(layer, kwargs, monkeypatch):
    """GCNConv, GraphConv(add/mean) and SAGEConv(mean) go through the planner's choice: forced to
    WSB by the variable they run on tiles (the CPU reference) and agree with CSR, gradients
    included (edge weights too)."""
    torch.manual_seed(0)
    ei = blockdiag(300, 3000, seed=4)
    g = gnnio.Graph(ei, num_nodes=300)
    x = torch.randn(300, 6, dtype=torch.float64, requires_grad=True)
    w = torch.rand(3000, dtype=torch.float64, requires_grad=True)
    m = getattr(gnnio.nn, layer)(6, 5, **kwargs).double()
    args = (x, g, w) if layer in ("GCNConv", "GraphConv") else (x, g)
    ref = m(*args)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x] + ([w] if len(args) == 3 else []))
    assert not built_wsb(g) and not any(built_wsb(v[0]) for k, v in g._values.items()
                                          if isinstance(k, tuple) and k[0] == "self_loops")
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "wsb")
    out = m(*args)
    grads = torch.autograd.grad(out.square().sum(), [x] + ([w] if len(args) == 3 else []))
    tiled = g.with_remaining_self_loops()[0] if layer == "GCNConv" else g
    assert built_wsb(tiled)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gcn_propagate_wsb_caches_its_tiles():
    ei = blockdiag(100, 1000, seed=5)
    g = gnnio.Graph(ei, num_nodes=100)
    x = torch.randn(100, 4, dtype=torch.float64)
    a = gnnio.ops.gcn_propagate(g, x, backend="wsb")
    torch.testing.assert_close(a, gnnio.ops.gcn_propagate(g, x, backend="csr"), rtol=1e-12, atol=1e-12)
    keys = [k for k in g._values if isinstance(k, tuple) and k[0] == "gcn_wsb"]
    assert len(keys) == 1  # forward only: no transposed tiles
    assert torch.equal(a, gnnio.ops.gcn_propagate(g, x, backend="wsb"))
    with pytest.raises(ValueError, match="backend"):
        gnnio.ops.gcn_propagate(g, x, backend="bsr")


# ---------------------------------------------------------------------------------------------
# the statistics

def stats_from_structure(g):
    w = g.wsb()
    tiles = w.block_col.numel()
    return tiles, int(torch.unique(w.pos).numel())


@pytest.mark.parametrize("case", adversarial() + [("bipartite", torch.stack(
    [torch.randint(13, (200,)), torch.randint(40, (200,))]), (13, 40)),
    ("blockdiag", blockdiag(500, 8000, seed=6), 500)], ids=lambda c: c[0])
def test_tile_statistics_need_no_structure_and_match_it(case):
    _, ei, n = case
    g = gnnio.Graph(ei, size=n) if isinstance(n, tuple) else gnnio.Graph(ei, num_nodes=n)
    s = g.wsb_stats()
    assert not built_wsb(g)
    tiles, nonzeros = stats_from_structure(g)
    assert (s["num_tiles"], s["nonzeros"], s["stored_entries"]) == (tiles, nonzeros, 256 * tiles)
    assert s["edges_per_tile"] == (g.num_edges / tiles if tiles else 0.0)


def test_the_cuda_rule_traces_under_torch_compile(blockdiag_graph):
    """The CUDA branch (tile statistics, tf32 setting) runs inside compiled models: with the
    Graph's caches filled, dynamo traces it without a graph break."""
    torch._dynamo.reset()
    blockdiag_graph.wsb_stats()

    def f(x):
        wsb16 = planner._spmm_rule(blockdiag_graph, x.size(1), torch.bfloat16).wsb
        wsb32 = planner._spmm_rule(blockdiag_graph, x.size(1), torch.float32).wsb
        return x * (2 * wsb16 + wsb32)

    x = torch.ones(3, 8)
    assert torch.equal(torch.compile(f, fullgraph=True, backend="eager")(x), f(x)) and f(x)[0, 0] == 2


def test_plans_are_memoised_per_graph_and_env_still_wins(powerlaw_graph, monkeypatch):
    # A plan is computed once per Graph and key (the planner study measured the per-call
    # planning as 10-25% of a small graph's op); what the environment forces is read per call.
    g = powerlaw_graph
    first = planner.plan_reduce(g, torch.float32, backward=True)
    assert planner.plan_reduce(g, torch.float32, backward=True) is first
    assert planner.plan_reduce(g, torch.bfloat16, backward=True) is first  # dtype only matters for float64
    assert planner.plan_reduce(g, torch.float64, backward=True) is not first
    fresh = planner.plan_reduce(gnnio.Graph(powerlaw(2000, 32_000, seed=0), num_nodes=2000),
                                torch.float32, backward=True)
    assert fields(fresh).keys() == fields(first).keys() and fresh.reason == first.reason
    for a, b in zip(fresh, first):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    att = planner.plan_attention(g, 128, backward=True)
    assert planner.plan_attention(g, 128, backward=True) is att
    monkeypatch.setenv("GNNIO_REDUCE", "node")
    monkeypatch.setenv("GNNIO_ATTENTION", "node")
    assert planner.plan_reduce(g, torch.float32, backward=True).reason == "node-parallel: forced"
    assert planner.plan_attention(g, 128, backward=True).reason == "node-parallel: forced"
    monkeypatch.delenv("GNNIO_REDUCE")
    assert planner.plan_reduce(g, torch.float32, backward=True) is first


def test_environment_read_per_call_is_os_environ_get(monkeypatch):
    """The planner's cheap read of the forcing variables sees what os.environ.get sees, on every
    call: set, changed, removed, non-ASCII, and with os.environ replaced by a plain dict."""
    name = "GNNIO_TEST_PLANNER_VAR"
    monkeypatch.delenv(name, raising=False)
    assert planner._getenv(name) is None and planner._env(name) is None
    for value in ("csr", "", "wsb", "n\u00f6de"):
        monkeypatch.setenv(name, value)
        assert planner._getenv(name) == os.environ.get(name) == value
    monkeypatch.delenv(name)
    assert planner._getenv(name) is None
    monkeypatch.setattr(os, "environ", {name: "node"})
    assert planner._getenv(name) == "node"
    g = gnnio.Graph(hub(300)[0], num_nodes=hub(300)[1])
    monkeypatch.setitem(os.environ, "GNNIO_REDUCE", "node")
    assert planner.plan_reduce(g, torch.float32).reason == "node-parallel: forced"
    monkeypatch.setitem(os.environ, "GNNIO_SPMM_BACKEND", "wsb")
    assert planner.spmm_backend(g, torch.randn(g.num_src, 4)) == "wsb"


def test_forced_argument_and_auto_skip_the_variable(powerlaw_graph, monkeypatch):
    x = torch.randn(2000, 4)
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "wsb")
    assert planner.spmm_backend(powerlaw_graph, x, "csr") == "csr"
    assert planner.spmm_backend(powerlaw_graph, x, "auto") == "csr"  # the CPU's auto
    assert planner.spmm_backend(powerlaw_graph, x) == "wsb"
    monkeypatch.setenv("GNNIO_SPMM_BACKEND", "bad")
    assert planner.spmm_backend(powerlaw_graph, x, "wsb") == "wsb"
    with pytest.raises(ValueError, match="GNNIO_SPMM_BACKEND"):
        planner.spmm_backend(powerlaw_graph, x)
    with pytest.raises(ValueError, match="backend"):
        planner.spmm_backend(powerlaw_graph, x, "bsr")
