import pytest
import torch

import gnnio
from graphs import random_graph


def brute_force_csr(row, col, num_rows):
    rowptr, cols, perm = [0], [], []
    for r in range(num_rows):
        ids = [e for e in range(row.numel()) if row[e] == r]
        perm += ids
        cols += [int(col[e]) for e in ids]
        rowptr.append(len(perm))
    return rowptr, cols, perm


@pytest.mark.parametrize("num_src,num_dst,num_edges", [(30, 30, 200), (17, 41, 150), (40, 3, 90), (5, 5, 0)])
def test_csr_both_ways_match_brute_force(device, num_src, num_dst, num_edges):
    src = torch.randint(num_src, (num_edges,))
    dst = torch.randint(num_dst, (num_edges,))
    g = gnnio.Graph(torch.stack([src, dst]).to(device), size=(num_src, num_dst))
    for csr, row, col, n in [(g.csr_by_dst, dst, src, num_dst), (g.csr_by_src, src, dst, num_src)]:
        rowptr, cols, perm = brute_force_csr(row, col, n)
        assert csr.rowptr.cpu().tolist() == rowptr
        assert csr.col.cpu().tolist() == cols
        assert csr.perm.cpu().tolist() == perm
    assert g.in_degree().cpu().tolist() == torch.bincount(dst, minlength=num_dst).tolist()
    assert g.out_degree().cpu().tolist() == torch.bincount(src, minlength=num_src).tolist()


def test_transpose_is_built_lazily():
    g = gnnio.Graph(torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    assert not g.has_csr_by_src
    g.csr_by_src
    assert g.has_csr_by_src


def test_index_dtype_and_inferred_size():
    g = gnnio.Graph(torch.tensor([[0, 4], [1, 2]], dtype=torch.int32))
    assert g.num_src == g.num_dst == 5
    assert g.index_dtype == torch.int32


def test_stats_on_a_hub():
    ei = torch.stack([torch.arange(100), torch.zeros(100, dtype=torch.long)])
    s = gnnio.Graph(ei, num_nodes=100).stats()
    assert s["max_in_degree"] == 100 and s["isolated_dst"] == 99
    assert s["mean_in_degree"] == pytest.approx(1.0) and s["in_degree_skew"] == pytest.approx(100.0)


def test_empty_graph():
    g = gnnio.Graph(torch.empty(2, 0, dtype=torch.long), num_nodes=0)
    assert g.csr_by_dst.rowptr.tolist() == [0]
    assert g.stats()["num_edges"] == 0


def test_pyg_edge_index_caches_are_reused(device):
    from torch_geometric import EdgeIndex

    ei, n = random_graph(25, 120)
    pyg = EdgeIndex(ei.to(device), sparse_size=(n, n)).sort_by("col").values
    assert gnnio.Graph(EdgeIndex(ei.to(device))).num_dst <= n  # unsorted: gnnio sorts itself
    g = gnnio.Graph(pyg)
    ei = pyg.as_tensor().cpu()
    ref = gnnio.Graph(ei.to(device), num_nodes=n)
    assert g.num_src == g.num_dst == n
    assert torch.equal(g.csr_by_dst.rowptr, ref.csr_by_dst.rowptr)
    # Within a row PyG's sort may order duplicates differently; the multiset of (col, edge) is the same.
    for r in range(n):
        a = slice(int(ref.csr_by_dst.rowptr[r]), int(ref.csr_by_dst.rowptr[r + 1]))
        assert sorted(g.csr_by_dst.perm[a].tolist()) == sorted(ref.csr_by_dst.perm[a].tolist())
    assert torch.equal(ei.to(device)[0][g.csr_by_dst.perm.long()], g.csr_by_dst.col.long())


@pytest.mark.parametrize("known", [(10, None), (None, 9), (None, None)])
def test_pyg_edge_index_partly_known_size(known):
    """A side the EdgeIndex knows is its node count; an unknown side comes from its own ids
    (EdgeIndex.get_sparse_size's rule), not from the largest id of either side."""
    from torch_geometric import EdgeIndex

    ei = torch.tensor([[0, 1, 2, 2], [1, 5, 0, 3]])
    g = gnnio.Graph(EdgeIndex(ei, sparse_size=known))
    expected = tuple(EdgeIndex(ei, sparse_size=known).get_sparse_size()) if known != (None, None) \
        else (6, 6)  # no size at all: one node count from the largest id (num_nodes' rule)
    assert (g.num_src, g.num_dst) == expected
    assert expected[0] != expected[1] or known == (None, None)


@pytest.mark.parametrize("bad,exc,fragment", [
    (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), ValueError, "integer dtype"),
    (torch.tensor([0, 1, 2]), ValueError, "shape [2, num_edges]"),
    (torch.zeros(3, 4, dtype=torch.long), ValueError, "shape [2, num_edges]"),
    ([[0, 1], [1, 0]], TypeError, "torch.Tensor"),
])
def test_malformed_edge_index(bad, exc, fragment):
    with pytest.raises(exc, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        gnnio.Graph(bad, num_nodes=3)


@pytest.mark.parametrize("ei,which", [
    (torch.tensor([[0, 1], [1, 3]]), "destination"),
    (torch.tensor([[0, 3], [1, 2]]), "source"),
    (torch.tensor([[0, -1], [1, 2]]), "source"),
])
def test_out_of_range_ids_raise_index_error(device, ei, which):
    with pytest.raises(IndexError, match=which):
        gnnio.Graph(ei.to(device), num_nodes=3)


def test_bad_sizes():
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match=">= 0"):
        gnnio.Graph(ei, num_nodes=-1)
    with pytest.raises(ValueError, match="not both"):
        gnnio.Graph(ei, num_nodes=2, size=(2, 2))


@pytest.mark.cuda
def test_cuda_build_is_bit_identical_to_cpu():
    ei, n = random_graph(5000, 80_000)
    ei = torch.cat([ei, torch.stack([torch.arange(3000), torch.zeros(3000, dtype=torch.long)])], 1)
    cpu, gpu = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    for a, b in [(cpu.csr_by_dst, gpu.csr_by_dst), (cpu.csr_by_src, gpu.csr_by_src)]:
        for x, y in zip(a, b):
            assert torch.equal(x, y.cpu())
