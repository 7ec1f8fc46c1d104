"""Drop-in replacements for torch_geometric.nn layers."""
from gnnio.nn import aggr
from gnnio.nn.conv import GATConv, GCNConv, GraphConv, SAGEConv

__all__ = ["GATConv", "GCNConv", "GraphConv", "SAGEConv", "aggr"]
