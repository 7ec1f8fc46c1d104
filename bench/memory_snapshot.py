"""What is alive on the GPU at the peak of one GATv2x3-train step (or one layer's
forward+backward): the CUDA caching allocator's own event trace
(``torch.cuda.memory._record_memory_history``), replayed to the moment of the highest allocated
total, each live block named by the frames that allocated it. The CUDA counterpart of
``bench/memory_trace.py`` (which traces the CPU path and extrapolates); for NOTES.md.

    python bench/memory_snapshot.py --graph powerlaw-1M-8M            # the training step
    python bench/memory_snapshot.py --graph powerlaw-1M-16M --layer GATv2Conv
"""
import argparse
import re
from collections import defaultdict

import torch

import gnnio

GIB = 2 ** 30
# Frames that say who allocated a block: our Python files, autograd's generated backward nodes,
# gnnio's C++ ops and ATen's native kernels.
_PY = re.compile(r"(gnnio|examples|bench)/")
_CPP = re.compile(r"(torch::autograd::generated::\w+|gnnio::\w+(::\w+)*|at::native::\w+)")


def label(frames) -> str:
    py, cpp = [], []
    for f in frames:
        name, path = f.get("name", ""), f.get("filename", "")
        if _PY.search(path) and len(py) < 2:
            py.append(f"{path.rsplit('/', 1)[-1]}:{f.get('line')} {name}")
        m = _CPP.search(name)
        if m and len(cpp) < 2 and m.group(1) not in cpp:
            cpp.append(m.group(1))
    return " | ".join(cpp + py) or "?"


def peak_blocks(trace):
    """(peak bytes, [(size, frames)] alive then) from one device's allocator trace."""
    live, total, best, best_live = {}, 0, -1, {}
    for ev in trace:
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            total += ev["size"]
            if total > best:
                best, best_live = total, dict(live)
        elif a == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return best, list(best_live.values())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graph", default="powerlaw-1M-8M")
    p.add_argument("--layer", default=None, help="a gnnio.bench layer case instead of training")
    p.add_argument("--top", type=int, default=16)
    args = p.parse_args()
    data = gnnio.datasets.load(args.graph)
    ei, n = data.edge_index.cuda(), data.num_nodes
    torch.manual_seed(0)
    if args.layer:
        from gnnio.bench.cases import LAYERS
        x = torch.randn(n, 128, device="cuda", requires_grad=True)
        layer = LAYERS[args.layer].make_gnnio(128).cuda()
        gout = torch.randn_like(layer(x, ei))

        def step():
            layer(x, ei).backward(gout)
    else:
        from gnnio.bench import training
        step = training.example_step(ei, n, ei.device)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="all")
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    peak, blocks = peak_blocks(trace)
    # Frees of blocks allocated before the step (e.g. the last step's gradients, at zero_grad)
    # are not subtracted: this can exceed max_memory_allocated - before by their size.
    print(f"=== {args.layer or 'GATv2x3-train'} on {args.graph}: before the step {base / GIB:.2f} "
          f"GiB; the blocks allocated during the step and alive at its peak {peak / GIB:.3f} GiB")
    groups = defaultdict(lambda: [0, 0])
    for size, frames in blocks:
        g = groups[label(frames)]
        g[0] += size
        g[1] += 1
    for name, (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{size / GIB:8.3f} GiB  {count:3d} x  {name[:200]}")


if __name__ == "__main__":
    main()
