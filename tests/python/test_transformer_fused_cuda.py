"""TransformerConv's fused reassociated form on CUDA (gnnio::transformer_fused_forward: q~, the
walk and W_v in one kernel per tile of 32 destinations; heavy rows in items merged after):
the op against the CPU op in float64 and float32 (no worse than twice the CPU float32 error),
the layer against PyG's in float64 (no worse than twice PyG's float32 error on CUDA), with the
skip fused in the store and without, on a random graph, the 2*10^5-neighbour hub (its row
walked in items), bipartite sizes, a graph without edges, a graph with rows of every kind
(empty, light, 40 heavy) over many tiles, and int64 indices. Skipped without a GPU."""
import copy
import math
import zlib

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from test_attention import make_pair
from test_attention_cuda import GRAPHS
from test_transformer_forms import count_fused
from gnnio.nn.conv._reassociated import _fused_forward

pytestmark = pytest.mark.cuda
EPS32 = torch.finfo(torch.float32).eps
HEADS = [1, 2, 4]  # the kernel's builds: F = H x C = 128


def mixed_graph(n=3000, heavy=40, light=2000, seed=0):
    """Rows of all three kinds across many tiles: `heavy` rows of 600 in-edges (above the
    planner's threshold of 160: walked in items, more heavy rows than one W_v tile of 32 takes),
    `light` rows of 1-20, and the rest (about a third) without edges."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n, generator=gen)
    degree = torch.zeros(n, dtype=torch.long)
    degree[rows[:heavy]] = 600
    degree[rows[heavy:heavy + light]] = torch.randint(1, 21, (light,), generator=gen)
    dst = torch.repeat_interleave(torch.arange(n), degree)
    src = torch.randint(n, (dst.numel(),), generator=gen)
    return torch.stack([src, dst]), (n, n)


FUSED_GRAPHS = dict(GRAPHS, mixed=mixed_graph())


def operands(ns, nd, heads, gen, bias=True, residual=True):
    C = 128 // heads

    def r(*shape, s=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * s
    # scales of a trained layer's: scores of a few units, so the softmax is neither flat nor one-hot
    return dict(x=r(ns, 128), query=r(nd, heads, C, s=0.3), w_key=r(heads * C, 128, s=128 ** -0.5),
                w_value_t=r(128, heads * C, s=128 ** -0.5), b_value=r(heads * C) if bias else None,
                residual=r(nd, heads * C) if residual else None, b_key=r(heads * C) if bias else None)


def op(graph, ops, dtype, device, plan=None):
    """The op on graph's csr_by_dst (on device) through the layer's own call (_fused_forward: the
    plan's split; the launcher builds the item offsets), ops in dtype."""
    t = {k: None if v is None else v.to(device, dtype) for k, v in ops.items()}
    # b_key: the stats' max shift (key_shift in the tiles, empty_rows_kernel and merge_kernel)
    return _fused_forward(graph, t["x"], t["query"], t["w_key"], t.get("b_key"), t["w_value_t"].t(),
                          t["b_value"], t["residual"], t["query"].size(2) ** -0.5, plan)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("graph_name", ["random", "hub_in", "bipartite", "no_edges", "mixed"])
@pytest.mark.parametrize("index", ["int32", "int64"])  # cp.async of 4 and of 8 bytes
def test_cuda_fused_op_against_cpu_float64(graph_name, heads, index):
    """The CUDA kernel sums a score in a lane tree rather than the CPU's quarters (params.h): the
    same rule, not the same bits."""
    ei, (ns, nd) = FUSED_GRAPHS[graph_name]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((graph_name, heads, index)).encode()))
    ops = operands(ns, nd, heads, gen)
    graph_cpu = gnnio.Graph(ei, size=(ns, nd))
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    if index == "int64":
        for g in (graph_cpu, graph):
            csr = g.csr_by_dst
            g.csr_by_dst = type(csr)(csr.rowptr.long(), csr.col.long(), csr.perm.long())
    plan = gnnio.plan.plan_attention(graph, heads * 128)
    if graph_name in ("hub_in", "mixed"):
        assert plan.heavy_rows is not None  # the hub's row (the 40 heavy rows) walked in items
    if graph_name == "mixed":
        assert plan.heavy_rows.numel() == 40
    out, stats = op(graph, ops, torch.float32, "cuda", plan)
    out32, stats32 = op(graph_cpu, ops, torch.float32, "cpu")
    out64, stats64 = op(graph_cpu, ops, torch.float64, "cpu")
    rows = 200_000 if graph_name == "hub_in" else 2000
    for a, b, c in ((out, out32, out64), (stats, stats32, stats64)):
        floor = 4 * math.sqrt(rows) * EPS32 * max(c.abs().max().item(), 1.0)
        assert_no_worse_than_reference(a.cpu(), b, c, floor=floor)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("graph_name", ["random", "hub_in", "bipartite", "no_edges", "mixed"])
@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("bias", [True, False])
def test_cuda_inference_op_writes_the_forward_ops_out_into_residual(graph_name, heads, index, bias):
    """gnnio::transformer_fused_inference: the forward op's out in residual, equal values (the
    same kernels and sums, no stats; rows without edges are not written: out = residual there,
    where a -0 stays -0 and the forward op's residual + 0 is +0), heavy rows' items and their
    merge included."""
    ei, (ns, nd) = FUSED_GRAPHS[graph_name]
    gen = torch.Generator().manual_seed(zlib.crc32(repr((graph_name, heads, index, bias)).encode()))
    ops = operands(ns, nd, heads, gen, bias=bias)
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    if index == "int64":
        csr = graph.csr_by_dst
        graph.csr_by_dst = type(csr)(csr.rowptr.long(), csr.col.long(), csr.perm.long())
    plan = gnnio.plan.plan_attention(graph, heads * 128)
    t = {k: None if v is None else v.to("cuda", torch.float32) for k, v in ops.items()}
    args = (graph, t["x"], t["query"], t["w_key"], t["b_key"], t["w_value_t"].t(), t["b_value"])
    out, _ = _fused_forward(*args, t["residual"], 32 ** -0.5, plan)
    into = t["residual"].clone()
    out_into, stats = _fused_forward(*args, into, 32 ** -0.5, plan, True)
    assert stats is None and out_into.data_ptr() == into.data_ptr()
    assert torch.equal(into, out.view(nd, -1))


def test_cuda_inference_op_refuses_a_misaligned_residual():
    """The kernel stores float4s: a residual that is not 16-byte aligned is refused (not copied:
    the copy would get out) and left as it was."""
    ei, (ns, nd) = FUSED_GRAPHS["random"]
    ops = operands(ns, nd, 4, torch.Generator().manual_seed(2))
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    t = {k: None if v is None else v.to("cuda", torch.float32) for k, v in ops.items()}
    buffer = torch.randn(nd * 128 + 1, device="cuda")
    residual = buffer[1:].view(nd, 128)
    before = residual.clone()
    with pytest.raises(ValueError, match="16-byte aligned"):
        _fused_forward(graph, t["x"], t["query"], t["w_key"], None, t["w_value_t"].t(), t["b_value"],
                       residual, 32 ** -0.5, gnnio.plan.plan_attention(graph, 4 * 128), True)
    assert torch.equal(residual, before)


@pytest.mark.parametrize("bad", [math.inf, math.nan], ids=["inf", "nan"])
def test_cuda_fused_op_keeps_non_finite_rows_to_their_destinations(bad):
    """A source row of x with a non-finite feature, chosen as the last slot of a light row's
    partial chunk (the walk loads that slot's row again for the chunk's slots past the end, at
    weight 0); it feeds heavy rows' items too. The destinations it feeds may turn non-finite; every
    other row's out and stats are finite and match the CPU op on the same input (PYG_CONTRACTS:
    NaN / inf confined to the affected destination rows)."""
    ei, (ns, nd) = FUSED_GRAPHS["mixed"]
    ops = operands(ns, nd, 4, torch.Generator().manual_seed(3))
    graph_cpu = gnnio.Graph(ei, size=(ns, nd))
    csr = graph_cpu.csr_by_dst
    degree = csr.rowptr[1:] - csr.rowptr[:-1]
    row = int(torch.nonzero((degree % 8 != 0) & (degree > 8) & (degree <= 20))[0])
    source = int(csr.col[csr.rowptr[row + 1] - 1])
    ops["x"][source, 5] = bad
    affected = torch.zeros(nd, dtype=torch.bool)
    affected[ei[1][ei[0] == source]] = True
    assert affected[row] and not affected.all()
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    out, stats = op(graph, ops, torch.float32, "cuda", gnnio.plan.plan_attention(graph, 4 * 128))
    ref_out, ref_stats = op(graph_cpu, ops, torch.float64, "cpu")
    ok = ~affected
    for a, c in ((out.cpu(), ref_out), (stats.cpu(), ref_stats)):
        assert torch.isfinite(a[ok]).all() and torch.isfinite(c[ok]).all()
        floor = 4 * math.sqrt(2000) * EPS32 * max(c[ok].abs().max().item(), 1.0)
        torch.testing.assert_close(a[ok].double(), c[ok], rtol=0, atol=floor)
    assert not torch.isfinite(out.cpu()[row]).all()  # (the input reaches the row it feeds)


def test_cuda_fused_op_takes_an_item_of_no_slots():
    """A raw call whose heavy row has an item of no slots first (the planner makes none): the
    merge skips it (its max is -inf; merged, it made the row NaN), as the CPU op, which walks
    the row whole, has nothing to skip. (The walk's loads must load nothing for it: they clamp
    a chunk's slots to its last, and an empty item has none.)"""
    ei, (ns, nd) = FUSED_GRAPHS["hub_in"]
    gen = torch.Generator().manual_seed(1)
    ops = operands(ns, nd, 4, gen)
    graph = gnnio.Graph(ei.cuda(), size=(ns, nd))
    plan = gnnio.plan.plan_attention(graph, 4 * 128)
    items = plan.heavy_items
    empty = torch.stack([items[0, 0], items[0, 1], items[0, 1]]).view(1, 3)
    csr = graph.csr_by_dst
    t = {k: None if v is None else v.to("cuda", torch.float32) for k, v in ops.items()}
    args = (csr.rowptr, csr.col, t["x"], t["query"], t["w_key"].contiguous(),
            t["w_value_t"].contiguous(), t["b_value"], t["residual"], 32 ** -0.5)
    out, stats = torch.ops.gnnio.transformer_fused_forward(
        *args, plan.heavy_rows, torch.cat([empty, items]), plan.light_max_degree, t["b_key"])
    ref_out, ref_stats = op(gnnio.Graph(ei, size=(ns, nd)), ops, torch.float64, "cpu")
    assert torch.isfinite(out).all() and torch.isfinite(stats).all()
    floor = 4 * math.sqrt(200_000) * EPS32
    for a, c in ((out, ref_out), (stats, ref_stats)):
        torch.testing.assert_close(a.cpu().double(), c, rtol=0, atol=floor * max(c.abs().max().item(), 1.0))


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("opt", ["default", "no_root", "beta", "mean", "no_bias", "inference"])
@pytest.mark.parametrize("graph_name", ["random", "hub_in", "bipartite", "no_edges", "mixed"])
def test_cuda_fused_layer_matches_pyg(monkeypatch, graph_name, opt, heads):
    """Output and every gradient against PyG's layer in float64 (CPU): no worse than twice PyG's
    own float32 error on CUDA, with the hub tests' floors (a row of L terms rounds like sqrt(L)
    eps32; a parameter's gradient sums over every row)."""
    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "fused")
    calls = count_fused(monkeypatch)
    ei, (ns, nd) = FUSED_GRAPHS[graph_name]
    kwargs = dict(heads=heads, root_weight=opt != "no_root", beta=opt == "beta",
                  concat=opt != "mean", bias=opt != "no_bias")
    bipartite = ns != nd
    pyg, ours = make_pair("TransformerConv", (128, 64) if bipartite else 128, 128 // heads, **kwargs)
    gen = torch.Generator().manual_seed(zlib.crc32(repr((graph_name, opt, heads)).encode()))
    x = torch.randn(ns, 128, generator=gen)
    x_dst = torch.randn(nd, 64, generator=gen) if bipartite else None
    results = []
    for module, device, dtype in ((ours, "cuda", torch.float32), (pyg, "cuda", torch.float32),
                                  (pyg, "cpu", torch.float64)):
        m = copy.deepcopy(module).to(device=device, dtype=dtype)
        xi = x.to(device, dtype).requires_grad_(opt != "inference")
        inputs = [xi]
        if bipartite:
            inputs.append(x_dst.to(device, dtype).requires_grad_(opt != "inference"))
        arg = tuple(inputs) if bipartite else xi
        if opt == "inference":
            with torch.no_grad():
                results.append([m(arg, ei.to(device)).cpu()])
            continue
        out = m(arg, ei.to(device))
        gout = torch.cos(torch.arange(out.numel(), device=device, dtype=torch.float64)).view_as(out)
        params = dict(m.named_parameters())
        grads = torch.autograd.grad(out, inputs + [params[k] for k in sorted(params)], gout.to(dtype),
                                    allow_unused=True)
        results.append([out.cpu()] + [None if g is None else g.cpu() for g in grads])
    assert calls  # the fused kernel ran (not a fallback)
    rows = ns + ei.size(1)
    for i, (a, b, c) in enumerate(zip(*results)):
        if c is None:
            continue
        k = max(8.0, 4 * math.sqrt(rows)) if i >= 1 + (2 if bipartite else 1) else 2 * math.sqrt(200_000)
        assert_no_worse_than_reference(a, b, c, floor=k * EPS32 * max(c.abs().max().item(), 1.0))


def test_cuda_fused_auto_runs_it_for_inference_only(monkeypatch):
    """'auto' on a graph at the plan's thresholds (2^22+ edges, mean in-degree 12): the fused op
    without a backward (the same bits as the forced form), the direct form with one."""
    monkeypatch.delenv("GNNIO_TRANSFORMER_FORM", raising=False)
    n = 350_000
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(n, (2, 12 * n), generator=gen).cuda()
    assert ei.size(1) >= gnnio.plan.FUSED_AUTO_MIN_EDGES
    conv = gnnio.nn.TransformerConv(128, 32, heads=4).cuda()
    x = torch.randn(n, 128, generator=gen).cuda()
    calls = count_fused(monkeypatch)
    with torch.no_grad():
        out_auto = conv(x, ei)
    assert calls
    calls.clear()
    conv(x.clone().requires_grad_(), ei).sum().backward()
    assert not calls
    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "fused")
    with torch.no_grad():
        assert torch.equal(conv(x, ei), out_auto)


def test_cuda_fused_falls_back_where_the_kernel_does_not_fit(monkeypatch):
    """Shapes the kernel has no build for run the unfused reassociated form, and the plan says so."""
    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "fused")
    form, reason = gnnio.plan.plan_transformer(torch.device("cuda"), edge_term=False, dropout=False,
                                               weights=False, heads=8, features=128, channels=16,
                                               dtype=torch.float32)
    assert form == "reassociated" and "fused asked" in reason
    form, _ = gnnio.plan.plan_transformer(torch.device("cuda"), edge_term=False, dropout=False,
                                          weights=False, heads=4, features=128, channels=32,
                                          dtype=torch.bfloat16)
    assert form == "reassociated"
    ei, (n, _) = GRAPHS["random"]
    pyg, ours = make_pair("TransformerConv", 64, 16, heads=2)
    x = torch.randn(n, 64, device="cuda")
    torch.testing.assert_close(ours.cuda()(x, ei.cuda()), pyg.cuda()(x, ei.cuda()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opts", [{}, {"root_weight": False}], ids=["skip_fused", "no_root"])
def test_cuda_fused_output_changed_in_place(monkeypatch, opts):
    """An in-place activation after the layer, with the skip fused in the store (the default
    options): the node returns no view made inside it."""
    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "fused")
    ei, (n, _) = GRAPHS["random"]
    conv = gnnio.nn.TransformerConv(128, 32, heads=4, **opts).cuda()
    x = torch.randn(n, 128, device="cuda")
    grads = []
    for inplace in (False, True):
        xi = x.clone().requires_grad_()
        out = torch.nn.functional.relu(conv(xi, ei.cuda()), inplace=inplace)
        grads.append(torch.autograd.grad(out.square().sum(), [xi] + list(conv.lin_query.parameters())))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_cuda_fused_takes_a_misaligned_input(monkeypatch):
    """A contiguous x whose data is not 16-byte aligned (one row's column slice) runs: the binding
    copies such an operand for the kernel's float4 loads instead of refusing it."""
    monkeypatch.setenv("GNNIO_TRANSFORMER_FORM", "fused")
    conv = gnnio.nn.TransformerConv(128, 32, heads=4).cuda()
    x = torch.randn(1, 129, device="cuda")[:, 1:]
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    ei = torch.zeros(2, 1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(conv(x, ei), conv(x.clone(), ei), rtol=0, atol=0)
