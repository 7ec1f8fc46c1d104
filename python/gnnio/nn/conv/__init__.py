from gnnio.nn.conv.gat_conv import GATConv
from gnnio.nn.conv.gatv2_conv import GATv2Conv
from gnnio.nn.conv.gcn_conv import GCNConv
from gnnio.nn.conv.gin_conv import GINConv
from gnnio.nn.conv.graph_conv import GraphConv
from gnnio.nn.conv.sage_conv import SAGEConv
from gnnio.nn.conv.transformer_conv import TransformerConv

__all__ = ["GATConv", "GATv2Conv", "GCNConv", "GINConv", "GraphConv", "SAGEConv", "TransformerConv"]
