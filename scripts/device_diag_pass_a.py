"""TransformerConv's training step (direct form, 128 -> 4 x 32, float32) by pass A's register
bound (bench/NOTES.md v28): GNNIO_PASS_A_DOT_BLOCKS unset (the default, 4 blocks of 128
threads a SM), 5 or 6 (the bound before v28). Per arm, interleaved over rounds: the
forward+backward by CUDA events (as the benchmark's: autograd.grad with a dense output
gradient), pass A's kernel time by the profiler, and the gradients' bits against the default's
(the same arithmetic: they must be equal). Diagnostics, not benchmark rows.

    python3 scripts/device_diag_pass_a.py [graph] [rounds]
"""
import os
import sys

import torch

import gnnio
from cuda_timing import timed  # scripts/, the script's own folder
from gnnio import datasets

ARMS = ["", "5", "6"]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "powerlaw-1M-16M"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    os.environ["GNNIO_TRANSFORMER_FORM"] = "direct"
    d = datasets.load(name)
    graph = gnnio.Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
    torch.manual_seed(0)
    conv = gnnio.nn.TransformerConv(128, 32, heads=4).cuda()
    x = torch.randn(d.num_nodes, 128, device="cuda", requires_grad=True)
    inputs = [x] + [p for p in conv.parameters() if p.requires_grad]
    gout = torch.randn(d.num_nodes, 128, device="cuda")

    def both():
        return torch.autograd.grad(conv(x, graph), inputs, gout)
    ref = None
    for r in range(rounds):
        for arm in ARMS:
            if arm:
                os.environ["GNNIO_PASS_A_DOT_BLOCKS"] = arm
            else:
                os.environ.pop("GNNIO_PASS_A_DOT_BLOCKS", None)
            grads = both()
            if ref is None:
                ref = grads
            same = all(torch.equal(a, b) for a, b in zip(grads, ref))
            del grads
            ms = timed(both)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                both()
                torch.cuda.synchronize()
            pass_a = sum(e.device_time_total for e in prof.key_averages() if "pass_a_kernel" in e.key)
            print(f"round {r} blocks {arm or '4 (default)'}: forward+backward {ms:.3f} ms, "
                  f"pass A {pass_a / 1e3:.3f} ms, gradients equal to the default's: {same}", flush=True)


if __name__ == "__main__":
    main()
