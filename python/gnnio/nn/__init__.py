"""Drop-in replacements for torch_geometric.nn layers."""
from gnnio.nn import aggr
from gnnio.nn.conv import GATConv, GATv2Conv, GCNConv, GINConv, GraphConv, SAGEConv, TransformerConv
from gnnio.nn.from_pyg import from_pyg

__all__ = ["GATConv", "GATv2Conv", "GCNConv", "GINConv", "GraphConv", "SAGEConv", "TransformerConv", "aggr", "from_pyg"]
