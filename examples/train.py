"""Full-graph node classification with gnnio's layers or PyG's (issue 7).

Both implementations build the same model (``models.GNN``) from the same seed with identical
initial weights (PyG's model is built, and its state_dict loaded into gnnio's), train it with Adam
on the same seeded task, and print per epoch the loss, the epoch time and the peak memory
(``torch.cuda.max_memory_allocated`` on CUDA). Without dropout (the default) the two loss curves
agree to float32 rounding.

    python examples/train.py --model gatv2 --impl gnnio --graph cora --epochs 50
    python examples/train.py --model gcn --impl both --graph powerlaw-1M-16M --device cuda

``--impl both`` trains one after the other and prints the largest difference of the losses.
Graphs: anything ``gnnio.datasets.load`` knows (cora, as20000102, powerlaw-1M-16M,
uniform-1M-16M, grid-1000x1000, powerlaw-10K-160K, ...).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import (IMPLS, MODELS, Timer, build_model, graph_input, make_data,  # noqa: E402
                    peak_memory, reset_peak_memory, resolve_device)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="gcn")
    p.add_argument("--impl", choices=IMPLS + ("both",), default="gnnio")
    p.add_argument("--graph", default="cora")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=None, help="per head (default: per model)")
    p.add_argument("--heads", type=int, default=None, help="attention models (default: per model)")
    p.add_argument("--layers", type=int, default=None, help="default: per model (gatv2: 3)")
    p.add_argument("--features", type=int, default=64, help="input feature size")
    p.add_argument("--classes", type=int, default=7)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.0, help="feature dropout (default: none)")
    p.add_argument("--train-frac", type=float, default=0.5)
    return p.parse_args(argv)


def train_full_graph(model, data, graph, epochs, lr=0.01, weight_decay=0.0, log=print):
    """Adam on cross-entropy over the training nodes, one full-graph step per epoch. Returns the
    per-epoch losses (before each step's update)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for epoch in range(1, epochs + 1):
        model.train()
        reset_peak_memory(data.device)
        with Timer(data.device) as t:
            opt.zero_grad(set_to_none=True)
            out = model(data.x, graph)
            loss = F.cross_entropy(out[data.train_idx], data.y[data.train_idx])
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if log:
            log(f"epoch {epoch:4d}  loss {losses[-1]:.6f}  time {t.seconds * 1e3:8.2f} ms  "
                f"peak memory {peak_memory(data.device)}")
    return losses


@torch.no_grad()
def accuracy(model, data, graph, idx):
    model.eval()
    pred = model(data.x, graph).argmax(1)
    return (pred[idx] == data.y[idx]).float().mean().item()


def run(args, data=None, log=print):
    """Trains each implementation that ``args.impl`` names; returns {impl: losses}."""
    device = resolve_device(args.device)
    if data is None:
        data = make_data(args.graph, args.features, args.classes, seed=args.seed,
                         train_frac=args.train_frac, device=device)
    impls = IMPLS if args.impl == "both" else (args.impl,)
    if log:
        log(f"graph {data.name}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, "
            f"{data.num_features} features, {data.num_classes} classes, "
            f"{data.train_idx.numel()} training nodes; device {device}")
    results = {}
    for impl in impls:
        model = build_model(args.model, impl, data.num_features, data.num_classes, seed=args.seed,
                            hidden=args.hidden, heads=args.heads, layers=args.layers,
                            dropout=args.dropout).to(device)
        with Timer(device) as t:
            graph = graph_input(impl, data.edge_index, data.num_nodes)
        if log:
            heads = f", heads {model.heads}" if args.model in ("gat", "gatv2", "transformer") else ""
            log(f"[{impl}] {args.model}: {model.num_layers} layers, hidden {model.hidden}{heads}, "
                f"{sum(p.numel() for p in model.parameters())} parameters; "
                f"graph input built in {t.seconds * 1e3:.1f} ms")
        losses = train_full_graph(model, data, graph, args.epochs, args.lr, args.weight_decay,
                                  log=(lambda s, impl=impl: log(f"[{impl}] {s}")) if log else None)
        if log:
            log(f"[{impl}] test accuracy {accuracy(model, data, graph, data.test_idx):.4f}")
        results[impl] = losses
    if log and len(results) == 2:
        diff = max(abs(a - b) for a, b in zip(results["gnnio"], results["pyg"]))
        log(f"largest |loss(gnnio) - loss(pyg)| over {args.epochs} epochs: {diff:.3g}")
    return results


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
