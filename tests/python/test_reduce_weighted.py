"""The weighted reduction: segment_reduce(edge_weight=w), max / min of w_ji x_j (PyG's GraphConv
message edge_weight * x_j, and torch.sparse.mm(adj, x, 'amax') for a weighted adj_t), with the
gradients of x and of the weights.

The reference is a plain computation in torch on the CPU: the messages rounded once to x's dtype
(torch's own product), the winner of each (row, feature) the earliest edge of the edge_index
order among those equal to the extreme (gnnio's tie rule, so no draw has to avoid ties), and
the gradients summed in float64 over the winners. The float32 results are checked against it
with bounds from the roundings each sum makes."""
import pytest
import torch

import gnnio
from graphs import adversarial, hub, random_graph, real
from layer_pairs import check_against_pyg, make_pair

EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.float64: torch.finfo(torch.float64).eps}


def reference(ei, num_src, num_dst, x, w, reduce):
    """(out, winner): out [num_dst, F] in x's dtype, winner [num_dst, F] the winning edge id
    (-1 for rows without edges), by the tie rule above. On the CPU, in x's dtype."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    x, w = x.detach().cpu(), w.detach().cpu()
    width = x.size(1)
    messages = w[:, None] * x[src]  # [E, F], rounded once to x's dtype by torch
    index = dst[:, None].expand(-1, width)
    out = torch.zeros(num_dst, width, dtype=x.dtype).scatter_reduce(
        0, index, messages, "a" + reduce, include_self=False)
    winning = messages == out[dst]
    edge_ids = torch.arange(ei.size(1))[:, None].expand(-1, width)
    none = torch.full((num_dst, width), ei.size(1), dtype=torch.long)
    winner = none.scatter_reduce(0, index, torch.where(winning, edge_ids, ei.size(1)), "amin")
    return out, torch.where(winner == ei.size(1), -1, winner)


def reference_grads(ei, x, w, winner, gout):
    """float64 gradients of x and w for the given winners, and the magnitudes their sums run
    over (for the error bounds): grad_x[src(e), f] += w_e g[dst(e), f] and
    grad_w[e] += g[dst(e), f] x[src(e), f] for every winning (e, f)."""
    x64, w64, g64 = x.detach().cpu().double(), w.detach().cpu().double(), gout.detach().cpu().double()
    rows, feats = (winner >= 0).nonzero(as_tuple=True)
    e = winner[rows, feats]
    src = ei[0].cpu()[e]
    to_x = w64[e] * g64[rows, feats]
    to_w = g64[rows, feats] * x64[src, feats]
    grad_x = torch.zeros_like(x64).index_put_((src, feats), to_x, accumulate=True)
    mass_x = torch.zeros_like(x64).index_put_((src, feats), to_x.abs(), accumulate=True)
    grad_w = torch.zeros_like(w64).index_add_(0, e, to_w)
    mass_w = torch.zeros_like(w64).index_add_(0, e, to_w.abs())
    return grad_x, mass_x, grad_w, mass_w


def edge_of_slot(graph, arg):
    """arg's CSR slots as edge ids of the edge_index order (-1 stays -1)."""
    perm = graph.csr_by_dst.perm.long().cpu()
    return torch.cat([perm, perm.new_tensor([-1])])[arg.long().cpu()]


def check(ei, num_src, num_dst, x, w, reduce):
    """gnnio's weighted reduction on x's device against the reference: out and arg exactly,
    grad_x within (out-degree + 2) eps of its terms' magnitude (each term w g rounded, then at
    most out-degree float additions), grad_w within (width + 2) eps (at most width products
    of g x, each rounded, added in order)."""
    dtype = x.dtype
    graph = gnnio.Graph(ei.to(x.device), size=(num_src, num_dst))
    xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out, arg = gnnio.ops.segment_reduce(graph, xg, reduce, return_arg=True, edge_weight=wg)
    want, winner = reference(ei, num_src, num_dst, x, w, reduce)
    assert torch.equal(out.cpu(), want)
    assert torch.equal(edge_of_slot(graph, arg), winner)
    gout = torch.randn(out.shape, dtype=dtype, device=out.device)
    grad_x, grad_w = torch.autograd.grad(out, (xg, wg), gout)
    ref_x, mass_x, ref_w, mass_w = reference_grads(ei, x, w, winner, gout)
    out_degree = torch.bincount(ei[0].cpu(), minlength=num_src).clamp(min=1)[:, None].double()
    assert ((grad_x.cpu().double() - ref_x).abs() <= (out_degree + 2) * EPS[dtype] * mass_x).all()
    width = x.size(1)
    assert ((grad_w.cpu().double() - ref_w).abs() <= (width + 2) * EPS[dtype] * mass_w).all()
    return out, arg, grad_x, grad_w


def weights(num_edges, device="cpu", dtype=torch.float32):
    """Signed weights away from 0: a negative weight turns a max into a min of its source."""
    magnitude = torch.rand(num_edges, dtype=torch.float64) + 0.25
    sign = torch.where(torch.rand(num_edges) < 0.3, -1.0, 1.0).double()
    return (magnitude * sign).to(dtype).to(device)


def cases():
    return [("cora",) + real("cora"), ("as20000102",) + real("as20000102")] + adversarial()


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("width", [1, 3, 33, 130])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_weighted_matches_reference(device, name, ei, n, width, reduce):
    check(ei, n, n, torch.randn(n, width, device=device), weights(ei.size(1), device), reduce)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_weighted_float64(device, reduce):
    ei, n = random_graph(200, 3000)
    x = torch.randn(n, 17, dtype=torch.float64, device=device)
    check(ei, n, n, x, weights(ei.size(1), device, torch.float64), reduce)


def test_ties_go_to_the_earliest_edge(device):
    # Zero weights make every message of node 0 a 0: a tie the earliest edge (3 -> 0) wins, and
    # only it gets a weight gradient (g x_3); x's gradient is 0 * g everywhere.
    ei = torch.tensor([[3, 1, 2], [0, 0, 0]])
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0]], device=device, requires_grad=True)
    w = torch.zeros(3, device=device, requires_grad=True)
    out = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), num_nodes=4), x, "max", edge_weight=w)
    grad_x, grad_w = torch.autograd.grad(out.sum(), (x, w))
    assert out.tolist() == [[0.0], [0.0], [0.0], [0.0]]
    assert grad_w.tolist() == [4.0, 0.0, 0.0] and grad_x.eq(0).all()


def test_duplicate_edges_are_separate_messages(device):
    # Three copies of 0 -> 1 with weights 1, 3, 2: the second copy wins and alone gets w's gradient.
    ei = torch.tensor([[0, 0, 0], [1, 1, 1]])
    x = torch.tensor([[2.0, -1.0], [0.0, 0.0]], device=device, requires_grad=True)
    w = torch.tensor([1.0, 3.0, 2.0], device=device, requires_grad=True)
    out = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), num_nodes=2), x, "max", edge_weight=w)
    assert out.tolist() == [[0.0, 0.0], [6.0, -1.0]]
    grad_x, grad_w = torch.autograd.grad(out.sum(), (x, w))
    assert grad_w.tolist() == [-1.0, 2.0, 0.0]  # feature 1: -1 * w is largest for w = 1
    assert grad_x.tolist() == [[3.0, 1.0], [0.0, 0.0]]


def test_bipartite_both_ways(device):
    for ns, nd in [(13, 40), (40, 13)]:
        ei = torch.stack([torch.randint(ns, (150,)), torch.randint(nd, (150,))])
        check(ei, ns, nd, torch.randn(ns, 6, device=device), weights(150, device), "min")


@pytest.mark.slow
def test_hub_of_100k_neighbours(device):
    ei, n = hub(100_000)
    check(ei, n, n, torch.randn(n, 16, device=device), weights(ei.size(1), device), "max")
    check(ei.flip(0), n, n, torch.randn(n, 16, device=device), weights(ei.size(1), device), "min")


def test_rows_of_a_wider_tensor(device):
    # x a column slice of a wider tensor (rows x_row_stride apart): the kernels read it in place
    # and give the bits of its contiguous copy, both gradients included.
    ei, n = random_graph(300, 4000)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    big = torch.randn(n, 37, device=device)
    w = weights(4000, device)
    gout = torch.randn(n, 32, device=device)
    strided = big.clone().requires_grad_()[:, 2:34]
    dense = big[:, 2:34].contiguous().requires_grad_()
    assert strided.stride() == (37, 1)
    runs = []
    for rows in (strided, dense):
        wg = w.clone().requires_grad_()
        out, arg = gnnio.ops.segment_reduce(g, rows, "max", return_arg=True, edge_weight=wg)
        runs.append((out, arg, *torch.autograd.grad(out, (rows, wg), gout)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_unit_weights_are_the_unweighted_reduction(device):
    ei, n = real("cora")
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 9, device=device)
    ones = torch.ones(ei.size(1), device=device)
    for reduce in ("max", "min"):
        a = gnnio.ops.segment_reduce(g, x, reduce, return_arg=True)
        b = gnnio.ops.segment_reduce(g, x, reduce, return_arg=True, edge_weight=ones)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_only_the_weight_needs_a_gradient(device):
    ei, n = random_graph(30, 200)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 5, device=device)
    w = weights(200, device).requires_grad_()
    out = gnnio.ops.segment_reduce(g, x, "max", edge_weight=w)
    (grad_w,) = torch.autograd.grad(out.sum(), w)
    _, winner = reference(ei, n, n, x, w, "max")
    _, _, ref_w, mass_w = reference_grads(ei, x, w, winner, torch.ones(n, 5))
    assert ((grad_w.cpu().double() - ref_w).abs() <= 7 * EPS[torch.float32] * mass_w).all()


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_gradcheck_float64(reduce):
    ei, n = random_graph(12, 40)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    w = weights(40, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: gnnio.ops.segment_reduce(g, x, reduce, edge_weight=w), (x, w))


def test_bad_weights_raise():
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    x = torch.randn(n, 4)
    with pytest.raises(ValueError, match="num_edges"):
        gnnio.ops.segment_reduce(g, x, "max", edge_weight=torch.rand(29))
    with pytest.raises(TypeError, match="floating point"):
        gnnio.ops.segment_reduce(g, x, "max", edge_weight=torch.ones(30, dtype=torch.long))
    f, t = g.csr_by_dst, g.csr_by_src
    op_args = (f.rowptr, f.col, x, n, n, "max", t.rowptr, t.col, g.src_slot_to_dst_slot)
    with pytest.raises(ValueError, match="weight must have the features' dtype"):
        torch.ops.gnnio.segment_reduce(*op_args, weight=torch.rand(30, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight must be a contiguous \[nnz\]"):
        torch.ops.gnnio.segment_reduce(*op_args, weight=torch.rand(31))


def test_opcheck():
    ei, n = random_graph(10, 30)
    g = gnnio.Graph(ei, num_nodes=n)
    f, t = g.csr_by_dst, g.csr_by_src
    x = torch.randn(n, 4, requires_grad=True)
    w = weights(30).requires_grad_()
    torch.library.opcheck(torch.ops.gnnio.segment_reduce.default,
                          (f.rowptr, f.col, x, n, n, "max", t.rowptr, t.col, g.src_slot_to_dst_slot,
                           None, None, 2**62, None, None, 2**62, w))
    _, arg = gnnio.ops.segment_reduce(g, x, "max", return_arg=True)
    torch.library.opcheck(torch.ops.gnnio.segment_reduce_weight_backward.default,
                          (f.col, x.detach(), arg, torch.randn(n, 4)))


# ---------------------------------------------------------------------------------------------
# Layers against PyG (the same weights, fresh inputs; outputs and every gradient, edge weights'
# included, within 2x PyG's own float32 error against its float64).

@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_graph_conv_with_edge_weight_matches_pyg(device, name, ei, n, aggr):
    pyg, ours = make_pair("GraphConv", 9, 5, device=device, aggr=aggr)
    ei = ei.to(device)
    inputs = {"x": torch.randn(n, 9, device=device), "edge_weight": weights(ei.size(1), device)}
    check_against_pyg(pyg, ours, lambda layer, t: layer(t["x"], ei, t["edge_weight"]), inputs,
                      edge_weight_terms=9)


def test_graph_conv_bipartite_with_edge_weight_matches_pyg(device):
    pyg, ours = make_pair("GraphConv", (7, 4), 5, device=device, aggr="max")
    ei = torch.stack([torch.randint(30, (250,)), torch.randint(12, (250,))]).to(device)
    inputs = {"x_src": torch.randn(30, 7, device=device), "x_dst": torch.randn(12, 4, device=device),
              "edge_weight": weights(250, device)}
    check_against_pyg(pyg, ours, lambda layer, t: layer((t["x_src"], t["x_dst"]), ei, t["edge_weight"]),
                      inputs, edge_weight_terms=7)


# ---------------------------------------------------------------------------------------------
# CUDA: the light kernel and the weight gradient against the CPU kernel. (The heavy tiles on a
# 10^6-neighbour hub, weighted and not: test_reduce.py's test_cuda_matches_cpu_bitwise.)

@pytest.mark.cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_weighted_random_matches_cpu_bitwise(dtype, index_dtype):
    # Light rows only (the op without a split): the CUDA kernels add in the CPU kernels' order
    # with the same roundings (one product, then one addition), so out, arg and both gradients
    # are the same bits. The op is called directly to reach both index types (a Graph narrows
    # to int32 below 2^31 nodes and edges).
    ei, n = random_graph(3000, 60_000)
    x = torch.randn(n, 70, dtype=dtype)
    w = weights(ei.size(1), dtype=dtype)
    gout = torch.randn(n, 70, dtype=dtype)
    runs = []
    for dev, index in (("cpu", torch.int32), ("cuda", index_dtype)):
        g = gnnio.Graph(ei.to(dev), num_nodes=n)
        f, t = g.csr_by_dst, g.csr_by_src
        xd, wd = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        structure = [a.to(index) for a in (f.rowptr, f.col)]
        transpose = [a.to(index) for a in (t.rowptr, t.col, g.src_slot_to_dst_slot)]
        out, arg = torch.ops.gnnio.segment_reduce(*structure, xd, n, n, "max", *transpose,
                                                  weight=wd[f.perm.long()])
        grads = torch.autograd.grad(out, (xd, wd), gout.to(dev))
        runs.append([out.cpu(), arg.long().cpu()] + [a.cpu() for a in grads])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_weighted_matches_reference(dtype):
    # 16-bit messages rounded once, as torch's product: the reference's out is exact.
    ei, n = real("as20000102")
    x = torch.randn(n, 40).to(dtype)
    w = weights(ei.size(1), dtype=dtype)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    out, arg = gnnio.ops.segment_reduce(g, x.cuda(), "max", return_arg=True, edge_weight=w.cuda())
    want, winner = reference(ei, n, n, x, w, "max")
    assert torch.equal(out.cpu(), want)
    assert torch.equal(edge_of_slot(g, arg), winner)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_16bit_gradients_against_float64(dtype):
    # The 16-bit products w g and g x are exact in float32; CUDA adds them in float32 and rounds
    # once to the dtype: (terms + 2) float32 eps of their magnitude plus the rounding to the dtype,
    # half an ulp (relative) or, below the dtype's smallest normal, half the subnormal spacing
    # (float16's is 2^-24: a gradient near 1e-5 is a subnormal there).
    ei, n = real("as20000102")
    x = torch.randn(n, 40).to(dtype)
    w = weights(ei.size(1), dtype=dtype)
    gout = torch.randn(n, 40).to(dtype)
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    xc, wc = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    out = gnnio.ops.segment_reduce(g, xc, "max", edge_weight=wc)
    grad_x, grad_w = (t.cpu().double() for t in torch.autograd.grad(out, (xc, wc), gout.cuda()))
    _, winner = reference(ei, n, n, x, w, "max")
    ref_x, mass_x, ref_w, mass_w = reference_grads(ei, x, w, winner, gout)
    info = torch.finfo(dtype)
    unit, subnormal = info.eps / 2, info.tiny * info.eps / 2
    out_degree = torch.bincount(ei[0], minlength=n).clamp(min=1)[:, None].double()
    eps = EPS[torch.float32]
    assert ((grad_x - ref_x).abs() <= (out_degree + 2) * eps * mass_x + unit * ref_x.abs() + subnormal).all()
    assert ((grad_w - ref_w).abs() <= 42 * eps * mass_w + unit * ref_w.abs() + subnormal).all()


@pytest.mark.cuda
def test_cuda_weighted_is_deterministic():
    ei, n = hub(200_000)
    ei = torch.cat([ei, ei.flip(0)], 1)  # a hub on both sides: heavy tiles forward and backward
    g = gnnio.Graph(ei.cuda(), num_nodes=n)
    x = torch.randn(n, 37, device="cuda", requires_grad=True)
    w = weights(ei.size(1), "cuda").requires_grad_()
    gout = torch.randn(n, 37, device="cuda")
    runs = []
    for _ in range(2):
        out, arg = gnnio.ops.segment_reduce(g, x, "min", return_arg=True, edge_weight=w)
        runs.append((out, arg, *torch.autograd.grad(out, (x, w), gout)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_slot_weights_are_kept_while_the_weight_is_unchanged(device):
    # A fixed edge_weight (no gradient) is put in slot order once; an in-place change, a weight
    # that needs a gradient or an inference tensor is gathered again.
    ei, n = random_graph(40, 300)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 6, device=device)
    w = weights(300, device)
    first = g.slot_weights(w, torch.float32)
    assert g.slot_weights(w, torch.float32) is first
    assert torch.equal(first, w[g.csr_by_dst.perm.long()])
    transposed = g.slot_weights(w, torch.float32, transpose=True)
    assert torch.equal(transposed, w[g.csr_by_src.perm.long()])
    before = gnnio.ops.segment_reduce(g, x, "max", edge_weight=w)
    w.mul_(-1)  # in place: the version counter moves
    again = g.slot_weights(w, torch.float32)
    assert again is not first and torch.equal(again, w[g.csr_by_dst.perm.long()])
    after = gnnio.ops.segment_reduce(g, x, "max", edge_weight=w)
    fresh = gnnio.ops.segment_reduce(gnnio.Graph(ei.to(device), num_nodes=n), x, "max", edge_weight=w)
    assert torch.equal(after, fresh) and not torch.equal(after, before)
    assert torch.equal(gnnio.ops.spmm(g, x, w), gnnio.ops.spmm(gnnio.Graph(ei.to(device), num_nodes=n), x, w))
    learnable = w.clone().requires_grad_()
    assert g.slot_weights(learnable, torch.float32).grad_fn is not None
    with torch.inference_mode():
        frozen = weights(300, device)
        assert g.slot_weights(frozen, torch.float32) is not g.slot_weights(frozen, torch.float32)
