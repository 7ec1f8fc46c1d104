"""Regression tests for defects found in review (each failed before its fix)."""
import pytest
import torch

import gnnio
from graphs import random_graph


def test_width_one_column_slice_keeps_its_row_stride(device):
    ei = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]])
    g = gnnio.Graph(ei.to(device), num_nodes=4)
    x = torch.arange(16.0, device=device).view(4, 4)[:, 1:2]  # strides (4, 1)
    assert gnnio.ops.spmm(g, x).view(-1).tolist() == [5 + 9 + 13, 1, 0, 0]
    assert gnnio.ops.segment_reduce(g, x, "max").view(-1).tolist() == [13, 1, 0, 0]


def test_layers_inside_and_after_inference_mode():
    ei, n = random_graph(30, 120)
    layer = gnnio.nn.GCNConv(4, 3)
    x = torch.randn(n, 4)
    with torch.inference_mode():
        ei_inf = ei.clone()
        out_inf = layer(x, ei_inf)
    out = layer(x, ei_inf)  # caches filled in inference mode must serve training
    out.sum().backward()
    assert torch.equal(out_inf, out.detach()) and layer.lin.weight.grad is not None


def test_ids_beyond_int32_are_rejected_before_narrowing():
    with pytest.raises(IndexError, match="source"):
        gnnio.Graph(torch.tensor([[2**32 + 1, 2], [0, 1]]), num_nodes=4)


def test_double_backward_of_max_raises_instead_of_going_silent():
    ei, n = random_graph(10, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(gnnio.ops.segment_reduce(g, x, "max").sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gx.sum(), x)


def test_raw_segment_reduce_backward_rejects_non_contiguous_t2c():
    ei, n = random_graph(4, 4)
    g = gnnio.Graph(ei, num_nodes=n)
    t = g.csr_by_src
    arg = torch.zeros(n, 2, dtype=t.col.dtype)
    with pytest.raises(ValueError, match="t2c"):
        torch.ops.gnnio.segment_reduce_backward(t.rowptr, t.col, t.col[:1].expand(4), arg,
                                                torch.randn(n, 2), n)
