"""Heterogeneous graphs: gnnio layers inside PyG's HeteroConv (one layer per edge type,
bipartite and lazy input sizes, as PyG's hetero examples write them), against the same model of
PyG layers with the same weights, forward and backward (layer_pairs.check_against_pyg), with
edge_index dicts and with sparse adj_t dicts. (to_hetero: test_message_passing.py.)"""
import pytest
import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.transforms as T

import gnnio.nn
from graphs import hetero_papers
from layer_pairs import check_against_pyg

EDGE_TYPES = [("author", "writes", "paper"), ("paper", "cites", "paper"),
              ("paper", "rev_writes", "author")]


def _model(lib):
    return pyg_nn.HeteroConv({
        EDGE_TYPES[0]: lib.SAGEConv((-1, -1), 16),
        EDGE_TYPES[1]: lib.GATConv(-1, 8, heads=2),
        EDGE_TYPES[2]: lib.TransformerConv((-1, -1), 16, heads=2, concat=False),
    }, aggr="sum")


@pytest.mark.parametrize("adjacency", ["edge_index", "adj_t"])
def test_hetero_conv_of_gnnio_layers_matches_pyg(device, adjacency):
    data = hetero_papers(device)
    if adjacency == "adj_t":
        data = T.ToSparseTensor(layout=torch.sparse_csr)(data)
    graphs = data.edge_index_dict if adjacency == "edge_index" else data.adj_t_dict
    pyg, ours = _model(pyg_nn).to(device), _model(gnnio.nn).to(device)
    pyg(data.x_dict, graphs)  # materialise the lazy linears
    ours(data.x_dict, graphs)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    ours.load_state_dict(pyg.state_dict())
    graphs64 = graphs if adjacency == "edge_index" else {
        k: torch.sparse_csr_tensor(a.crow_indices(), a.col_indices(), a.values().double(), a.shape)
        for k, a in graphs.items()}

    def run(graph_dict):
        def call(model, t):
            out = model({"paper": t["paper"], "author": t["author"]}, graph_dict)
            return torch.cat([out["paper"], out["author"]])
        return call
    check_against_pyg(pyg, ours, run(graphs), dict(data.x_dict), exact_call=run(graphs64))
