"""The layers and ops the benchmark compares, each as (gnnio factory, reference factory).

Shapes follow DESIGN.md: 128 -> 128 for these families, no self loops added so both sides see
one graph, GCNConv with cached=True on the reference side (PyG's fastest setting)."""
from typing import Callable, Dict, NamedTuple, Optional

import torch

import gnnio


class LayerCase(NamedTuple):
    make_gnnio: Callable[[int], torch.nn.Module]
    make_pyg: Optional[Callable[[int], torch.nn.Module]]


def _pyg():
    import torch_geometric.nn as pyg_nn

    return pyg_nn


class WithEdgeWeight(torch.nn.Module):
    """``layer(x, edge_index, w)`` with w drawn once per edge count from a fixed seed, uniform in
    [0.5, 1.5): both sides of a row see the same weights (the same draw on the same device).
    The weights take no gradient; the layer's parameters keep their keys under ``layer.``."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer
        self._weight: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        num_edges = edge_index.size(-1)
        w = self._weight
        if w is None or w.numel() != num_edges or w.device != x.device or w.dtype != x.dtype:
            generator = torch.Generator(device=x.device).manual_seed(0)
            w = torch.rand(num_edges, generator=generator, device=x.device) + 0.5
            self._weight = w = w.to(x.dtype)
        return self.layer(x, edge_index, w)


LAYERS: Dict[str, LayerCase] = {
    "GCNConv": LayerCase(lambda f: gnnio.nn.GCNConv(f, f, cached=True, add_self_loops=False),
                         lambda f: _pyg().GCNConv(f, f, cached=True, add_self_loops=False)),
    "GraphConv(add)": LayerCase(lambda f: gnnio.nn.GraphConv(f, f, aggr="add"),
                                lambda f: _pyg().GraphConv(f, f, aggr="add")),
    "GraphConv(mean)": LayerCase(lambda f: gnnio.nn.GraphConv(f, f, aggr="mean"),
                                 lambda f: _pyg().GraphConv(f, f, aggr="mean")),
    "SAGEConv(mean)": LayerCase(lambda f: gnnio.nn.SAGEConv(f, f, aggr="mean"),
                                lambda f: _pyg().SAGEConv(f, f, aggr="mean")),
    "SAGEConv(max)": LayerCase(lambda f: gnnio.nn.SAGEConv(f, f, aggr="max"),
                               lambda f: _pyg().SAGEConv(f, f, aggr="max")),
    "SAGEConv(min)": LayerCase(lambda f: gnnio.nn.SAGEConv(f, f, aggr="min"),
                               lambda f: _pyg().SAGEConv(f, f, aggr="min")),
    "GraphConv(max)": LayerCase(lambda f: gnnio.nn.GraphConv(f, f, aggr="max"),
                                lambda f: _pyg().GraphConv(f, f, aggr="max")),
    # The max over the messages w_ji x_j (edge_weight): PyG multiplies E x F messages first.
    "GraphConv(max)+weight": LayerCase(lambda f: WithEdgeWeight(gnnio.nn.GraphConv(f, f, aggr="max")),
                                  lambda f: WithEdgeWeight(_pyg().GraphConv(f, f, aggr="max"))),
    # nn: one Linear, so the row is the aggregation's (the sum by SpMM against PyG's scatter)
    # plus the same dense layer on both sides.
    "GINConv": LayerCase(lambda f: gnnio.nn.GINConv(torch.nn.Linear(f, f), train_eps=True),
                         lambda f: _pyg().GINConv(torch.nn.Linear(f, f), train_eps=True)),
    # DESIGN.md's attention shape: 128 -> 4 heads x 32, PyG's default self loops on both sides.
    "GATConv": LayerCase(lambda f: gnnio.nn.GATConv(f, f // 4, heads=4),
                         lambda f: _pyg().GATConv(f, f // 4, heads=4)),
    "GATv2Conv": LayerCase(lambda f: gnnio.nn.GATv2Conv(f, f // 4, heads=4),
                           lambda f: _pyg().GATv2Conv(f, f // 4, heads=4)),
    "TransformerConv": LayerCase(lambda f: gnnio.nn.TransformerConv(f, f // 4, heads=4),
                                 lambda f: _pyg().TransformerConv(f, f // 4, heads=4)),
}

# The SpMM family's four rows, one reduction layer and one layer per attention kind (gat, gatv2,
# dot): the demo (scripts/demo.sh) shows all three kernel families.
DEFAULT_LAYERS = ["spmm", "GCNConv", "GraphConv(add)", "SAGEConv(mean)", "SAGEConv(max)", "GATConv",
                  "GATv2Conv", "TransformerConv"]


def attention_operands(kind: str, n: int, heads: int, channels: int, rand):
    """The inputs of the benchmark's ``graph_attention(kind)`` rows on n nodes, drawn with
    ``rand(*shape)`` in a fixed order, each needing a gradient: (value, keyword operands, rows
    each edge gathers). GAT takes random per-node scores; GATv2's key is its value (one row per
    edge); dot has its own key (two); 'shared' is dot with one key and value row per source
    that every head reads ([n, 1, channels]; TransformerConv's reassociated form: one row of
    1/heads the bytes per edge)."""
    if kind == "shared":
        value = rand(n, 1, channels).requires_grad_()
        return value, dict(key=value, query=rand(n, heads, channels).requires_grad_(),
                           scale=channels ** -0.5), 1.0 / heads
    value = rand(n, heads, channels).requires_grad_()
    if kind == "gat":
        return value, dict(src_score=rand(n, heads).requires_grad_(),
                           dst_score=rand(n, heads).requires_grad_()), 1
    if kind == "gatv2":
        return value, dict(key=value, query=rand(n, heads, channels).requires_grad_(),
                           att=rand(heads, channels).requires_grad_()), 1
    return value, dict(key=rand(n, heads, channels).requires_grad_(),
                       query=rand(n, heads, channels).requires_grad_(), scale=channels ** -0.5), 2
