"""The attention layers and op on CUDA on a 2*10^5-slot hub (the super-node split in both
directions): each layer against the CPU (float32) and against float64 from the same rounded
operands (bf16 / fp16, with a CPU emulation of the precision model), the op alone in every
dtype and optional-operand case, the 16-bit kernels at every lane width, and dropout masks
equal to the CPU's. Skipped without a GPU. (Split from test_attention_cuda.py.)"""
import math
import zlib

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import hub, random_graph
from test_attention import _spy_on  # a helper, not a test
from test_attention_cuda import L_HUB
from test_attention_op import OP_CASES, OP_IDS, make_operands as make_op_operands

EPS32 = torch.finfo(torch.float32).eps

pytestmark = pytest.mark.cuda


def _hub_graph_2e5():
    """Node 0 receives 2*10^5 edges and sends 2*10^5 (to ~10^4 nodes, many duplicates): the
    planner splits the forward's hub row and the backward's hub source into chunks."""
    ei, n = hub(200_000)
    return torch.cat([ei, ei[:, :200_000].flip(0)], 1), n


CUDA_LAYERS = [("GATConv", {"heads": 2, "edge_dim": 2}), ("GATv2Conv", {"heads": 2, "edge_dim": 2}),
               ("TransformerConv", {"heads": 2, "edge_dim": 2, "beta": True})]
CUDA_IDS = [a for a, _ in CUDA_LAYERS]


def _sign_controlled_state(layer, module):
    """Weights that, with node features x_j = s_j (0.5 + U[0, 0.5]) (random sign s_j per node)
    and edge features in [0, 1], keep every LeakyReLU pre-activation of GATConv / GATv2Conv
    >= ~0.5 away from the kink on the branch its source picks (as ``make_op_operands(signed=True)``):
    the source's term is a sum of non-negative weights times x_j (a_src >= 0 and W >= 0; the rows
    of W_l >= 0, its bias small), the destination's and edge's terms are scaled down to a few
    hundredths. TransformerConv has no kink and keeps its weights."""
    state = {k: v.clone() for k, v in module.state_dict().items()}
    if layer == "GATConv":
        state["lin.weight"] = state["lin.weight"].abs()
        state["att_src"] = state["att_src"].abs()
        for k in ("att_dst", "lin_edge.weight"):
            state[k] = 0.05 * state[k]
    elif layer == "GATv2Conv":
        state["lin_l.weight"] = state["lin_l.weight"].abs()
        for k in ("lin_l.bias", "lin_r.weight", "lin_r.bias", "lin_edge.weight"):
            state[k] = 0.02 * state[k]
    return state


def _hub_inputs(layer, opts):
    ei, n = _hub_graph_2e5()
    state = _sign_controlled_state(layer, getattr(gnnio.nn, layer)(8, 4, **opts))
    sign = torch.randint(0, 2, (n, 1)).float() * 2 - 1
    x, ea = sign * (0.5 + 0.5 * torch.rand(n, 8)), torch.rand(ei.size(1), 2)
    return ei, n, state, x, ea


def _forward_backward(module, x, ei, ea):
    x = x.detach().requires_grad_()
    ea = ea.detach().requires_grad_()
    out = module(x, ei, ea)
    gout = torch.cos(torch.arange(out.numel(), device=out.device, dtype=torch.float64)).view_as(out)
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(out, [x, ea] + [params[k] for k in sorted(params)],
                                gout.to(out.dtype))
    return out, grads


def _module_with(layer, opts, state, device, dtype):
    m = getattr(gnnio.nn, layer)(8, 4, **opts)
    m.load_state_dict(state)
    return m.to(device=device, dtype=dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_matches_cpu_on_hub(layer, opts):
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    plan = gnnio.plan.plan_attention(gnnio.Graph(ei, num_nodes=n), 8, backward=True)
    assert plan.heavy_rows is not None and plan.heavy_src is not None  # the split is exercised
    results = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.float32), ("cpu", torch.float64)):
        m = _module_with(layer, opts, state, device, dtype)
        results.append(_forward_backward(m, x.to(device, dtype), ei.to(device), ea.to(device, dtype)))
    (o_c, g_c), (o_g, g_g), (o_e, g_e) = results
    # The CPU kernel accumulates a row in float64; the CUDA kernel in float32, in chunks merged
    # afterwards. Float32 rounding of a sum of L terms grows like sqrt(L) eps32 typically: the
    # floor is 2 sqrt(L) eps32 of the scale, besides "no worse than twice the CPU's error".
    # Parameter gradients are sums over all nodes / edges (torch's GEMMs): floor as run_pair's.
    rows = n + ei.size(1)

    def floor(t, param=False):
        k = max(8.0, 4 * math.sqrt(rows)) if param else 2 * math.sqrt(L_HUB)
        return k * EPS32 * max(t.abs().max().item(), 1.0)

    assert_no_worse_than_reference(o_g.cpu(), o_c, o_e, floor=floor(o_e))
    for i, (a, b, c) in enumerate(zip(g_g, g_c, g_e)):
        assert_no_worse_than_reference(a.cpu(), b, c, floor=floor(c, param=i >= 2))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_layer_low_precision_on_hub(layer, opts, dtype):
    """bf16 / fp16 on CUDA against float64 on the CPU from the same rounded inputs and weights,
    no worse than twice the CPU's run of the same precision model (dense parts in the dtype,
    the op in fp32, each result rounded once: gnnio._ops.widened_on_cpu), plus a floor of one rounding to the dtype and the
    fp32 accumulation over the hub's L = 2*10^5 terms: (eps + 4 sqrt(L) eps32) of the scale.

    Why that CPU run and not eps alone: the dtype's roundings of the layer's dense parts (the
    projections, scores, the incoming gradient) enter every one of the hub row's 2*10^5 terms
    with random signs, so that row's error grows like sqrt(L) eps of a term while the row itself
    can be much smaller than sqrt(L) terms (cancellation): up to ~30 eps of the scale for the
    input gradient of the hub here, data-dependent. The CPU run carries the same roundings of
    the same numbers, so it measures that part, and the floor bounds what the kernel adds.
    Parameter gradients (sums over all nodes by torch's GEMMs) are checked in fp32 only."""
    eps = torch.finfo(dtype).eps
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    state = {k: v.to(dtype).double() for k, v in state.items()}
    x, ea = x.to(dtype), ea.to(dtype)
    out, grads = _forward_backward(_module_with(layer, opts, state, "cuda", dtype), x.cuda(),
                                   ei.cuda(), ea.cuda())
    assert out.dtype == dtype
    out_t, grads_t = _forward_backward(_module_with(layer, opts, state, "cpu", dtype), x, ei, ea)
    out_e, grads_e = _forward_backward(_module_with(layer, opts, state, "cpu", torch.float64),
                                       x.double(), ei, ea.double())
    rel = eps + 4 * math.sqrt(L_HUB) * EPS32
    for a, b, c in [(out, out_t, out_e), (grads[0], grads_t[0], grads_e[0]),
                    (grads[1], grads_t[1], grads_e[1])]:
        assert_no_worse_than_reference(a.cpu(), b, c, floor=rel * c.abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind,optional", OP_CASES, ids=OP_IDS)
def test_cuda_op_on_hub(kind, optional, dtype):
    """The op alone, CUDA against float64 on the CPU from the same operands (``signed``: no
    LeakyReLU branch can flip): nothing rounds in between, so the error is the kernel's fp32
    accumulation over up to L terms (~sqrt(L) eps32 of the scale; 4x margin) plus one rounding
    of the result to the dtype (eps/2; 2x margin), per element."""
    ei, n = _hub_graph_2e5()
    _op_against_float64(ei, n, kind, optional, 2, 4, dtype, torch.Generator().manual_seed(4), L_HUB)


def _op_against_float64(ei, n, kind, optional, heads, channels, dtype, gen, longest):
    """graph_attention on CUDA against float64 on the CPU from the same signed operands, forward
    and every gradient: fp32 accumulation over up to `longest` terms and one rounding to dtype."""
    graph, gcuda = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    ops = make_op_operands(kind, optional, graph, heads, channels, dtype, gen, signed=True)
    names = list(ops)
    ts = [t.cuda().requires_grad_() for t in ops.values()]
    out = gnnio.ops.graph_attention(gcuda, kind, **dict(zip(names, ts)), scale=0.5)
    te = [t.double().requires_grad_() for t in ops.values()]
    out_e = gnnio.ops.graph_attention(graph, kind, **dict(zip(names, te)), scale=0.5)
    assert out.dtype == dtype
    gout = torch.cos(torch.arange(out.numel(), dtype=torch.float64)).view_as(out_e).to(dtype)
    g = torch.autograd.grad(out, ts, gout.cuda())
    g_e = torch.autograd.grad(out_e, te, gout.double())
    rel = 4 * math.sqrt(longest) * EPS32 + torch.finfo(dtype).eps
    for what, a, c in [("out", out, out_e)] + list(zip([f"d{k}" for k in names], g, g_e)):
        err, scale = (a.cpu().double() - c).abs().max().item(), c.abs().max().item()
        assert err <= rel * scale, f"{what}: error {err:.3g} > {rel:.2g} x scale {scale:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("heads,channels", [(3, 2), (2, 8), (2, 16), (4, 32), (1, 128)],
                         ids=["L1-partial", "L2", "L4", "L8", "L32"])
@pytest.mark.parametrize("kind,optional", OP_CASES, ids=OP_IDS)
def test_cuda_16bit_at_every_lane_width(kind, optional, heads, channels, dtype):
    """The 16-bit kernels (rows loaded raw, converted after a step's loads are issued) at every
    lane width of 4 channels a lane (1 lane a head with 2 of its 4 channels past the head, up to
    32), rows of ~5 to ~35 slots (partial steps), a row of ~615 (split into work items) and every
    optional edge term, forward and backward against float64 from the same operands, with
    test_cuda_op_on_hub's bound for the longest row. (Written for 6707805's 8-slot 16-bit
    forward, reverted as slower; it passed there and covers the kept kernels.)"""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((kind, optional, heads, channels)).encode()))
    ei, n = random_graph(400, 6000, generator=gen)
    ei = torch.cat([ei, torch.stack([torch.randint(n, (600,), generator=gen), torch.full((600,), 7)])], 1)
    longest = int(torch.bincount(ei[1], minlength=n).max())
    _op_against_float64(ei, n, kind, optional, heads, channels, dtype, gen, longest)


@pytest.mark.cuda
@pytest.mark.parametrize("layer,opts", CUDA_LAYERS, ids=CUDA_IDS)
def test_cuda_dropout_masks_equal_cpu(monkeypatch, layer, opts):
    """The mask is a function of (seed, CSR slot, head) and a layer draws its seed from the CPU
    default generator: the same seed gives the same mask on both devices, layer and op."""
    ei, n, state, x, ea = _hub_inputs(layer, opts)
    spy = _spy_on(monkeypatch, layer)
    for device in ("cpu", "cuda"):
        m = _module_with(layer, dict(opts, dropout=0.3), state, device, torch.float32)
        torch.manual_seed(3)
        m(x.to(device), ei.to(device), ea.to(device))
    w_c, w_g = spy.weights
    assert torch.equal(w_c == 0, w_g.cpu() == 0)
    assert 0.25 < (w_c == 0).double().mean().item() < 0.35
    graph, gcuda = gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei.cuda(), num_nodes=n)
    ops = make_op_operands("gatv2", ("edge_key",), graph, 2, 4, torch.float32,
                        torch.Generator().manual_seed(6))
    for seed in (0, 1, 2**40 + 3):
        _, w_c = gnnio.ops.graph_attention(graph, "gatv2", **ops, dropout=0.5, seed=seed,
                                           return_weights=True)
        _, w_g = gnnio.ops.graph_attention(gcuda, "gatv2", **{k: v.cuda() for k, v in ops.items()},
                                           dropout=0.5, seed=seed, return_weights=True)
        assert torch.equal(w_c == 0, w_g.cpu() == 0)
