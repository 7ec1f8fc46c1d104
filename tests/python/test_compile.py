"""torch.compile: gnnio's ops have fake kernels, so models of gnnio layers compile and agree with
eager execution. (Graph construction reads ids back to the host to validate them, so a Graph is
built outside the compiled region, or on an eager first call.)"""
import pytest
import torch
import torch._dynamo.testing

import gnnio
from graphs import random_graph, real


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = gnnio.nn.GCNConv(16, 32)
        self.c2 = gnnio.nn.SAGEConv(32, 8, aggr="max")
        self.c3 = gnnio.nn.GraphConv(8, 4, aggr="mean")

    def forward(self, x, edge_index):
        return self.c3(self.c2(self.c1(x, edge_index).relu(), edge_index), edge_index)


class AttentionNet(torch.nn.Module):
    # Eval mode: dropout's seed is drawn on the host each call, which a compiled graph would fix.
    def __init__(self):
        super().__init__()
        self.c1 = gnnio.nn.GATConv(16, 8, heads=2)
        self.c2 = gnnio.nn.GATv2Conv(16, 8, heads=2, concat=False)
        self.c3 = gnnio.nn.TransformerConv(8, 4, heads=2)

    def forward(self, x, edge_index):
        return self.c3(self.c2(self.c1(x, edge_index).relu(), edge_index).relu(), edge_index)


def assert_reordering_close(a, b, terms):
    # Inductor fuses and reorders float32 reductions (bias gradients sum over all nodes):
    # the difference is bounded by terms * eps of the largest magnitude involved.
    bound = terms * torch.finfo(torch.float32).eps * max(b.abs().max().item(), 1.0)
    assert (a - b).abs().max().item() <= bound


def check_compiled(device, as_graph, net, expect_ops=()):
    """net compiled (fullgraph with a Graph) against eager, outputs and gradients, twice; the
    profiled compiled calls ran every op in expect_ops. The eager reference runs on its own Graph,
    so the compiled model's Graph is warmed by one forward only (fullgraph needs the Graph's
    caches filled, and whatever a backward needs must be built by the forward)."""
    torch._dynamo.reset()
    ei, n = real("cora")
    ei = ei.to(device)
    x = torch.randn(n, 16, device=device, requires_grad=True)
    eager, compiled = net().to(device).eval(), net().to(device).eval()
    compiled.load_state_dict(eager.state_dict())
    structure = gnnio.Graph(ei, num_nodes=n) if as_graph else ei
    ref = eager(x, gnnio.Graph(ei, num_nodes=n) if as_graph else ei)
    ref_grads = torch.autograd.grad(ref.sum(), [x] + list(eager.parameters()))
    if as_graph:
        compiled(x, structure)
    model = torch.compile(compiled, fullgraph=as_graph)
    with torch.profiler.profile() as prof:
        for _ in range(2):
            out = model(x, structure)
            grads = torch.autograd.grad(out.sum(), [x] + list(compiled.parameters()))
            assert_reordering_close(out, ref, terms=n)
            for a, b in zip(grads, ref_grads):
                assert_reordering_close(a, b, terms=n)
    assert set(expect_ops) <= {e.name for e in prof.events()}


@pytest.mark.parametrize("net", [Net, AttentionNet], ids=["spmm_reduce", "attention"])
@pytest.mark.parametrize("as_graph", [False, True])
def test_compiled_model_matches_eager(device, as_graph, net):
    check_compiled(device, as_graph, net)


def test_compiled_attention_model_without_grad_matches_eager(device):
    """Inference (no grad mode) compiled with fullgraph: the layers' shared-input linears run as
    plain calls there (an autograd Function did not trace under no_grad), and on CUDA the plan
    may pick TransformerConv's fused form. The same F.linear calls: the eager outputs' bits."""
    torch._dynamo.reset()
    ei, n = real("cora")
    graph = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 16, device=device)
    net = AttentionNet().to(device).eval()
    with torch.no_grad():
        ref = net(x, graph)
        out = torch.compile(net, fullgraph=True)(x, graph)
    assert_reordering_close(out, ref, terms=n)


def test_opcheck_csr_from_coo():
    ei, n = random_graph(12, 50)
    torch.library.opcheck(torch.ops.gnnio.csr_from_coo.default, (ei[1].int(), ei[0].int(), n, n))


@pytest.mark.parametrize("as_graph", [False, True])
def test_compiled_wsb_attention_matches_eager(device, as_graph, monkeypatch):
    # GATConv on WSB tiles (the variable routes it; GATv2Conv and TransformerConv stay on the
    # CSR kernels): its Python autograd Function and the tile ops trace, fullgraph included.
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    check_compiled(device, as_graph, AttentionNet,
                   {"gnnio::wsb_gat_attention", "gnnio::wsb_gat_attention_backward"})


class DropoutNet(AttentionNet):
    """AttentionNet's layers with attention dropout (used in training mode)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.c1 = gnnio.nn.GATConv(16, 8, heads=2, dropout=0.3)
        self.c2 = gnnio.nn.GATv2Conv(16, 8, heads=2, concat=False, dropout=0.3)
        self.c3 = gnnio.nn.TransformerConv(8, 4, heads=2, dropout=0.3)


def test_compiled_training_dropout_fullgraph(device):
    """Training-mode attention dropout compiled with fullgraph: each layer draws its mask's seed
    from torch's default generator inside the graph (a symbolic int there, which the op's SymInt
    seed takes; an int() of it failed to trace). aot_eager keeps the generator's own draws, so
    after the same torch.manual_seed the compiled model has eager's masks: the same outputs and
    gradients (the backward's mask is the forward's). Another seed gives other masks, with no
    recompilation."""
    torch._dynamo.reset()
    ei, n = real("cora")
    graph = gnnio.Graph(ei.to(device), num_nodes=n)
    x = torch.randn(n, 16, device=device, requires_grad=True)
    eager, compiled = DropoutNet().to(device).train(), DropoutNet().to(device).train()
    compiled.load_state_dict(eager.state_dict())
    compiled(x, graph)  # fills the Graph's caches (fullgraph cannot build them)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model = torch.compile(compiled, fullgraph=True, backend=counter)
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        ref = eager(x, graph)
        ref_grads = torch.autograd.grad(ref.sum(), [x] + list(eager.parameters()))
        torch.manual_seed(seed)
        out = model(x, graph)
        grads = torch.autograd.grad(out.sum(), [x] + list(compiled.parameters()))
        assert_reordering_close(out, ref, terms=n)
        for a, b in zip(grads, ref_grads):
            assert_reordering_close(a, b, terms=n)
        outs.append(out.detach())
    assert not torch.equal(outs[0], outs[1])
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GATConv"])
def test_export_is_refused_clearly(name):
    """torch.export traces with fake tensors, and building a Graph reads edge ids on the host:
    a NotImplementedError that says so, not torch's data-pointer error from deep inside."""
    ei, n = random_graph(30, 100)
    layer = getattr(gnnio.nn, name)(8, 4)
    with pytest.raises(NotImplementedError, match="torch.export"):
        torch.export.export(layer, (torch.randn(n, 8), ei))


def test_attention_backward_fake_returns_in_place_gradients():
    """needs 3 (backward_in_place: d value / d key written into their operands, which the op
    returns) has full-shaped gradients in the fake kernel too. It returned empty ones, so an
    attention op traced with in-place gradients (its call decided outside the compiled region)
    failed AOT autograd's shape check ("invalid gradient ... got [0]")."""
    from gnnio._ops import _graph_attention_backward_fake as fake
    meta = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    value, query, key = meta(5, 2, 4), meta(3, 2, 4), meta(5, 2, 4)
    operands = [None, None, None, query, key, None, None, None]
    needs = [3, 0, 0, 0, 1, 3, 0, 0, 0]
    e = meta(0).long()
    grads = fake(e, e, 2, value, operands, 3, [0.2, 0.5, 0.0], 0, e, e, e, [None] * 4, [0, 0],
                 meta(3, 2, 4), meta(3, 2, 2), meta(3, 2, 4), needs)
    assert [tuple(g.shape) for g in grads] == [(5, 2, 4), (0,), (0,), (0,), (3, 2, 4), (5, 2, 4),
                                               (0,), (0,), (0,)]


def _dot_attention_in_place(device):
    """The raw dot-attention op asking for the in-place backward (d key, d value written into
    key's and value's memory: private projections, as TransformerConv passes them), and the
    leaves its key and value are made from."""
    ei, n = random_graph(60, 400)
    g = gnnio.Graph(ei.to(device), num_nodes=n)
    fwd, (rowptr_t, col_t), t2c = g.csr_by_dst, g.backward_csr(True), g.src_slot_to_dst_slot

    def op(q, k_leaf, v_leaf):
        k, v = k_leaf * 1.0, v_leaf * 1.0  # private: the op may overwrite them
        out, _, _, _ = torch.ops.gnnio.graph_attention(
            fwd.rowptr, fwd.col, 2, v, None, None, None, q, k, None, None, None, n, 0.2, 0.5,
            0.0, 0, False, rowptr_t, col_t, t2c, backward_in_place=True)
        return out
    leaves = [torch.randn(n, 2, 8, device=device, requires_grad=True) for _ in range(3)]
    return op, leaves


@pytest.mark.cuda
def test_compiled_attention_op_with_in_place_backward_matches_eager():
    """The op traced with backward_in_place=True (which graph_attention asks for only outside
    torch.compile, so a traced op sees it only when that decision ran eagerly): AOT autograd
    takes the fake kernel's gradient shapes for needs 3, then the same values as eager."""
    torch._dynamo.reset()
    op, leaves = _dot_attention_in_place("cuda")
    eager_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = torch.compile(op, fullgraph=True, backend="aot_eager")(*leaves)
    ref = op(*eager_leaves)
    gout = torch.randn_like(ref)
    out.backward(gout)
    ref.backward(gout)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for a, b in zip(leaves, eager_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
