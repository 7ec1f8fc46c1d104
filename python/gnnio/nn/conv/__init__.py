from gnnio.nn.conv.gat_conv import GATConv
from gnnio.nn.conv.gcn_conv import GCNConv
from gnnio.nn.conv.graph_conv import GraphConv
from gnnio.nn.conv.sage_conv import SAGEConv

__all__ = ["GATConv", "GCNConv", "GraphConv", "SAGEConv"]
