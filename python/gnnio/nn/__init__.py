"""Drop-in replacements for torch_geometric.nn layers."""
from gnnio.nn import aggr
from gnnio.nn.conv import GCNConv, GraphConv, SAGEConv

__all__ = ["GCNConv", "GraphConv", "SAGEConv", "aggr"]
