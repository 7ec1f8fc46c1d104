"""Graphs the tests run on: bundled real graphs and adversarial shapes, drawn fresh each run."""
import torch

from gnnio import datasets


def real(name):
    d = datasets.load(name)
    return d.edge_index, d.num_nodes


def random_graph(num_nodes, num_edges, generator=None):
    return torch.randint(num_nodes, (2, num_edges), generator=generator), num_nodes


def adversarial():
    """(name, edge_index, num_nodes) cases from the bad-input checklist."""
    cases = []
    cases.append(("no_edges", torch.empty(2, 0, dtype=torch.long), 5))
    cases.append(("isolated", torch.tensor([[0, 1, 2], [1, 2, 1]]), 7))  # nodes 0, 3..6 receive nothing
    dup = torch.tensor([[0, 0, 0, 1, 2, 2], [1, 1, 1, 2, 0, 0]])
    cases.append(("duplicates", dup, 3))
    loops = torch.tensor([[0, 1, 1, 2, 2, 3], [0, 1, 2, 2, 3, 0]])
    cases.append(("self_loops", loops, 4))
    ei, n = random_graph(50, 300)
    cases.append(("unsorted", ei[:, torch.randperm(300)], n))
    return cases


def hub(num_neighbours=100_000, extra_nodes=20):
    """One destination with num_neighbours in-edges (duplicates allowed) plus a sprinkle of edges."""
    n = num_neighbours // 10 + extra_nodes
    src = torch.randint(n, (num_neighbours,))
    dst = torch.zeros(num_neighbours, dtype=torch.long)
    other = torch.randint(n, (2, 200))
    return torch.cat([torch.stack([src, dst]), other], 1), n


def hetero_papers(device="cpu"):
    """A small heterogeneous graph: authors write papers, papers cite papers, and the reverse of
    writing; feature sizes differ per node type (8 and 6)."""
    from torch_geometric.data import HeteroData

    d = HeteroData()
    d["paper"].x = torch.randn(30, 8)
    d["author"].x = torch.randn(20, 6)
    writes = torch.stack([torch.randint(0, 20, (80,)), torch.randint(0, 30, (80,))])
    d["author", "writes", "paper"].edge_index = writes
    d["paper", "cites", "paper"].edge_index = torch.randint(0, 30, (2, 90))
    d["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return d.to(device)
