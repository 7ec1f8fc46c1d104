"""Mixed precision: the attention layers under torch.autocast, against PyG's.

Under autocast the projections come out in bf16 / fp16 while the attention vectors (att_*) stay
float32.

GATConv and GATv2Conv then run the op in float32 on the rounded projections, as PyG's attention
does (its products with att promote to float32). So what gnnio adds is checked at those
projections: the float32 op against PyG's layer in float32 and in float64, each fed (by forward
hooks) the very projections gnnio's autocast run made, by the suite's rule (no worse than twice
PyG's float32 error against float64, floor 8 float32 ulp of the scale): the output, the
gradients that reach each projection (each of its uses, up to three here, returns its gradient
rounded to the dtype, and autograd adds them in the dtype: up to 4 roundings, floor 2 eps of
the scale more), and the attention vectors' gradients. Fed the same projections, the
LeakyReLU kinks sit at the same places in every run. The whole layer under autocast is checked
against PyG's under autocast in the forward (negative_slope=1: the projections' roundings move
pre-activations across a kink now and then, on different edges for the two, where the output's
slope changes).

TransformerConv has no float32 parameter in its op and runs it in the projections' dtype with
float32 accumulation (a bf16 / fp16 layer); GCNConv aggregates its 16-bit projection the same
way. On the CPU, whose kernels take float32 and float64 only, gnnio's ops run 16-bit operands
as float32 copies and round each result once (gnnio._ops.widened_on_cpu): the CUDA kernels'
precision model. These are checked whole, forward and backward, against PyG's under autocast and
float64. Their extra roundings (the output and the op's gradients, eps/2 of each value) enter
every term of a sum with random signs, so a sum of L terms carries ~sqrt(L) eps/2 of a term, and
the sum itself can be smaller than its terms (cancellation, as in the hub tests): a floor of
(1 + sqrt(L)) eps of the scale, L the products behind one element: a node's edges (degree + 1)
times the 8 features a projection sums for the output and the input gradients, all edges times 8
for the parameters'. The same rule checks every layer as a 16-bit model (weights and features in
the dtype, no autocast), where the SpMM, reduction and attention ops all run in the dtype.
"""
import copy

import pytest
import torch

from conftest import assert_no_worse_than_reference
from graphs import random_graph
from layer_pairs import make_pair

EPS32 = torch.finfo(torch.float32).eps
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])

GAT_CASES = [
    ("GATConv", {"heads": 2}, False), ("GATConv", {"heads": 2, "edge_dim": 3}, False),
    ("GATConv", {"heads": 2, "residual": True, "concat": False}, False),
    ("GATConv", {"heads": 2, "add_self_loops": False}, True),
    ("GATv2Conv", {"heads": 2}, False), ("GATv2Conv", {"heads": 2, "edge_dim": 3}, False),
    ("GATv2Conv", {"heads": 2, "share_weights": True}, False),
]
# Layers whose op runs in the projections' 16-bit dtype under autocast.
ROUNDED_CASES = [("TransformerConv", {"heads": 2}, False),
                 ("TransformerConv", {"heads": 2, "edge_dim": 3}, True),
                 ("GCNConv", {}, False), ("GCNConv", {"improved": True}, False)]
# Every layer as a 16-bit model (max / min: the forward only; see the test).
MODEL_CASES = ROUNDED_CASES + GAT_CASES + [
    ("GraphConv", {"aggr": "add"}, True), ("GraphConv", {"aggr": "max"}, False),
    ("SAGEConv", {}, True), ("SAGEConv", {"aggr": "min"}, False)]


def _ids(cases):
    return [f"{name}-{'-'.join(f'{k}={v}' for k, v in opts.items())}{'-bipartite' if bip else ''}"
            for name, opts, bip in cases]


def _problem(device, bipartite, edge_dim):
    n_src, n_dst = (50, 30) if bipartite else (50, 50)
    ei, _ = random_graph(n_src, 300)
    ei[1] %= n_dst
    x = [torch.randn(n_src, 8, device=device)] + \
        ([torch.randn(n_dst, 6, device=device)] if bipartite else [])
    ea = torch.randn(ei.size(1), 3, device=device) if edge_dim else None
    return ei.to(device), x, ea, (8, 6) if bipartite else 8


def _call(layer, x, ei, ea, cast, autocast, dtype, device):
    leaves = [t.detach().to(cast).requires_grad_() for t in x]
    args = (tuple(leaves) if len(leaves) == 2 else leaves[0], ei) + \
        (() if ea is None else (ea.to(cast),))
    with torch.autocast(device.type, dtype=dtype, enabled=autocast):
        return layer(*args), leaves


def _close(what, ours, theirs, exact, floor_rel):
    scale = exact.detach().abs().max().item() if exact.numel() else 0.0
    try:
        assert_no_worse_than_reference(ours.float(), theirs.float(), exact, floor=floor_rel * scale)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


@DTYPES
@pytest.mark.parametrize("name,opts,bipartite", GAT_CASES, ids=_ids(GAT_CASES))
def test_gat_layers_run_the_op_in_float32_on_the_rounded_projections(device, name, opts,
                                                                      bipartite, dtype):
    ei, x, ea, in_channels = _problem(device, bipartite, "edge_dim" in opts)
    pyg, ours = make_pair(name, in_channels, 4, device=device, **opts)
    exact = copy.deepcopy(pyg).double()
    made = {}  # projection module name -> its outputs in gnnio's autocast run, in call order

    def record(key):
        def hook(module, args, out):
            out.retain_grad()
            made.setdefault(key, []).append(out)
        return hook
    linears = [k for k, m in ours.named_modules() if isinstance(m, torch.nn.Linear)]
    handles = [ours.get_submodule(k).register_forward_hook(record(k)) for k in linears]
    out_o, _ = _call(ours, x, ei, ea, torch.float32, True, dtype, device)
    for h in handles:
        h.remove()
    assert out_o.dtype == torch.float32  # PyG's dtype under autocast
    assert all(t.dtype == dtype for outs in made.values() for t in outs)

    fed = {"pyg": {}, "exact": {}}  # the leaves each reference was fed, for their gradients

    def feed(run, key, cast):
        calls = iter(range(len(made[key])))

        def hook(module, args, out):
            leaf = made[key][next(calls)].detach().to(cast).requires_grad_()
            fed[run].setdefault(key, []).append(leaf)
            return leaf
        return hook
    for run, layer, cast in (("pyg", pyg, torch.float32), ("exact", exact, torch.float64)):
        for k in linears:
            layer.get_submodule(k).register_forward_hook(feed(run, k, cast))
    out_p, _ = _call(pyg, x, ei, ea, torch.float32, False, dtype, device)
    out_e, _ = _call(exact, x, ei, ea, torch.float64, False, dtype, device)
    _close("output", out_o, out_p, out_e, 8 * EPS32)

    gout = torch.randn(out_e.shape, device=device)
    out_o.backward(gout)
    out_p.backward(gout)
    out_e.backward(gout.double())
    for k in linears:
        for i, (o, p, e) in enumerate(zip(made[k], fed["pyg"][k], fed["exact"][k])):
            _close(f"gradient reaching {k} (call {i})", o.grad, p.grad, e.grad,
                   8 * EPS32 + 2 * torch.finfo(dtype).eps)
    params_p, params_e = dict(pyg.named_parameters()), dict(exact.named_parameters())
    for key, p in ours.named_parameters():
        if key.startswith("att"):
            assert (p.grad is None) == (params_p[key].grad is None), key
            if p.grad is not None:
                _close(f"grad of {key}", p.grad, params_p[key].grad, params_e[key].grad, 8 * EPS32)


@DTYPES
@pytest.mark.parametrize("name,opts,bipartite", GAT_CASES, ids=_ids(GAT_CASES))
def test_gat_layers_under_autocast_match_pyg(device, name, opts, bipartite, dtype):
    """The whole layer, forward: the same projections (autocast's GEMMs), then gnnio's float32
    op where PyG's float32 message passing (GATv2: PyG rounds x_i + x_j to the dtype again)."""
    ei, x, ea, in_channels = _problem(device, bipartite, "edge_dim" in opts)
    pyg, ours = make_pair(name, in_channels, 4, device=device, negative_slope=1.0, **opts)
    exact = copy.deepcopy(pyg).double()
    out_o, _ = _call(ours, x, ei, ea, torch.float32, True, dtype, device)
    out_p, _ = _call(pyg, x, ei, ea, torch.float32, True, dtype, device)
    out_e, _ = _call(exact, x, ei, ea, torch.float64, False, dtype, device)
    _close("output", out_o, out_p, out_e, 8 * EPS32)


def _check_whole(device, name, opts, bipartite, dtype, model):
    """gnnio's layer and PyG's, both under autocast (or both as 16-bit models), against PyG's in
    float64: the output and, unless the aggregation is max / min, every gradient."""
    ei, x, ea, in_channels = _problem(device, bipartite, "edge_dim" in opts)
    if name in ("GATConv", "GATv2Conv"):
        # 16-bit scores cross LeakyReLU's kink on different edges for the two libraries now and
        # then (as in test_gat_layers_under_autocast_match_pyg), where the slope jumps
        opts = dict(opts, negative_slope=1.0)
    pyg, ours = make_pair(name, in_channels, 4, device=device, **opts)
    exact = copy.deepcopy(pyg).double()
    cast = dtype if model else torch.float32
    if model:
        pyg, ours = pyg.to(dtype), ours.to(dtype)
        exact = copy.deepcopy(pyg).double()  # the rounded weights, exactly
    out_o, x_o = _call(ours, x, ei, ea, cast, not model, dtype, device)
    out_p, x_p = _call(pyg, x, ei, ea, cast, not model, dtype, device)
    out_e, x_e = _call(exact, [t.to(cast) for t in x], ei, ea if ea is None else ea.to(cast),
                       torch.float64, False, dtype, device)
    if name == "TransformerConv" or model:
        assert out_o.dtype == dtype  # (TransformerConv: the skip's addition in the dtype)
    else:
        assert out_o.dtype == out_p.dtype
    eps = torch.finfo(dtype).eps
    degree = (max(int(torch.bincount(ei[k]).max()) for k in (0, 1)) + 1) * 8
    edges = (ei.size(1) + x[-1].size(0)) * 8
    _close("output", out_o, out_p, out_e, (1 + degree ** 0.5) * eps)
    if opts.get("aggr") in ("max", "min"):
        return  # a 16-bit x ties often; PyG's gradient splits among ties, gnnio's takes the first
    gout = torch.randn(out_e.shape, device=device)
    out_o.backward(gout.to(out_o.dtype))
    out_p.backward(gout.to(out_p.dtype))
    out_e.backward(gout.double())
    for k, (a, b, c) in enumerate(zip(x_o, x_p, x_e)):
        _close(f"grad of x[{k}]", a.grad, b.grad, c.grad, (1 + degree ** 0.5) * eps)
    params_p, params_e = dict(pyg.named_parameters()), dict(exact.named_parameters())
    for key, p in ours.named_parameters():
        if params_e[key].grad is not None:
            _close(f"grad of {key}", p.grad, params_p[key].grad, params_e[key].grad,
                   (1 + edges ** 0.5) * eps)


@DTYPES
@pytest.mark.parametrize("name,opts,bipartite", ROUNDED_CASES, ids=_ids(ROUNDED_CASES))
def test_16bit_op_layers_under_autocast(device, name, opts, bipartite, dtype):
    _check_whole(device, name, opts, bipartite, dtype, model=False)


@DTYPES
@pytest.mark.parametrize("name,opts,bipartite", MODEL_CASES, ids=_ids(MODEL_CASES))
def test_16bit_models(device, name, opts, bipartite, dtype):
    _check_whole(device, name, opts, bipartite, dtype, model=True)
