"""Mini-batches of sampled neighbourhoods: PyG's NeighborLoader when it can sample here, otherwise a
small seeded k-hop neighbour sampler in plain torch with the same batch layout.

NeighborLoader needs pyg-lib or torch-sparse for its sampling op; neither has wheels on PyPI for
torch 2.11 (pyg-lib is not on PyPI at all, torch-sparse only as a 2023 source release), so on a
plain ``pip install torch torch_geometric`` set-up the plain sampler is what runs.

A batch (either sampler) has, as NeighborLoader's:

- ``n_id`` [num_sampled_nodes]: global node ids, the ``batch_size`` seed nodes first, then the
  nodes first reached at hop 1, hop 2, ... (each in order of first appearance);
- ``edge_index`` [2, num_sampled_edges]: local ids into ``n_id``, sampled neighbour (source) ->
  node it was sampled for (destination), so messages flow towards the seeds;
- ``batch_size``: the number of seed nodes; a model's output rows ``[:batch_size]`` are theirs.
"""
from types import SimpleNamespace
from typing import Iterator, List, Optional, Sequence

import torch


class NeighborSampler:
    """Seeded neighbour sampling without replacement (GraphSAGE's): for each hop ``k`` every node
    of the current frontier keeps ``fanouts[k]`` of its in-neighbours (all of them if it has
    fewer, or if the fanout is -1). The sampled edges form a directed subgraph ("directed" mode
    of NeighborLoader: only sampled edges, not the induced subgraph).

    The graph is stored once as a CSC (in-neighbours of each node, contiguous); a hop costs
    O(sum of the frontier's in-degrees) for the random keys it ranks.
    """

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, fanouts: Sequence[int]):
        edge_index = edge_index.cpu()
        src, dst = edge_index[0].long(), edge_index[1].long()
        order = torch.argsort(dst, stable=True)
        self.col = src[order]  # in-neighbour of each CSC slot
        deg = torch.bincount(dst, minlength=num_nodes)
        self.rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
        torch.cumsum(deg, 0, out=self.rowptr[1:])
        self.num_nodes = num_nodes
        self.fanouts = list(fanouts)
        self._local = torch.full((num_nodes,), -1, dtype=torch.long)  # global -> local, scratch

    def sample(self, seeds: torch.Tensor, generator: torch.Generator) -> SimpleNamespace:
        seeds = seeds.cpu().long()
        local = self._local
        n_id = [seeds]
        local[seeds] = torch.arange(seeds.numel())
        num_nodes = seeds.numel()
        frontier = seeds
        rows, cols = [], []
        sampled_nodes, sampled_edges = [seeds.numel()], []
        for fanout in self.fanouts:
            start = self.rowptr[frontier]
            deg = self.rowptr[frontier + 1] - start
            seg = torch.repeat_interleave(torch.arange(frontier.numel()), deg)  # frontier slot
            seg_start = torch.repeat_interleave(deg.cumsum(0) - deg, deg)
            offset = torch.arange(seg.numel()) - seg_start  # position in the neighbour list
            if fanout >= 0 and seg.numel():
                # A random rank within each node's neighbour list: sort by (node, random key);
                # the key is < 1, so the nodes stay in order. Keep the first min(deg, fanout).
                key = torch.rand(seg.numel(), generator=generator, dtype=torch.float64)
                order = torch.argsort(seg.double() + key)
                rank = torch.empty_like(order)
                rank[order] = torch.arange(order.numel())
                chosen = rank - seg_start < fanout
                seg, offset = seg[chosen], offset[chosen]
            nbr = self.col[start[seg] + offset]
            # Nodes reached for the first time get the next local ids, in order of appearance.
            new = nbr[local[nbr] < 0]
            if new.numel():
                uniq, inverse = torch.unique(new, return_inverse=True)
                first = torch.full((uniq.numel(),), new.numel(), dtype=torch.long)
                first.scatter_reduce_(0, inverse, torch.arange(new.numel()), reduce="amin")
                new = uniq[torch.argsort(first)]
                local[new] = torch.arange(num_nodes, num_nodes + new.numel())
                num_nodes += new.numel()
                n_id.append(new)
            rows.append(local[nbr])
            cols.append(local[frontier[seg]])
            sampled_nodes.append(new.numel())
            sampled_edges.append(nbr.numel())
            frontier = new
        n_id = torch.cat(n_id)
        local[n_id] = -1  # reset only what was touched
        edge_index = torch.stack([torch.cat(rows), torch.cat(cols)]) if rows else \
            torch.empty(2, 0, dtype=torch.long)
        return SimpleNamespace(n_id=n_id, edge_index=edge_index, batch_size=seeds.numel(),
                               num_sampled_nodes=sampled_nodes, num_sampled_edges=sampled_edges)


class PlainLoader:
    """Iterates over ``input_nodes`` in (seeded, per-epoch reshuffled) mini-batches of
    ``batch_size`` seed nodes, yielding ``NeighborSampler.sample`` batches."""

    def __init__(self, edge_index, num_nodes, fanouts, input_nodes, batch_size, shuffle=True,
                 seed=0, drop_last=False):
        self.sampler = NeighborSampler(edge_index, num_nodes, fanouts)
        self.input_nodes = input_nodes.cpu().long()
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        n = self.input_nodes.numel()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[SimpleNamespace]:
        nodes = self.input_nodes
        if self.shuffle:
            nodes = nodes[torch.randperm(nodes.numel(), generator=self.generator)]
        for i in range(len(self)):
            yield self.sampler.sample(nodes[i * self.batch_size:(i + 1) * self.batch_size],
                                      self.generator)


def neighbor_loader_usable() -> Optional[str]:
    """None when PyG's NeighborLoader can sample in this environment, else why not."""
    try:
        import torch_geometric.typing as tgt
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
    except ImportError as e:
        return f"torch_geometric is not importable ({e})"
    if not (tgt.WITH_PYG_LIB or tgt.WITH_TORCH_SPARSE):
        return "NeighborLoader needs pyg-lib or torch-sparse, and neither is installed"
    try:  # one tiny batch, to be sure the sampling op works with this torch
        tiny = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
        next(iter(NeighborLoader(tiny, num_neighbors=[1], batch_size=1)))
    except Exception as e:  # noqa: BLE001 (any failure means: use the plain sampler)
        return f"NeighborLoader failed on a tiny graph ({type(e).__name__}: {e})"
    return None


def make_loader(edge_index: torch.Tensor, num_nodes: int, fanouts: List[int],
                input_nodes: torch.Tensor, batch_size: int, shuffle: bool = True, seed: int = 0,
                sampler: str = "auto", drop_last: bool = False):
    """(loader, description). ``sampler``: 'auto' (NeighborLoader if usable, else plain),
    'neighbor_loader' (fail if it is not usable) or 'plain'."""
    if sampler not in ("auto", "neighbor_loader", "plain"):
        raise ValueError(f"sampler must be auto, neighbor_loader or plain, got {sampler!r}")
    why_not = None if sampler == "plain" else neighbor_loader_usable()
    if sampler == "neighbor_loader" and why_not:
        raise RuntimeError(f"--sampler neighbor_loader: {why_not}")
    if sampler != "plain" and why_not is None:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
        torch.manual_seed(seed)
        loader = NeighborLoader(Data(edge_index=edge_index.cpu(), num_nodes=num_nodes),
                                num_neighbors=list(fanouts), input_nodes=input_nodes.cpu(),
                                batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
        return loader, f"torch_geometric.loader.NeighborLoader (fanouts {list(fanouts)})"
    note = f"; NeighborLoader not used: {why_not}" if why_not else ""
    loader = PlainLoader(edge_index, num_nodes, fanouts, input_nodes, batch_size, shuffle, seed,
                         drop_last)
    return loader, f"examples/sampling.py plain-torch NeighborSampler (fanouts {list(fanouts)}){note}"
