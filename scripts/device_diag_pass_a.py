"""TransformerConv's training step (direct form, 128 -> 4 x 32) in bfloat16 and float16 by pass
A's register bound (bench/NOTES.md v29): GNNIO_PASS_A_DOT_BLOCKS unset (the 16-bit default, 6
blocks of 128 threads a SM) or 5 (float32's bound since v28). Per dtype and arm, interleaved
over rounds: the forward+backward by CUDA events (as the benchmark's: autograd.grad with a
dense output gradient), pass A's kernel time by the profiler, and the gradients' bits against
the default's (the same arithmetic: they must be equal). Diagnostics, not benchmark rows.

    python3 scripts/device_diag_pass_a.py [graph] [rounds]
"""
import os
import sys

import torch

import gnnio
from cuda_timing import timed  # scripts/, the script's own folder
from gnnio import datasets

ARMS = ["", "5"]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "powerlaw-1M-16M"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    os.environ["GNNIO_TRANSFORMER_FORM"] = "direct"
    d = datasets.load(name)
    graph = gnnio.Graph(d.edge_index.cuda(), num_nodes=d.num_nodes)
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        conv = gnnio.nn.TransformerConv(128, 32, heads=4).cuda().to(dtype)
        x = torch.randn(d.num_nodes, 128, device="cuda", dtype=dtype, requires_grad=True)
        inputs = [x] + [p for p in conv.parameters() if p.requires_grad]
        gout = torch.randn(d.num_nodes, 128, device="cuda", dtype=dtype)

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
                print(f"{str(dtype)[6:]} round {r} blocks {arm or '6 (default)'}: forward+backward "
                      f"{ms:.3f} ms, pass A {pass_a / 1e3:.3f} ms, gradients equal to the default's: "
                      f"{same}", flush=True)
        del conv, x, inputs, gout, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
