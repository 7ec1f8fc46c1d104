"""CUDA graphs: a whole training step (forward, backward, optimizer) of a model built from gnnio
layers on a fixed Graph is captured once and replayed, and gives what eager steps give. The Graph,
its caches and the kernels' plans are built by warm-up steps on the capture stream before capture
(a Graph reads ids back to the host when it is built; nothing in a step does)."""
import copy

import pytest
import torch

import gnnio
from graphs import real

pytestmark = pytest.mark.cuda


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = gnnio.nn.GCNConv(16, 32)
        self.c2 = gnnio.nn.SAGEConv(32, 32, aggr="max")
        self.c3 = gnnio.nn.GATv2Conv(32, 8, heads=2, concat=False)  # dropout 0: no host-drawn seed

    def forward(self, x, graph):
        return self.c3(self.c2(self.c1(x, graph).relu(), graph).relu(), graph)


def test_captured_training_step_matches_eager():
    torch.manual_seed(0)
    ei, n = real("cora")
    graph = gnnio.Graph(ei.cuda(), num_nodes=n)
    x = torch.randn(n, 16, device="cuda")
    target = torch.randint(8, (n,), device="cuda")
    eager = Net().cuda()
    captured = copy.deepcopy(eager)

    def step(model, opt):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x, graph), target)
        loss.backward()
        opt.step()
        return loss

    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(captured.parameters(), lr=0.1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream fills every cache and plan
        for _ in range(2):
            step(captured, opt_c)
            step(eager, opt_e)
    torch.cuda.current_stream().wait_stream(stream)
    graph_step = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_step, stream=stream):
        static_loss = step(captured, opt_c)
    # Capture records the step without running it: replay three times, step eager three times.
    losses = []
    for _ in range(3):
        graph_step.replay()
        losses.append(static_loss.item())
    eager_losses = [step(eager, opt_e).item() for _ in range(3)]
    # The same kernels in the same order on the same inputs: float32 agreement to rounding of
    # the cuBLAS/cuSPARSE paths, which may pick different algorithms inside a capture.
    assert losses == pytest.approx(eager_losses, rel=1e-5, abs=1e-6)
    for a, b in zip(captured.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
