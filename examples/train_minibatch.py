"""Mini-batch node classification over sampled neighbourhoods (GraphSAGE-style), with gnnio's
layers or PyG's (issue 7).

Each step takes ``--batch-size`` training nodes as seeds, samples ``--fanouts`` in-neighbours per
hop (PyG's NeighborLoader when pyg-lib or torch-sparse is installed, else the plain-torch sampler
of ``sampling.py``; the output says which), builds a ``gnnio.Graph`` of the batch's subgraph on
the device (gnnio) or passes its edge_index (PyG), runs the model over the subgraph and takes the
loss on the seed nodes' rows.

    python examples/train_minibatch.py --model sage_max --impl gnnio --graph cora --epochs 5
    python examples/train_minibatch.py --model gatv2 --graph powerlaw-1M-16M --device cuda
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import (IMPLS, MODELS, Timer, build_model, graph_input, make_data,  # noqa: E402
                    peak_memory, reset_peak_memory, resolve_device)
from sampling import make_loader  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="sage_max")
    p.add_argument("--impl", choices=IMPLS + ("both",), default="gnnio")
    p.add_argument("--graph", default="cora")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch-size", type=int, default=256, help="seed nodes per batch")
    p.add_argument("--fanouts", default=None,
                   help="neighbours per hop, comma-separated (default: 10 per layer)")
    p.add_argument("--sampler", choices=("auto", "neighbor_loader", "plain"), default="auto")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--classes", type=int, default=7)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--train-frac", type=float, default=0.5)
    return p.parse_args(argv)


def train_step(model, opt, impl, data, batch, device):
    """One step on one sampled batch; returns the loss on the batch's seed nodes."""
    n_id = batch.n_id.to(device)
    edge_index = batch.edge_index.to(device)
    graph = graph_input(impl, edge_index, n_id.numel())  # a gnnio.Graph per batch, on the device
    opt.zero_grad(set_to_none=True)
    out = model(data.x[n_id], graph)[:batch.batch_size]
    loss = F.cross_entropy(out, data.y[n_id[:batch.batch_size]])
    loss.backward()
    opt.step()
    return loss


def train_minibatch(model, impl, data, loader, epochs, lr=0.01, max_steps=None, log=print):
    """Adam over the loader's batches; returns the per-step losses."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, step = [], 0
    for epoch in range(1, epochs + 1):
        model.train()
        reset_peak_memory(data.device)
        seeds, epoch_losses = 0, []
        with Timer(data.device) as t:
            for batch in loader:
                loss = train_step(model, opt, impl, data, batch, data.device)
                epoch_losses.append(loss.detach())
                seeds += batch.batch_size
                step += 1
                if max_steps is not None and step >= max_steps:
                    break
        epoch_losses = [x.item() for x in epoch_losses]
        losses += epoch_losses
        if log and epoch_losses:
            log(f"epoch {epoch:3d}  steps {len(epoch_losses):4d}  mean loss "
                f"{sum(epoch_losses) / len(epoch_losses):.6f}  last loss {epoch_losses[-1]:.6f}  "
                f"time {t.seconds:.3f} s  ({seeds / t.seconds:,.0f} seed nodes/s)  "
                f"peak memory {peak_memory(data.device)}")
        if max_steps is not None and step >= max_steps:
            break
    return losses


def fanouts_for(args, model) -> list:
    if args.fanouts:
        return [int(f) for f in args.fanouts.split(",")]
    return [10] * model.num_layers


def run(args, data=None, log=print):
    """Trains each implementation that ``args.impl`` names; returns {impl: per-step losses}.
    Both implementations see the same batches (the sampler is re-seeded for each)."""
    device = resolve_device(args.device)
    if data is None:
        data = make_data(args.graph, args.features, args.classes, seed=args.seed,
                         train_frac=args.train_frac, device=device)
    impls = IMPLS if args.impl == "both" else (args.impl,)
    results = {}
    for impl in impls:
        model = build_model(args.model, impl, data.num_features, data.num_classes, seed=args.seed,
                            hidden=args.hidden, heads=args.heads, layers=args.layers,
                            dropout=args.dropout).to(device)
        fanouts = fanouts_for(args, model)
        if len(fanouts) != model.num_layers:
            raise SystemExit(f"--fanouts gives {len(fanouts)} hops for a "
                             f"{model.num_layers}-layer model")
        t0 = time.perf_counter()
        loader, sampler = make_loader(data.edge_index, data.num_nodes, fanouts, data.train_idx,
                                      args.batch_size, shuffle=True, seed=args.seed,
                                      sampler=args.sampler)
        if log:
            log(f"[{impl}] {args.model} on {data.name} ({data.num_nodes} nodes, "
                f"{data.edge_index.size(1)} edges), device {device}, batch size {args.batch_size}, "
                f"{len(loader)} batches per epoch")
            log(f"[{impl}] sampler: {sampler} (set up in {time.perf_counter() - t0:.2f} s)")
        results[impl] = train_minibatch(
            model, impl, data, loader, args.epochs, args.lr, args.max_steps,
            log=(lambda s, impl=impl: log(f"[{impl}] {s}")) if log else None)
    if log and len(results) == 2:
        diff = max(abs(a - b) for a, b in zip(results["gnnio"], results["pyg"]))
        log(f"largest |loss(gnnio) - loss(pyg)| over {len(results['pyg'])} steps: {diff:.3g}")
    return results


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
