"""A/B of the layers' shared Graph cache (gnnio.nn._common._SharedGraphs) on mini-batch-shaped
training steps: a 3-layer model whose layers all get the step's new edge_index (as each
NeighborLoader batch is a new tensor), timed per step with the Graph built once (shared) or once
a layer (the shared lookup disabled), the arms interleaved, and their outputs compared bit for bit.

    python3 scripts/device_diag_shared_graphs.py [--nodes 100000] [--edges 1000000] [--steps 20]
"""
import argparse
import statistics
import time

import torch

import gnnio.nn
from gnnio.nn import _common


def model_of(name, features):
    kwargs = {"heads": 4} if name in ("GATConv", "GATv2Conv", "TransformerConv") else {}
    out = features // 4 if kwargs else features
    torch.manual_seed(0)
    return torch.nn.ModuleList([getattr(gnnio.nn, name)(features, out, **kwargs) for _ in range(3)])


def step(model, x, edge_index):
    ei = edge_index.clone()  # the batch's own tensor
    h = x
    for layer in model:
        h = layer(h, ei).relu()
    loss = h.square().mean()
    loss.backward()
    return h.detach()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(args.nodes, (2, args.edges), generator=gen).to(dev)
    x = torch.randn(args.nodes, args.features, generator=gen).to(dev)
    real_get = _common._SHARED.get
    print(f"{dev} {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else ''}; "
          f"{args.nodes} nodes, {args.edges} edges, {args.features} features, 3 layers, a new "
          f"edge_index each step; median ms a step over {args.steps} steps per arm, interleaved")
    for name in ("GCNConv", "SAGEConv", "GATConv", "GATv2Conv", "TransformerConv"):
        model = model_of(name, args.features).to(dev)
        times, outs = {"per-layer": [], "shared": []}, {}
        for i in range(args.steps + 2):
            for arm in times:
                _common._SHARED.get = real_get if arm == "shared" else (lambda *a: None)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = step(model, x, edge_index)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 2:  # two warm-up steps
                    times[arm].append((time.perf_counter() - t0) * 1e3)
                outs[arm] = out
        _common._SHARED.get = real_get
        med = {arm: statistics.median(v) for arm, v in times.items()}
        print(f"{name:16s} per-layer {med['per-layer']:8.2f}  shared {med['shared']:8.2f}  "
              f"ratio {med['per-layer'] / med['shared']:.2f}x  same bits: "
              f"{torch.equal(outs['per-layer'], outs['shared'])}")


if __name__ == "__main__":
    main()
