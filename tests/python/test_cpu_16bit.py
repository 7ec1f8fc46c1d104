"""float16 / bfloat16 through gnnio's ops on the CPU, whose kernels take float32 and float64: the
16-bit operands go in as float32 copies and each floating result comes back rounded once to the
dtype (gnnio._ops.widened_on_cpu), the CUDA kernels' precision model. So each op's 16-bit output
and gradients equal, bit for bit, the float32 op on the same (exactly widened) values, rounded.
The raw registered ops still refuse 16-bit on the CPU (test_raw_op_checks.py)."""
import pytest
import torch

import gnnio
from graphs import random_graph

DTYPES = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])


def _check_rounded(fn, inputs, dtype):
    """fn on the 16-bit inputs against fn on their float32 copies: outputs and gradients equal
    after rounding the float32 run's to the dtype."""
    leaves16 = {k: v.to(dtype).requires_grad_() for k, v in inputs.items()}
    leaves32 = {k: v.to(dtype).float().requires_grad_() for k, v in inputs.items()}
    out16, out32 = fn(**leaves16), fn(**leaves32)
    assert out16.dtype == dtype
    assert torch.equal(out16, out32.to(dtype))
    gout = torch.randn(out16.shape).to(dtype)
    out16.backward(gout)
    out32.backward(gout.float())
    for k in inputs:
        assert leaves16[k].grad.dtype == dtype, k
        assert torch.equal(leaves16[k].grad, leaves32[k].grad.to(dtype)), k


@DTYPES
@pytest.mark.parametrize("weighted", [False, True])
def test_spmm_sum(dtype, weighted):
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    inputs = {"x": torch.randn(n, 12)} | ({"w": torch.rand(ei.size(1))} if weighted else {})
    _check_rounded(lambda x, w=None: gnnio.ops.spmm(g, x, w), inputs, dtype)


@DTYPES
def test_spmm_on_tiles(dtype):
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    _check_rounded(lambda x: gnnio.ops.spmm(g, x, backend="wsb"), {"x": torch.randn(n, 12)}, dtype)


@DTYPES
def test_spmm_mean_takes_its_weights_in_the_dtype(dtype):
    """The mean's 1/deg edge values are formed in x's dtype (as on CUDA): the 16-bit mean is the
    float32 weighted sum with those rounded weights, rounded."""
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    w = (1.0 / torch.bincount(ei[1], minlength=n).clamp(min=1).double())[ei[1]].to(dtype)
    x = torch.randn(n, 12).to(dtype)
    assert torch.equal(gnnio.ops.spmm(g, x, reduce="mean"),
                       gnnio.ops.spmm(g, x.float(), w.float()).to(dtype))


@DTYPES
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_segment_reduce(dtype, reduce):
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    _check_rounded(lambda x, w: gnnio.ops.segment_reduce(g, x, reduce, edge_weight=w),
                   {"x": torch.randn(n, 12), "w": torch.randn(ei.size(1))}, dtype)


@DTYPES
@pytest.mark.parametrize("kind", ["gat", "gatv2", "dot"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_graph_attention(dtype, kind, dropout):
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    h, c = 2, 8
    inputs = {"value": torch.randn(n, h, c), "edge_value": torch.randn(ei.size(1), h, c)}
    if kind == "gat":
        inputs |= {"src_score": torch.randn(n, h), "dst_score": torch.randn(n, h)}
    else:
        inputs |= {"query": torch.randn(n, h, c), "key": torch.randn(n, h, c)}
    if kind == "gatv2":
        inputs["att"] = torch.randn(h, c)

    def fn(**t):  # the same seed: the same dropout mask in both runs
        return gnnio.ops.graph_attention(g, kind, dropout=dropout, seed=7, scale=0.5, **t)
    _check_rounded(fn, inputs, dtype)


@DTYPES
def test_attention_weights_are_returned_in_the_dtype(dtype):
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei, num_nodes=n)
    q, k, v = (torch.randn(n, 2, 8).to(dtype) for _ in range(3))
    out, alpha = gnnio.ops.graph_attention(g, "dot", v, query=q, key=k, return_weights=True)
    out32, alpha32 = gnnio.ops.graph_attention(g, "dot", v.float(), query=q.float(),
                                               key=k.float(), return_weights=True)
    assert out.dtype == alpha.dtype == dtype
    assert torch.equal(out, out32.to(dtype)) and torch.equal(alpha, alpha32.to(dtype))
