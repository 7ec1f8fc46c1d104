"""An existing PyG model moved onto gnnio's kernels with one line: ``gnnio.nn.from_pyg(model)``.

Builds one of PyG's own models (``torch_geometric.nn.models``: GCN, GraphSAGE, GIN, GAT, GATv2),
converts a deep copy of it, and trains both with Adam from the same weights on the seeded task of
``models.make_data``, printing per epoch both losses and step times. Without dropout the two loss
curves agree to float32 rounding: the converted model holds the same kind of parameters, under the
same state_dict keys, and computes PyG's function.

    python examples/from_pyg.py --model GAT --epochs 20
    python examples/from_pyg.py --model GraphSAGE --graph powerlaw-1M-16M --device cuda
"""
import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gnnio.nn  # noqa: E402
from models import make_data, resolve_device  # noqa: E402
from train import train_full_graph  # noqa: E402

MODELS = ("GCN", "GraphSAGE", "GIN", "GAT", "GATv2")


def pyg_model(name: str, in_channels: int, out_channels: int, hidden: int = 64, layers: int = 2):
    from torch_geometric.nn import models
    if name == "GATv2":
        return models.GAT(in_channels, hidden, layers, out_channels, heads=4, v2=True)
    if name == "GAT":
        return models.GAT(in_channels, hidden, layers, out_channels, heads=4)
    return getattr(models, name)(in_channels, hidden, layers, out_channels)


def run(name: str, data, epochs: int, seed: int = 0, log=print):
    """({'pyg': losses, 'gnnio': losses}, the converted model): the PyG model and its from_pyg
    copy, trained alike."""
    torch.manual_seed(seed)
    pyg = pyg_model(name, data.num_features, data.num_classes).to(data.device)
    ours = gnnio.nn.from_pyg(copy.deepcopy(pyg))
    if log:
        log(f"{name}: layers {[type(m).__module__.split('.')[0] for m in ours.convs]}")
    curves = {}
    for impl, model in (("pyg", pyg), ("gnnio", ours)):
        if log:
            log(f"-- {impl}")
        curves[impl] = train_full_graph(model, data, data.edge_index, epochs, log=log)
    if log:
        diff = max(abs(a - b) for a, b in zip(curves["pyg"], curves["gnnio"]))
        log(f"largest loss difference: {diff:.3g}")
    return curves, ours


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="GAT")
    p.add_argument("--graph", default="cora")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    data = make_data(args.graph, num_features=64, num_classes=7, seed=args.seed, device=device)
    run(args.model, data, args.epochs, seed=args.seed)


if __name__ == "__main__":
    main()
