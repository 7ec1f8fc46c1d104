"""The weighted block-sparse (WSB) format and its SpMM on the CPU: the format against the dense
adjacency, the op against float64 and against the CSR spmm, forward and backward, on adversarial
shapes. The CUDA kernels' tests are in test_wsb_cuda.py."""
import pytest
import torch

import gnnio
from graphs import adversarial, random_graph, real
from test_spmm import assert_within_summation_bound, masses, reference


def wsb_cases():
    """(name, edge_index, num_src, num_dst): every shape the tiles make awkward."""
    out = [(name, ei, n, n) for name, ei, n in adversarial()]
    ei, n = random_graph(37, 400)
    out.append(("n37", ei, n, n))  # neither size a multiple of 16
    # Block rows 1 and 2 (nodes 16..47) receive nothing: empty tile rows in the middle.
    dst = torch.cat([torch.randint(16, (150,)), torch.randint(48, 70, (150,))])
    out.append(("empty_block_rows", torch.stack([torch.randint(70, (300,)), dst]), 70, 70))
    out.append(("bipartite_13x40", torch.stack([torch.randint(13, (200,)), torch.randint(40, (200,))]), 13, 40))
    out.append(("bipartite_40x13", torch.stack([torch.randint(40, (200,)), torch.randint(13, (200,))]), 40, 13))
    out.append(("no_nodes", torch.empty(2, 0, dtype=torch.long), 0, 0))
    full = torch.cartesian_prod(torch.arange(32), torch.arange(32)).t()
    out.append(("dense_32", full, 32, 32))
    ei, n = real("cora")
    out.append(("cora", ei, n, n))
    return out


CASES = wsb_cases()
IDS = [c[0] for c in CASES]


def graph_of(ei, ns, nd, device="cpu"):
    return gnnio.Graph(ei.to(device), size=(ns, nd))


def dense_adjacency(ei, ns, nd, w=None):
    """A[dst, src] in float64, duplicates summed."""
    a = torch.zeros(nd, ns, dtype=torch.float64)
    w = torch.ones(ei.size(1), dtype=torch.float64) if w is None else w.detach().cpu().double()
    return a.index_put_((ei[1].cpu(), ei[0].cpu()), w, accumulate=True)


def unpack(w, values, num_rows, num_cols):
    """The dense matrix a WSB (structure, values) stands for, and what lies in the padding."""
    rows, cols = -(-num_rows // 16) * 16, -(-num_cols // 16) * 16
    dense = torch.zeros(rows, max(cols, 16), dtype=values.dtype)
    counts = (w.block_rowptr[1:] - w.block_rowptr[:-1]).long()
    block_row = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    for t in range(w.block_col.numel()):
        r, c = int(block_row[t]) * 16, int(w.block_col[t]) * 16
        dense[r:r + 16, c:c + 16] = values[t]
    inside = dense[:num_rows, :num_cols].clone()
    dense[:num_rows, :num_cols] = 0
    return inside, dense.abs().sum().item()


@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_format_holds_the_adjacency_and_its_transpose(name, ei, ns, nd):
    g = graph_of(ei, ns, nd)
    w = torch.rand(ei.size(1), dtype=torch.float64)
    values, values_t = g.wsb_values(torch.float64, edge_weight=w)
    for transpose, vals in ((False, values), (True, values_t)):
        s = g.wsb(transpose)
        rows, cols = (ns, nd) if transpose else (nd, ns)
        assert s.block_rowptr.numel() == -(-rows // 16) + 1 and s.pos.dtype == torch.int64
        assert s.block_rowptr.dtype == s.block_col.dtype == g.index_dtype
        assert vals.shape == (s.block_col.numel(), 16, 16)
        # Block columns increase within each block row, and every stored tile holds an edge.
        for b in range(s.block_rowptr.numel() - 1):
            bc = s.block_col[s.block_rowptr[b]:s.block_rowptr[b + 1]]
            assert (bc[1:] > bc[:-1]).all()
        assert set((s.pos // 256).tolist()) == set(range(s.block_col.numel()))
        inside, padding = unpack(s, vals, rows, cols)
        ref = dense_adjacency(ei, ns, nd, w)
        torch.testing.assert_close(inside, ref.t() if transpose else ref, rtol=1e-14, atol=1e-14)
        assert padding == 0


def test_stats_count_stored_zeros():
    full = torch.cartesian_prod(torch.arange(32), torch.arange(32)).t()
    s = gnnio.Graph(full, num_nodes=32).wsb_stats()
    assert (s["num_tiles"], s["stored_entries"], s["nonzeros"], s["fill_ratio"]) == (4, 1024, 1024, 0.0)
    # Three copies of one edge: one tile, one stored entry of 256.
    s = gnnio.Graph(torch.tensor([[3, 3, 3], [20, 20, 20]]), num_nodes=21).wsb_stats()
    assert (s["num_tiles"], s["nonzeros"], s["fill_ratio"], s["edges_per_tile"]) == (1, 1, 255 / 256, 3.0)
    s = gnnio.Graph(torch.empty(2, 0, dtype=torch.long), num_nodes=5).wsb_stats()
    assert (s["num_tiles"], s["fill_ratio"]) == (0, 0.0)
    ei, n = random_graph(100, 900)
    s = gnnio.Graph(ei, num_nodes=n).wsb_stats()
    tiles = len(set(zip((ei[1] // 16).tolist(), (ei[0] // 16).tolist())))
    pairs = len(set(zip(ei[1].tolist(), ei[0].tolist())))
    assert (s["num_tiles"], s["nonzeros"]) == (tiles, pairs)
    assert s["fill_ratio"] == pytest.approx(1 - pairs / (256 * tiles))


def test_blockdiag_generator_is_block_diagonal_and_seeded():
    ei = gnnio.datasets.blockdiag(1000, 16_000, seed=3)
    assert torch.equal(ei, gnnio.datasets.load("blockdiag-1000-16000", seed=3).edge_index)
    assert (ei[0] // 16 == ei[1] // 16).all() and ei.max() < 1000
    s = gnnio.Graph(ei, num_nodes=1000).wsb_stats()
    assert s["num_tiles"] == 63  # one tile per block row (the last one partial: 1000 = 62 * 16 + 8)
    assert 0.3 < s["fill_ratio"] < 0.45  # ~1/e stored zeros at 16 random edges per node


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_forward_backward_against_float64(name, ei, ns, nd, reduce, weighted):
    g = graph_of(ei, ns, nd)
    x = torch.randn(ns, 7, requires_grad=True)
    w = torch.rand(ei.size(1), requires_grad=True) if weighted else None
    out = gnnio.ops.spmm(g, x, w, reduce, backend="wsb")
    assert out.shape == (nd, 7)
    ref = reference(ei, ns, nd, x.detach(), None if w is None else w.detach(), reduce)
    gout = torch.randn_like(out)
    mass_fwd, mass_bwd = masses(ei, ns, nd, x, gout, w, reduce)
    # The stored zeros add exact zeros: the rounding is that of the row's edges, as in CSR.
    assert_within_summation_bound(out, ref, mass_fwd, torch.bincount(ei[1], minlength=nd)[:, None])
    out.backward(gout)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if weighted else None
    reference(ei, ns, nd, x64, w64, reduce).backward(gout.double())
    assert_within_summation_bound(x.grad, x64.grad, mass_bwd, torch.bincount(ei[0], minlength=ns)[:, None])
    if weighted:
        # d w_e = <dout[dst], x[src]> (x 1/deg for mean), a float64 dot product rounded once.
        torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("name,ei,ns,nd", [c for c in CASES if c[0] in ("n37", "duplicates", "bipartite_13x40", "cora")],
                         ids=["n37", "duplicates", "bipartite_13x40", "cora"])
def test_matches_csr_spmm_in_float64(name, ei, ns, nd, reduce):
    g = graph_of(ei, ns, nd)
    x = torch.randn(ns, 19, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    gout = torch.randn(nd, 19, dtype=torch.float64)
    results = []
    for backend in ("csr", "wsb"):
        out = gnnio.ops.spmm(g, x, w, reduce, backend=backend)
        results.append((out,) + torch.autograd.grad(out, (x, w), gout))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("size", [(21, 21), (13, 40), (40, 13)])
def test_gradcheck_float64(reduce, size):
    ns, nd = size
    ei = torch.stack([torch.randint(ns, (60,)), torch.randint(nd, (60,))])
    ei = torch.cat([ei, ei[:, :5]], 1)  # duplicates: their weights share one tile entry
    g = gnnio.Graph(ei, size=size)
    x = torch.randn(ns, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: gnnio.ops.spmm(g, x, w, reduce, backend="wsb"), (x, w))
    assert torch.autograd.gradgradcheck(lambda x: gnnio.ops.spmm(g, x, w.detach(), reduce, backend="wsb"), (x,))


def test_opcheck():
    ei, n = random_graph(37, 200)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.wsb(), g.wsb(transpose=True)
    values, values_t = g.wsb_values(torch.float32, edge_weight=torch.rand(200))
    x = torch.randn(n, 5, requires_grad=True)
    torch.library.opcheck(torch.ops.gnnio.wsb_spmm.default,
                          (f.block_rowptr, f.block_col, values.detach().requires_grad_(), x, n, n,
                           t.block_rowptr, t.block_col, values_t.detach()))
    torch.library.opcheck(torch.ops.gnnio.wsb_sddmm.default,
                          (f.block_rowptr, f.block_col, torch.randn(n, 5), torch.randn(n, 5)))
    torch.library.opcheck(torch.ops.gnnio.wsb_from_coo.default, (ei[1], ei[0], n, n),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_forward_only_builds_no_transpose():
    ei, n = random_graph(40, 200)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 4, requires_grad=True)
    with torch.no_grad():
        gnnio.ops.spmm(g, x, backend="wsb")
    gnnio.ops.spmm(g, x.detach(), torch.rand(200, requires_grad=True), backend="wsb").sum().backward()
    assert ("wsb", True) not in g._values and not g.has_csr_by_src
    gnnio.ops.spmm(g, x, backend="wsb").sum().backward()
    assert ("wsb", True) in g._values


def test_cached_values_are_reused():
    ei, n = random_graph(40, 200)
    g = gnnio.Graph(ei, num_nodes=n)
    a = g.wsb_values(torch.float32, "mean")
    assert all(u is v for u, v in zip(a, g.wsb_values(torch.float32, "mean")))


def test_non_contiguous_features_and_strided_rows():
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(8, n).t()  # feature stride != 1
    torch.testing.assert_close(gnnio.ops.spmm(g, x, backend="wsb"), gnnio.ops.spmm(g, x.contiguous()))
    wide = torch.randn(n, 12)
    torch.testing.assert_close(gnnio.ops.spmm(g, wide[:, 2:9], backend="wsb"),  # rows 12 apart
                               gnnio.ops.spmm(g, wide[:, 2:9].contiguous()))


def test_nonfinite_input_spreads_through_its_tile():
    # Documented behaviour of dense tiles: node 1 has no edge to node 0, but they share a tile,
    # and 0 x inf = nan. The CSR path never reads x[0] for row 1.
    g = gnnio.Graph(torch.tensor([[0, 1], [0, 0]]), num_nodes=2)
    x = torch.tensor([[float("inf")], [1.0]])
    assert gnnio.ops.spmm(g, x)[1].item() == 0.0
    assert gnnio.ops.spmm(g, x, backend="wsb")[1].isnan().all()


def test_bad_inputs():
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    with pytest.raises(ValueError, match="backend"):
        gnnio.ops.spmm(g, torch.randn(n, 4), backend="bsr")
    # (gnnio.ops widens 16-bit on the CPU, test_cpu_16bit.py; the raw op refuses it)
    f, (values, _) = g.wsb(), g.wsb_values(torch.float32, need_transpose=False)
    e = f.block_rowptr.new_empty(0)
    with pytest.raises(TypeError, match="CPU supports float32 and float64"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values.half(),
                                 torch.randn(n, 4, dtype=torch.float16), n, n, e, e, None)
    with pytest.raises(ValueError, match="rows"):
        gnnio.ops.spmm(g, torch.randn(n + 1, 4), backend="wsb")
    with pytest.raises(ValueError, match="edge_weight"):
        gnnio.ops.spmm(g, torch.randn(n, 4), torch.rand(29), backend="wsb")
    f = g.wsb()
    values, _ = g.wsb_values(torch.float32, need_transpose=False)
    e = f.block_rowptr.new_empty(0)
    with pytest.raises(ValueError, match="columns"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values, torch.randn(n + 2, 3), n, n, e, e, None)
    with pytest.raises(ValueError, match="block_rowptr"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values, torch.randn(n, 3), n + 16, n, e, e, None)
    with pytest.raises(ValueError, match="values must be"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values[:, :8], torch.randn(n, 3), n, n, e, e, None)
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values.double(), torch.randn(n, 3), n, n, e, e, None)
    with pytest.raises(ValueError, match="transposed WSB"):
        torch.ops.gnnio.wsb_spmm(f.block_rowptr, f.block_col, values, torch.randn(n, 3, requires_grad=True),
                                 n, n, e, e, None)
    with pytest.raises(IndexError, match="out of range"):
        torch.ops.gnnio.wsb_from_coo(torch.tensor([0, 10]), torch.tensor([1, 2]), 10, 10)


def test_bench_row_on_the_blockdiag_graph(tmp_path):
    from gnnio.bench import __main__ as bench

    out = tmp_path / "r.json"
    result = bench.main(["--graphs", "blockdiag-2K-32K", "--layers", "spmm(wsb)", "--device", "cpu",
                         "--compare", "none", "--repeat", "1", "--warmup", "0", "--features", "8",
                         "--out", str(out), "--no-plot"])
    rows = {r["impl"]: r for r in result["rows"] if r["layer"] == "spmm(wsb)"}
    assert set(rows) == {"gnnio", "gnnio-csr"}
    assert rows["gnnio"]["num_tiles"] == 125 and 0.3 < rows["gnnio"]["fill_ratio"] < 0.45
    assert rows["gnnio"]["wsb_build_ms"] > 0 and rows["gnnio-csr"]["max_rel_diff_vs_gnnio"] < 1e-5
    assert "WSB fill ratio 0.3" in (tmp_path / "r.md").read_text()
