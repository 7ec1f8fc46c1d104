"""Graphs for tests and benchmarks: Matrix Market files (bundled or from a folder) and the
seeded generators of the standard benchmark graphs (DESIGN.md: powerlaw / uniform / grid) and of
a locally dense one for the block-sparse (WSB) kernels (blockdiag).

Generated graphs are drawn on the CPU with a seeded torch.Generator, so a name and seed give the
same edges on every machine; move them to the GPU afterwards.
"""
import gzip
import os
import re
from typing import NamedTuple, Optional, Tuple

import torch

from gnnio._ops import ops

_BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class GraphData(NamedTuple):
    name: str
    edge_index: torch.Tensor  # [2, E] int64, row 0 = source, row 1 = destination
    num_nodes: int


class MtxFile(NamedTuple):
    row: torch.Tensor  # 0-based, file order
    col: torch.Tensor
    value: torch.Tensor  # float64, empty for pattern files
    num_rows: int
    num_cols: int
    symmetric: bool


def read_mtx(path: str) -> MtxFile:
    """Reads a ``.mtx`` or ``.mtx.gz`` file (parsed in C++; errors name the offending line)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # missing file, or gzip that is not gzip
        raise OSError(f"cannot read Matrix Market file {path!r}: {e}") from None
    text = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    try:
        return MtxFile(*ops.parse_mtx(text))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def mtx_to_edge_index(m: MtxFile) -> torch.Tensor:
    """Symmetric files store each undirected edge once: both directions are emitted (diagonal
    entries once). General files map row -> source, col -> destination."""
    if m.symmetric:
        off = m.row != m.col
        src = torch.cat([m.row, m.col[off]])
        dst = torch.cat([m.col, m.row[off]])
        return torch.stack([src, dst])
    return torch.stack([m.row, m.col])


def graph_dirs():
    """Where named graphs are looked up: the bundled folder, $GNNIO_GRAPH_DIR, and the shared
    collection next to the repository (../shared/data/graphs)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dirs = [_BUNDLED]
    if os.environ.get("GNNIO_GRAPH_DIR"):
        dirs.append(os.environ["GNNIO_GRAPH_DIR"])
    dirs += [os.path.join(repo, ".data", "graphs"), os.path.join(repo, "..", "shared", "data", "graphs")]
    return dirs


def available_real_graphs():
    names = set()
    for d in graph_dirs():
        if os.path.isdir(d):
            names.update(f[: -len(".mtx.gz")] for f in os.listdir(d) if f.endswith(".mtx.gz"))
    return sorted(names)


def load(name: str, seed: int = 0) -> GraphData:
    """A real graph by name (``cora``, ``pubmed``, ...; a path to a .mtx[.gz] also works) or a
    generated one: ``powerlaw-1M-16M``, ``uniform-1M-16M``, ``blockdiag-1M-16M``,
    ``grid-1000x1000`` and scaled variants such as ``powerlaw-10K-160K``."""
    m = re.fullmatch(r"(powerlaw|uniform|blockdiag)-(\d+[KMG]?)-(\d+[KMG]?)", name)
    if m:
        n, e = _count(m.group(2)), _count(m.group(3))
        gen = {"powerlaw": powerlaw, "uniform": uniform, "blockdiag": blockdiag}[m.group(1)]
        return GraphData(name, gen(n, e, seed=seed), n)
    m = re.fullmatch(r"grid-(\d+)x(\d+)", name)
    if m:
        h, w = int(m.group(1)), int(m.group(2))
        return GraphData(name, grid(h, w), h * w)
    path = name if os.path.exists(name) else _find(name)
    f = read_mtx(path)
    if f.num_rows != f.num_cols:
        raise ValueError(f"{path}: a graph needs a square matrix, got {f.num_rows} x {f.num_cols}")
    base = os.path.basename(path).split(".mtx")[0]
    return GraphData(base, mtx_to_edge_index(f), f.num_rows)


def _find(name: str) -> str:
    for d in graph_dirs():
        p = os.path.join(d, name + ".mtx.gz")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"no graph named {name!r} in {graph_dirs()}")


def _count(s: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(s[:-1]) * scale[s[-1]] if s[-1] in scale else int(s)


def powerlaw(num_nodes: int, num_edges: int, exponent: float = 1.1, seed: int = 0) -> torch.Tensor:
    """Destination of each edge drawn with P(k) ∝ (k+1)^-exponent, node ids then permuted at
    random; source uniform (DESIGN.md's ``powerlaw-1M-16M`` with the defaults)."""
    g = torch.Generator().manual_seed(seed)
    cdf = powerlaw_cdf(num_nodes, exponent)
    u = torch.rand(num_edges, generator=g, dtype=torch.float64)
    rank = torch.searchsorted(cdf, u).clamp_(max=num_nodes - 1)
    ids = torch.randperm(num_nodes, generator=g)
    dst = ids[rank]
    src = torch.randint(num_nodes, (num_edges,), generator=g)
    return torch.stack([src, dst])


def powerlaw_cdf(num_nodes: int, exponent: float = 1.1, device=None) -> torch.Tensor:
    """float64 [num_nodes]: P(rank <= k) of powerlaw's destination ranks (the generator draws a
    rank by searchsorted of a uniform number in it; gnnio.bench.scale does the same on a GPU)."""
    weight = torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device).pow_(-exponent)
    cdf = weight.cumsum_(0)
    cdf /= cdf[-1].clone()
    return cdf


def uniform(num_nodes: int, num_edges: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(num_nodes, (2, num_edges), generator=g)


def blockdiag(num_nodes: int, num_edges: int, block: int = 16, seed: int = 0) -> torch.Tensor:
    """A locally dense graph: nodes in aligned groups of ``block`` (0..15, 16..31, ...), each
    edge's destination uniform and its source uniform within the destination's group (a
    stochastic block model with no edges between groups). Its adjacency is block-diagonal, so
    16 x 16 tiles hold it with fill ratio ~1/e ~ 0.37 at 16 edges per node (random
    duplicates) and one tile per block row: the case the tensor-core WSB SpMM is for."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(num_nodes, (num_edges,), generator=g)
    first = dst - dst % block
    size = (num_nodes - first).clamp(max=block)  # the last group may be partial
    src = first + (torch.rand(num_edges, generator=g, dtype=torch.float64) * size).long()
    return torch.stack([src, dst])


def grid(height: int, width: int) -> torch.Tensor:
    """4-neighbour grid, every edge in both directions."""
    idx = torch.arange(height * width).view(height, width)
    right = torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)])
    down = torch.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)])
    one_way = torch.cat([right, down], 1)
    return torch.cat([one_way, one_way.flip(0)], 1)
