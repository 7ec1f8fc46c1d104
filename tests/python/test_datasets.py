"""gnnio.datasets: the bundled graphs, the Matrix Market reader and the seeded generators."""
import gzip
import re

import pytest
import torch

from gnnio import datasets


def write(tmp_path, name, text, compress=False):
    path = tmp_path / name
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------------
# bundled graphs (statistics from python/gnnio/data/README.md)

def test_cora():
    g = datasets.load("cora")
    assert g.num_nodes == 2708
    assert g.edge_index.shape == (2, 10_556)
    assert g.edge_index.dtype == torch.long
    assert int(g.edge_index.min()) >= 0 and int(g.edge_index.max()) < g.num_nodes
    # undirected, stored once in the file: every edge comes with its reverse
    fwd = set(map(tuple, g.edge_index.t().tolist()))
    assert all((d, s) in fwd for s, d in fwd)


def test_as20000102():
    g = datasets.load("as20000102")
    assert g.num_nodes == 6474
    assert g.edge_index.shape == (2, 25_144)
    in_degree = torch.bincount(g.edge_index[1], minlength=g.num_nodes)
    assert int(in_degree.max()) == 1458
    assert g.name == "as20000102"


def test_bundled_names_are_listed():
    names = datasets.available_real_graphs()
    assert "cora" in names and "as20000102" in names


def test_load_by_path(tmp_path):
    path = write(tmp_path, "tiny.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n3 1\n")
    g = datasets.load(path)
    assert g.name == "tiny" and g.num_nodes == 3
    assert g.edge_index.tolist() == [[0, 2], [1, 0]]


def test_unknown_graph_name():
    with pytest.raises(FileNotFoundError, match="no-such-graph"):
        datasets.load("no-such-graph")


def test_load_rejects_non_square(tmp_path):
    path = write(tmp_path, "rect.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 4 1\n1 4\n")
    with pytest.raises(ValueError, match="square"):
        datasets.load(path)


# ---------------------------------------------------------------------------------------------
# read_mtx

def test_read_general_real_file(tmp_path):
    text = ("%%MatrixMarket matrix coordinate real general\n% a comment\n\n4 5 3\n"
            "1 2 0.5\n4 5 -2e3\n% in between\n2 2 7\n")
    m = datasets.read_mtx(write(tmp_path, "g.mtx", text))
    assert (m.num_rows, m.num_cols, m.symmetric) == (4, 5, False)
    assert m.row.tolist() == [0, 3, 1] and m.col.tolist() == [1, 4, 1]
    assert m.value.dtype == torch.float64 and m.value.tolist() == [0.5, -2000.0, 7.0]
    ei = datasets.mtx_to_edge_index(m)
    assert ei.tolist() == [[0, 3, 1], [1, 4, 1]]  # general: row -> source, col -> destination


def test_read_gzip_and_crlf(tmp_path):
    text = "%%MatrixMarket matrix coordinate pattern general\r\n2 2 1\r\n2 1\r\n"
    m = datasets.read_mtx(write(tmp_path, "g.mtx.gz", text, compress=True))
    assert m.row.tolist() == [1] and m.col.tolist() == [0] and m.value.numel() == 0


def test_symmetric_file_emits_both_directions(tmp_path):
    text = "%%MatrixMarket matrix coordinate pattern symmetric\n4 4 4\n2 1\n3 1\n3 3\n4 2\n"
    m = datasets.read_mtx(write(tmp_path, "s.mtx", text))
    assert m.symmetric
    ei = datasets.mtx_to_edge_index(m)
    edges = sorted(map(tuple, ei.t().tolist()))
    # each off-diagonal entry in both directions, the diagonal entry once
    assert edges == sorted([(1, 0), (0, 1), (2, 0), (0, 2), (2, 2), (3, 1), (1, 3)])
    assert ei.size(1) == 2 * 4 - 1


BAD_FILES = [
    # (name, text, line the message must name, what else it must say)
    ("banner", "%%MatrixMarkt matrix coordinate pattern general\n2 2 1\n1 1\n", 1, "banner"),
    ("array", "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", 1, "coordinate"),
    ("field", "%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1 0\n", 1, "field"),
    ("symmetry", "%%MatrixMarket matrix coordinate pattern hermitian\n2 2 1\n1 1\n", 1, "symmetry"),
    ("size_line", "%%MatrixMarket matrix coordinate pattern general\n% c\n2 x 1\n1 1\n", 3, "rows cols"),
    ("outside_row", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n4 1\n", 4, "outside"),
    ("outside_col", "%%MatrixMarket matrix coordinate pattern general\n% c\n3 3 2\n1 2\n1 4\n", 5, "outside"),
    ("zero_id", "%%MatrixMarket matrix coordinate pattern general\n3 3 1\n0 1\n", 3, "outside"),
    ("bad_entry", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 b\n", 4, "row col"),
    ("missing_value", "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 1.0\n2 3\n", 4, "value"),
    ("too_many", "%%MatrixMarket matrix coordinate pattern general\n3 3 1\n1 2\n2 3\n", 4, "more entries"),
]


@pytest.mark.parametrize("name,text,line,what", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_malformed_files_name_the_line(tmp_path, name, text, line, what):
    path = write(tmp_path, name + ".mtx", text)
    with pytest.raises(ValueError) as info:
        datasets.read_mtx(path)
    msg = str(info.value)
    assert re.search(rf"\bline {line}\b", msg), msg
    assert what in msg, msg
    assert path in msg  # the Python wrapper names the file


def test_fewer_entries_than_declared(tmp_path):
    text = ("%%MatrixMarket matrix coordinate pattern general\n"
            + "% padding so that the declared count fits the file size\n" * 3
            + "3 3 5\n1 2\n2 3\n3 1\n")
    with pytest.raises(ValueError, match="declares 5 entries but the file holds 3"):
        datasets.read_mtx(write(tmp_path, "few.mtx", text))


def test_fewer_entries_than_declared_names_a_line(tmp_path):
    text = ("%%MatrixMarket matrix coordinate pattern general\n"
            + "% padding so that the declared count fits the file size\n" * 3
            + "3 3 5\n1 2\n2 3\n3 1\n")
    with pytest.raises(ValueError) as info:
        datasets.read_mtx(write(tmp_path, "few.mtx", text))
    assert re.search(r"\bline \d+", str(info.value)), str(info.value)


def test_declared_count_larger_than_the_file(tmp_path):
    text = "%%MatrixMarket matrix coordinate pattern general\n3 3 1000000000000\n1 2\n"
    with pytest.raises(ValueError, match="more than the file can hold"):
        datasets.read_mtx(write(tmp_path, "huge.mtx", text))


@pytest.mark.parametrize("text,what", [
    ("", "empty"), ("%%MatrixMarket matrix coordinate pattern general\n% c\n", "size line"),
], ids=["empty", "no_size_line"])
def test_empty_or_headless_file(tmp_path, text, what):
    with pytest.raises(ValueError, match=what):
        datasets.read_mtx(write(tmp_path, "e.mtx", text))


def test_missing_file(tmp_path):
    with pytest.raises(OSError):
        datasets.read_mtx(str(tmp_path / "missing.mtx"))
    with pytest.raises(OSError):
        datasets.read_mtx(str(tmp_path / "missing.mtx.gz"))


def test_not_gzip_named_gz(tmp_path):
    path = write(tmp_path, "plain.mtx.gz", "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1\n")
    with pytest.raises(OSError, match="plain.mtx.gz"):
        datasets.read_mtx(path)


def test_truncated_gzip(tmp_path):
    path = tmp_path / "cut.mtx.gz"
    data = gzip.compress(b"%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 1\n" * 50)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError):
        datasets.read_mtx(str(path))


# ---------------------------------------------------------------------------------------------
# generators

@pytest.mark.parametrize("gen", ["powerlaw", "uniform"])
def test_generators_are_seeded(gen):
    fn = getattr(datasets, gen)
    a = fn(1000, 5000, seed=3)
    b = fn(1000, 5000, seed=3)
    c = fn(1000, 5000, seed=4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    for ei in (a, c):
        assert ei.shape == (2, 5000) and ei.dtype == torch.long
        assert int(ei.min()) >= 0 and int(ei.max()) < 1000


def test_powerlaw_is_skewed_towards_hubs():
    ei = datasets.powerlaw(1000, 20_000, seed=0)
    in_deg = torch.bincount(ei[1], minlength=1000)
    out_deg = torch.bincount(ei[0], minlength=1000)
    # destinations follow the power law, sources are uniform: the largest in-degree dwarfs the
    # largest out-degree
    assert int(in_deg.max()) > 4 * int(out_deg.max())


def test_grid():
    ei = datasets.grid(3, 4)
    assert ei.shape == (2, 2 * (3 * 3 + 2 * 4))  # 34
    assert int(ei.min()) >= 0 and int(ei.max()) < 12
    edges = set(map(tuple, ei.t().tolist()))
    assert len(edges) == 34  # no duplicates
    assert all((d, s) in edges for s, d in edges)
    # 4-neighbourhood: an edge joins horizontal or vertical neighbours
    for s, d in edges:
        (rs, cs), (rd, cd) = divmod(s, 4), divmod(d, 4)
        assert abs(rs - rd) + abs(cs - cd) == 1
    assert torch.equal(ei, datasets.grid(3, 4))


@pytest.mark.parametrize("name,num_nodes,num_edges", [
    ("powerlaw-10K-160K", 10_000, 160_000), ("uniform-2K-7K", 2_000, 7_000),
    ("grid-5x7", 35, 2 * (5 * 6 + 4 * 7)),
])
def test_load_generated(name, num_nodes, num_edges):
    g = datasets.load(name)
    assert g.name == name and g.num_nodes == num_nodes
    assert g.edge_index.shape == (2, num_edges)
    assert int(g.edge_index.min()) >= 0 and int(g.edge_index.max()) < num_nodes
    assert torch.equal(datasets.load(name).edge_index, g.edge_index)  # seed 0 both times
    if not name.startswith("grid"):
        assert not torch.equal(datasets.load(name, seed=1).edge_index, g.edge_index)
