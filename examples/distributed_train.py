"""Data-parallel mini-batch training of a GATv2 or GraphSAGE-max model with
torch.nn.parallel.DistributedDataParallel (issue 6).

Every rank holds the whole (seeded) task and the same initial model; the training nodes are split
rank-strided (rank r takes every world_size-th node of a seeded permutation, all ranks the same
number), each rank samples its own mini-batches from its own seed nodes (``sampling.py``: PyG's
NeighborLoader when usable, else the plain-torch sampler), builds a ``gnnio.Graph`` of each batch
on its device, and DDP averages the gradients, so after every step all ranks hold the same
parameters. Rank 0 prints the mean loss over ranks and the throughput in seed nodes per second
(all ranks together).

    # CPU, gloo, 2 processes
    torchrun --nproc_per_node=2 examples/distributed_train.py --backend gloo --model sage_max
    # GPUs, NCCL, one process per GPU (device cuda:LOCAL_RANK)
    torchrun --nproc_per_node=8 examples/distributed_train.py --backend nccl --model gatv2 \\
        --graph powerlaw-1M-16M --batch-size 1024

Without torchrun (no RANK in the environment) it runs as a single process (world size 1).
``--out DIR`` makes every rank write ``DIR/rank<r>.pt``: its final parameters, a checksum, its
own losses and the mean losses over ranks (what tests/python/test_distributed.py checks).
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import IMPLS, build_model, graph_input, make_data, peak_memory  # noqa: E402
from sampling import make_loader  # noqa: E402

DIST_MODELS = ("gatv2", "sage_max")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=DIST_MODELS, default="gatv2")
    p.add_argument("--impl", choices=IMPLS, default="gnnio")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl when CUDA is available, else gloo")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda (cuda:LOCAL_RANK) with nccl, cpu with gloo")
    p.add_argument("--graph", default="cora")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch-size", type=int, default=256, help="seed nodes per batch and rank")
    p.add_argument("--fanouts", default=None, help="comma-separated (default: 10 per layer)")
    p.add_argument("--sampler", choices=("auto", "neighbor_loader", "plain"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--classes", type=int, default=7)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--train-frac", type=float, default=0.5)
    p.add_argument("--out", default=None, help="folder for each rank's rank<r>.pt")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(args):
    """(rank, world_size, device, backend); initialises the default process group."""
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "gloo" and not dist.is_gloo_available():
        raise SystemExit("this torch has no gloo backend")
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise SystemExit("--backend nccl needs CUDA GPUs and a torch built with NCCL")
    device_type = args.device or ("cuda" if backend == "nccl" else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "RANK" in os.environ:  # launched by torchrun: env:// rendezvous
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device, backend


def rank_seed_nodes(train_idx: torch.Tensor, rank: int, world: int, seed: int) -> torch.Tensor:
    """Rank ``rank``'s share of the training nodes: every world-th node of a seeded permutation
    (the same permutation on every rank), truncated so all ranks get the same number (DDP needs
    every rank to take the same number of steps)."""
    g = torch.Generator().manual_seed(seed)
    perm = train_idx.cpu()[torch.randperm(train_idx.numel(), generator=g)]
    per_rank = perm.numel() // world
    return perm[rank::world][:per_rank]


def checksum(module) -> float:
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(module.parameters())))


def main(argv=None):
    args = parse_args(argv)
    rank, world, device, backend = setup(args)
    try:
        return _train(args, rank, world, device, backend)
    finally:
        dist.destroy_process_group()


def _train(args, rank, world, device, backend):
    log = print if rank == 0 else (lambda *a, **k: None)
    data = make_data(args.graph, args.features, args.classes, seed=args.seed,
                     train_frac=args.train_frac, device=device)
    model = build_model(args.model, args.impl, data.num_features, data.num_classes,
                        seed=args.seed, hidden=args.hidden, heads=args.heads,
                        layers=args.layers).to(device)
    initial = checksum(model)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    fanouts = [int(f) for f in args.fanouts.split(",")] if args.fanouts else [10] * model.num_layers
    if len(fanouts) != model.num_layers:
        raise SystemExit(f"--fanouts gives {len(fanouts)} hops for a {model.num_layers}-layer model")
    mine = rank_seed_nodes(data.train_idx, rank, world, args.seed)
    loader, sampler = make_loader(data.edge_index, data.num_nodes, fanouts, mine, args.batch_size,
                                  shuffle=True, seed=args.seed + 1 + rank, sampler=args.sampler)
    log(f"{world} ranks, backend {backend}, device {device if world == 1 else device.type}"
        f"{':LOCAL_RANK' if device.type == 'cuda' and world > 1 else ''}; {args.impl} {args.model} "
        f"({model.num_layers} layers, hidden {model.hidden}"
        f"{f', heads {model.heads}' if args.model == 'gatv2' else ''}) on {data.name} "
        f"({data.num_nodes} nodes, {data.edge_index.size(1)} edges); {mine.numel()} seed nodes "
        f"per rank, batch size {args.batch_size}, {len(loader)} steps per epoch")
    log(f"sampler: {sampler}")

    local_losses, mean_losses, step = [], [], 0
    done = False
    for epoch in range(1, args.epochs + 1):
        ddp.train()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        epoch_losses, seeds = [], 0
        for batch in loader:
            n_id = batch.n_id.to(device)
            graph = graph_input(args.impl, batch.edge_index.to(device), n_id.numel())
            opt.zero_grad(set_to_none=True)
            out = ddp(data.x[n_id], graph)[:batch.batch_size]
            loss = F.cross_entropy(out, data.y[n_id[:batch.batch_size]])
            loss.backward()  # DDP all-reduces (averages) the gradients here
            opt.step()
            epoch_losses.append(loss.detach())
            seeds += batch.batch_size
            step += 1
            if args.max_steps is not None and step >= args.max_steps:
                done = True
                break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # One collective per epoch: every rank's losses and seed count (the mean over ranks is
        # the loss of the global batch). Its wait is part of the epoch's time, as a barrier is.
        stats = torch.stack(epoch_losses + [torch.tensor(float(seeds), device=device)]).double()
        local_losses += [x.item() for x in epoch_losses]
        dist.all_reduce(stats)
        seconds = time.perf_counter() - t0
        means = (stats[:-1] / world).tolist()
        mean_losses += means
        total_seeds = int(stats[-1].item())
        log(f"epoch {epoch:3d}  steps {len(means):4d}  loss first {means[0]:.6f} last "
            f"{means[-1]:.6f} mean {sum(means) / len(means):.6f}  time {seconds:.3f} s  "
            f"throughput {total_seeds / seconds:,.0f} seed nodes/s ({world} ranks)  "
            f"peak memory (rank 0) {peak_memory(device)}")
        if done:
            break

    final = checksum(model)
    print(f"rank {rank}: {step} steps, parameter checksum {final:.17g} (initial {initial:.17g})",
          flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"params": {k: v.detach().cpu() for k, v in model.named_parameters()},
                    "checksum": final, "initial_checksum": initial, "steps": step,
                    "local_losses": local_losses, "mean_losses": mean_losses,
                    "world_size": world, "seed_nodes": mine},
                   os.path.join(args.out, f"rank{rank}.pt"))
    return mean_losses


if __name__ == "__main__":
    main()
