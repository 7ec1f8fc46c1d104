"""GAT attention on WSB tiles (graph_attention(backend='wsb')) on the CPU: forward and every
gradient against float64 with bounds derived from the roundings (wsb_attention_checks.py), on the
shapes tiles make awkward, gradcheck, PyG's GATConv on the same weights, routing and refusals.
The CUDA kernels' tests are in test_wsb_attention_cuda.py."""
import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import hub
from gnnio.plan import attention_backend
from test_wsb import CASES, IDS
from wsb_attention_checks import check_op, wsb_op

pyg_nn = pytest.importorskip("torch_geometric.nn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("dst", [True, False], ids=["dst_score", "no_dst_score"])
@pytest.mark.parametrize("name,ei,ns,nd", CASES, ids=IDS)
def test_cpu_against_float64(name, ei, ns, nd, dst, dtype):
    g = gnnio.Graph(ei, size=(ns, nd))
    u = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    check_op(wsb_op(g), ei, ns, nd, 3, 20, dtype, "cpu", dst=dst, u=u)


@pytest.mark.parametrize("heads,channels", [(1, 1), (5, 7), (2, 128)])
@pytest.mark.parametrize("slope", [0.2, 1.5, -0.3])
def test_cpu_heads_channels_and_slopes(heads, channels, slope):
    ei = torch.randint(0, 40, (2, 500))
    g = gnnio.Graph(ei, num_nodes=40)
    check_op(wsb_op(g, slope), ei, 40, 40, heads, channels, torch.float32, "cpu", slope=slope)


@pytest.mark.parametrize("shift", [0.0, 3.0], ids=["zero_mean", "shifted"])
def test_cpu_hub_of_100k_neighbours(shift):
    # Shifted values make the hub row's bound as tight as its output: a missing tile of the
    # hub's edges fails there (zero-mean values leave out small against sum P |v|).
    ei, n = hub(100_000)
    g = gnnio.Graph(ei, num_nodes=n)
    check_op(wsb_op(g), ei, n, n, 2, 8, torch.float32, "cpu", shift=shift)


def test_gradcheck_float64():
    ei = torch.tensor([[0, 0, 0, 1, 2, 2, 3, 17, 17, 30], [1, 1, 2, 2, 0, 0, 20, 20, 3, 3]])
    g = gnnio.Graph(ei, size=(31, 21))
    gen = torch.Generator().manual_seed(3)
    v = torch.randn(31, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    s = torch.randn(31, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    d = torch.randn(21, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(wsb_op(g), (v, s, d))
    assert torch.autograd.gradcheck(lambda v, s: wsb_op(g)(v, s, None), (v, s))


def test_cpu_is_deterministic():
    ei = torch.randint(0, 300, (2, 6000))
    g = gnnio.Graph(ei, num_nodes=300)
    v = torch.randn(300, 4, 32, requires_grad=True)
    s, d = torch.randn(300, 4, requires_grad=True), torch.randn(300, 4, requires_grad=True)
    runs = []
    for _ in range(2):
        out = wsb_op(g)(v, s, d)
        runs.append((out, *torch.autograd.grad(out, (v, s, d), torch.ones_like(out))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cpu_16bit_runs_in_float32_rounded_once(dtype):
    """The CPU kernels take float32 and float64; 16-bit operands run as float32 copies, each
    result rounded once to the dtype (the CUDA kernels' precision model), as the CSR ops do."""
    ei = torch.randint(0, 50, (2, 400))
    g = gnnio.Graph(ei, num_nodes=50)
    v, s = torch.randn(50, 2, 16).to(dtype), torch.randn(50, 2).to(dtype)
    leaves16 = [t.clone().requires_grad_() for t in (v, s)]
    leaves32 = [t.float().requires_grad_() for t in (v, s)]
    out16, out32 = wsb_op(g)(*leaves16, None), wsb_op(g)(*leaves32, None)
    assert out16.dtype == dtype and torch.equal(out16, out32.to(dtype))
    gout = torch.randn(out16.shape).to(dtype)
    out16.backward(gout)
    out32.backward(gout.float())
    for a, b in zip(leaves16, leaves32):
        assert a.grad.dtype == dtype and torch.equal(a.grad, b.grad.to(dtype))


def test_operand_shapes_are_checked():
    ei = torch.tensor([[39, 35], [0, 1]])
    g = gnnio.Graph(ei, num_nodes=40)
    with pytest.raises(ValueError, match="num_src=40"):
        gnnio.wsb_attention.wsb_gat_attention(g, torch.randn(3, 1, 4), torch.randn(3, 1))
    with pytest.raises(ValueError, match="src_score"):
        gnnio.wsb_attention.wsb_gat_attention(g, torch.randn(40, 1, 4), torch.randn(39, 1))
    with pytest.raises(ValueError, match="dst_score"):
        gnnio.wsb_attention.wsb_gat_attention(g, torch.randn(40, 1, 4), torch.randn(40, 1),
                                              torch.randn(40, 2))
    w = g.wsb()
    with pytest.raises(ValueError, match="3 rows but the tiles have 40"):  # the op's own check
        torch.ops.gnnio.wsb_gat_attention(w.block_rowptr, w.block_col, g.wsb_counts(),
                                          torch.randn(3, 1), None, torch.randn(3, 1, 4), 40, 40,
                                          0.2, False)


class Spy:
    """Counts the calls of gnnio.ops' wsb_gat_attention: proof that a layer took the tiles."""

    def __init__(self, monkeypatch):
        self.calls, real = 0, gnnio.ops.wsb_gat_attention

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(gnnio.ops, "wsb_gat_attention", spy)


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False)])
def test_gatconv_through_wsb_against_pyg(monkeypatch, heads, concat, add_self_loops):
    # The layer reaches the WSB kernels by the variable (auto keeps a graph this small on the
    # CSR kernels); PyG's float32 layer and a float64 copy judge the error (the suite's 2x rule).
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    spy = Spy(monkeypatch)
    torch.manual_seed(0)
    n, f_in, f_out = 60, 12, 8
    ei = torch.randint(0, n, (2, 700))
    ours = gnnio.nn.GATConv(f_in, f_out, heads=heads, concat=concat, add_self_loops=add_self_loops)
    theirs = pyg_nn.GATConv(f_in, f_out, heads=heads, concat=concat, add_self_loops=add_self_loops)
    theirs.load_state_dict(ours.state_dict())
    exact = pyg_nn.GATConv(f_in, f_out, heads=heads, concat=concat, add_self_loops=add_self_loops).double()
    exact.load_state_dict(ours.state_dict())
    x = torch.randn(n, f_in, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, ref, ref64 = ours(x, ei), theirs(x, ei), exact(x64, ei)
    assert spy.calls == 1
    assert_no_worse_than_reference(out, ref, ref64)
    gout = torch.randn_like(out)
    g_ours = torch.autograd.grad(out, [x, *ours.parameters()], gout)
    g_theirs = torch.autograd.grad(ref, [x, *theirs.parameters()], gout)
    g_exact = torch.autograd.grad(ref64, [x64, *exact.parameters()], gout.double())
    for a, b, c in zip(g_ours, g_theirs, g_exact):
        assert_no_worse_than_reference(a, b, c)


def test_wsb_route_is_taken(monkeypatch):
    # backend='wsb' and the variable reach the tile kernels (their rounding differs from the
    # CSR kernels' somewhere on a graph this size); 'csr' and the variable's 'csr' do not.
    ei = torch.randint(0, 200, (2, 5000))
    g = gnnio.Graph(ei, num_nodes=200)
    v, s, d = torch.randn(200, 2, 16), torch.randn(200, 2), torch.randn(200, 2)
    csr = gnnio.ops.graph_attention(g, "gat", v, src_score=s, dst_score=d, backend="csr")
    direct = gnnio.wsb_attention.wsb_gat_attention(g, v, s, d)
    assert torch.equal(wsb_op(g)(v, s, d), direct)
    assert not torch.equal(direct, csr)
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    assert torch.equal(gnnio.ops.graph_attention(g, "gat", v, src_score=s, dst_score=d), direct)
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "csr")
    assert torch.equal(gnnio.ops.graph_attention(g, "gat", v, src_score=s, dst_score=d), csr)


def test_att_form_and_bias_on_wsb():
    # kind 'gat' with att [2, H, C] (scores from value's rows) and an output bias.
    ei = torch.randint(0, 30, (2, 200))
    g = gnnio.Graph(ei, num_nodes=30)
    v, att, bias = torch.randn(30, 2, 4), torch.randn(2, 2, 4), torch.randn(8)
    scores = gnnio.ops.head_scores(v, att)
    want = gnnio.wsb_attention.wsb_gat_attention(g, v, scores[0], scores[1]) + bias.view(2, 4)
    got = gnnio.ops.graph_attention(g, "gat", v, att=att, bias=bias, backend="wsb")
    assert torch.equal(got, want)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(dropout=0.5), "dropout"),
    (dict(return_weights=True), "returned weights"),
    (dict(edge_score=True), "edge terms"),
    (dict(channels=129), "129 channels"),
])
def test_backend_wsb_refuses_what_it_cannot_run(kwargs, fragment, monkeypatch):
    ei = torch.randint(0, 20, (2, 100))
    g = gnnio.Graph(ei, num_nodes=20)
    channels = kwargs.pop("channels", 4)
    v, s = torch.randn(20, 2, channels), torch.randn(20, 2)
    if kwargs.pop("edge_score", False):
        kwargs["edge_score"] = torch.randn(100, 2)
    with pytest.raises(ValueError, match=fragment):
        gnnio.ops.graph_attention(g, "gat", v, src_score=s, backend="wsb", **kwargs)
    # The variable leaves such a call on the CSR kernels.
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    gnnio.ops.graph_attention(g, "gat", v, src_score=s, **kwargs)


def test_backend_wsb_refuses_other_kinds():
    ei = torch.randint(0, 20, (2, 100))
    g = gnnio.Graph(ei, num_nodes=20)
    q = k = torch.randn(20, 2, 4)
    with pytest.raises(ValueError, match="kind 'dot'"):
        gnnio.ops.graph_attention(g, "dot", k, query=q, key=k, backend="wsb")


def test_attention_backend_choice(monkeypatch):
    assert attention_backend("wsb") == ("wsb", "backend='wsb'")
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    assert attention_backend(None)[0] == "wsb"
    assert attention_backend("auto")[0] == "csr"  # the argument wins, 'auto' included
    assert attention_backend("csr")[0] == "csr"
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "tiles")
    with pytest.raises(ValueError, match="GNNIO_ATTENTION_BACKEND"):
        attention_backend(None)
    monkeypatch.delenv("GNNIO_ATTENTION_BACKEND")
    backend, why = attention_backend(None)  # no graph: another kind than 'gat'
    assert backend == "csr" and "kind 'gat'" in why
    with pytest.raises(ValueError, match="backend must be"):
        attention_backend("cusparse")


def _diagonal_tiles(blocks, full=False, count=None):
    """Only diagonal 16 x 16 tiles, each holding every entry (full), exactly 128 (i + j even), or
    its first ``count`` entries in row-major order."""
    i, j = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    if count is not None:
        keep = (16 * i + j) < count
    else:
        keep = torch.ones_like(i, dtype=torch.bool) if full else (i + j) % 2 == 0
    base = 16 * torch.arange(blocks)[:, None]
    src, dst = (base + j[keep]).reshape(-1), (base + i[keep]).reshape(-1)
    return torch.stack([src, dst]), 16 * blocks


def test_auto_picks_tiles_by_edges_per_tile(monkeypatch):
    # The measured break-even (plan.WSB_ATTENTION_WIDE_MIN_EDGES_PER_TILE, taken when the width is
    # not given): 128 edges a tile is above the 16-bit inference threshold (110) and below its
    # training one (150) and float32's (130).
    monkeypatch.delenv("GNNIO_ATTENTION_BACKEND", raising=False)
    blocks = gnnio.plan.WSB_ATTENTION_MIN_ROWS // 16
    g = gnnio.Graph(*_diagonal_tiles(blocks, full=False))
    assert g.wsb_stats()["edges_per_tile"] == 128

    def choice(dtype, training=False, device_type="cuda"):
        return attention_backend(None, graph=g, dtype=dtype, training=training, device_type=device_type)
    for dtype in (torch.bfloat16, torch.float16):
        backend, why = choice(dtype)
        assert backend == "wsb" and "128.0 edges per 16 x 16 tile >= 110" in why
        backend, why = choice(dtype, training=True)
        assert backend == "csr" and "128.0 edges per 16 x 16 tile < 150 (training" in why
    monkeypatch.setattr(gnnio.plan, "_tf32_allowed", lambda: True)
    assert choice(torch.float32)[0] == "csr"  # 128 < 130
    # Heads of <= 32 channels run the narrow build, whose break-even is lower (85 / 130 float32,
    # 80 / 105 16-bit); 33 channels are the wide build's again.
    narrow = dict(graph=g, device_type="cuda", channels=32)
    backend, why = attention_backend(None, dtype=torch.float32, **narrow)
    assert backend == "wsb" and ">= 85 (inference" in why
    assert attention_backend(None, dtype=torch.float32, training=True, **narrow)[0] == "csr"  # < 130
    backend, why = attention_backend(None, dtype=torch.bfloat16, training=True, **narrow)
    assert backend == "wsb" and ">= 105 (training" in why
    wide = dict(graph=g, device_type="cuda", channels=33)
    assert attention_backend(None, dtype=torch.float32, **wide)[0] == "csr"  # 128 < 130
    assert attention_backend(None, dtype=torch.bfloat16, training=True, **wide)[0] == "csr"  # < 150
    dense = gnnio.Graph(*_diagonal_tiles(blocks, full=True))
    assert attention_backend(None, graph=dense, dtype=torch.float32, device_type="cuda")[0] == "wsb"
    small = gnnio.Graph(*_diagonal_tiles(64, full=True))  # 1,024 rows: not measured, CSR
    backend, why = attention_backend(None, graph=small, dtype=torch.bfloat16, device_type="cuda")
    assert backend == "csr" and "1024 destination rows" in why
    monkeypatch.setattr(gnnio.plan, "_tf32_allowed", lambda: False)
    backend, why = attention_backend(None, graph=dense, dtype=torch.float32, device_type="cuda")
    assert backend == "csr" and "tf32" in why
    assert choice(torch.float64)[0] == "csr"
    backend, why = choice(torch.bfloat16, device_type="cpu")
    assert backend == "csr" and "CPU" in why
    sparse = gnnio.Graph(torch.randint(0, 70000, (2, 300000)), num_nodes=70000)
    assert attention_backend(None, graph=sparse, dtype=torch.bfloat16, device_type="cuda")[0] == "csr"
    # Heads narrower than the measured 32 channels stay on the CSR kernels.
    backend, why = attention_backend(None, graph=g, dtype=torch.bfloat16, device_type="cuda", channels=8)
    assert backend == "csr" and "8 channels a head" in why
    assert attention_backend(None, graph=g, dtype=torch.bfloat16, device_type="cuda", channels=32)[0] == "wsb"
    # Full diagonal tiles, but block row 0 also holds 100 tiles of 16 edges (rows 0..15 one
    # source each in block columns 50..149: in-degree 116, no super node): one warp would walk
    # that row's 101 tiles.
    ei_d, n_d = _diagonal_tiles(blocks, full=True)
    rows, cols = torch.meshgrid(torch.arange(16), torch.arange(50, 150), indexing="ij")
    extra = torch.stack([16 * cols.reshape(-1) + rows.reshape(-1), rows.reshape(-1)])
    crowded = gnnio.Graph(torch.cat([ei_d, extra], 1), num_nodes=n_d)
    assert crowded.wsb_stats()["edges_per_tile"] > 250
    backend, why = attention_backend(None, graph=crowded, dtype=torch.bfloat16, device_type="cuda")
    assert backend == "csr" and "destination block row holds 101 tiles" in why
    # Training reads the transposed tiles too: there block row 0 is a source block row.
    mirrored = gnnio.Graph(torch.cat([ei_d, extra.flip(0)], 1), num_nodes=n_d)
    assert attention_backend(None, graph=mirrored, dtype=torch.bfloat16, device_type="cuda")[0] == "wsb"
    backend, why = attention_backend(None, graph=mirrored, dtype=torch.bfloat16, training=True,
                                     device_type="cuda")
    assert backend == "csr" and "source block row holds 101 tiles" in why
    # A hub's edges fill its block row's tiles (~160 a tile here), but one warp would walk them.
    hub_ei, hub_n = hub(1_000_000)
    hubby = gnnio.Graph(hub_ei, num_nodes=hub_n)
    assert hubby.wsb_stats()["edges_per_tile"] > 150
    backend, why = attention_backend(None, graph=hubby, dtype=torch.bfloat16, device_type="cuda")
    assert backend == "csr" and "super nodes" in why
    # The argument and the variable still win.
    assert attention_backend("csr", graph=g, dtype=torch.bfloat16, device_type="cuda")[0] == "csr"
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "csr")
    assert choice(torch.bfloat16)[0] == "csr"


def test_counts_hold_each_edge_once():
    ei = torch.tensor([[0, 0, 0, 5, 17], [1, 1, 1, 2, 33]])
    g = gnnio.Graph(ei, size=(18, 34))
    for transpose in (False, True):
        w, count = g.wsb(transpose), g.wsb_counts(transpose)
        assert count.dtype == torch.float32 and count.sum().item() == ei.size(1)
        flat = count.flatten()
        assert flat[w.pos[0]].item() == 3  # the three duplicates share one entry
        assert flat[w.pos[3]].item() == 1 and flat[w.pos[4]].item() == 1


def test_opcheck_wsb_gat_attention():
    ei = torch.randint(0, 40, (2, 300))
    g = gnnio.Graph(ei, num_nodes=40)
    w, wt = g.wsb(), g.wsb(True)
    v, s, d = torch.randn(40, 2, 8), torch.randn(40, 2), torch.randn(40, 2)
    args = (w.block_rowptr, w.block_col, g.wsb_counts(), s, d, v, 40, 40, 0.2, True)
    torch.library.opcheck(torch.ops.gnnio.wsb_gat_attention, args)
    out, stats, out_acc = torch.ops.gnnio.wsb_gat_attention(*args)
    bargs = (w.block_rowptr, w.block_col, g.wsb_counts(), wt.block_rowptr, wt.block_col,
             g.wsb_counts(True), s, d, v, out, stats, torch.randn_like(out), 0.2, [1, 0, 1])
    torch.library.opcheck(torch.ops.gnnio.wsb_gat_attention_backward, bargs)
    d_src, d_dst, d_value = torch.ops.gnnio.wsb_gat_attention_backward(*bargs)
    assert d_dst is None and d_src.shape == s.shape and d_value.shape == v.shape


def test_graph_plan_reports_the_attention_backend(monkeypatch):
    ei = torch.randint(0, 64, (2, 900))
    g = gnnio.Graph(ei, num_nodes=64)
    plan = g.plan("GATConv")  # 64 rows: below the measured sizes
    assert plan.backend in ("csr", "csr-split") and "64 destination rows" in plan.reason
    dense = gnnio.Graph(*_diagonal_tiles(gnnio.plan.WSB_ATTENTION_MIN_ROWS // 16, full=True))
    plan = dense.plan("GATConv", dtype=torch.bfloat16)  # auto picks the tiles here
    assert plan.backend == "wsb" and plan.cpu_backend == "csr" and "edges per 16 x 16 tile >=" in plan.reason
    plan = dense.plan("GATConv")  # float32: the tiles would be tf32, which torch does not allow now
    assert plan.backend in ("csr", "csr-split") and "tf32" in plan.reason
    monkeypatch.setenv("GNNIO_ATTENTION_BACKEND", "wsb")
    plan = g.plan("GATConv")
    assert plan.backend == "wsb" and plan.cpu_backend == "wsb"
    assert plan.stats["num_tiles"] == g.with_remaining_self_loops()[0].wsb_stats()["num_tiles"]
    assert "GNNIO_ATTENTION_BACKEND=wsb" in plan.reason and "wsb" in str(plan)
    other = g.plan("GATv2Conv")  # the tiles take kind 'gat' only
    assert other.backend in ("csr", "csr-split") and "kind 'gatv2' runs on the CSR" in other.reason
    wide = g.plan("GATConv", dtype=torch.float64)  # no float64 tensor-core path on CUDA
    assert wide.backend in ("csr", "csr-split") and wide.cpu_backend == "wsb"
    assert "float64 on the CSR kernels" in wide.reason


def test_auto_narrow_and_wide_tables_apart(monkeypatch):
    # 82 edges a tile: above the narrow build's 16-bit inference threshold (80) and below every
    # other (85 float32 inference, 105 / 130 training; the wide ones 110-190); 160 a tile: above
    # the narrow float32 training threshold (130), below the wide one (190).
    monkeypatch.delenv("GNNIO_ATTENTION_BACKEND", raising=False)
    monkeypatch.setattr(gnnio.plan, "_tf32_allowed", lambda: True)
    blocks = gnnio.plan.WSB_ATTENTION_MIN_ROWS // 16
    for count, cases in (
            (82, [(torch.bfloat16, False, 32, "wsb"), (torch.float16, False, 32, "wsb"),
                  (torch.bfloat16, False, 33, "csr"), (torch.float32, False, 32, "csr"),
                  (torch.bfloat16, True, 32, "csr")]),
            (160, [(torch.float32, True, 32, "wsb"), (torch.float32, True, 33, "csr"),
                   (torch.float32, True, None, "csr"), (torch.float16, True, 32, "wsb"),
                   (torch.float16, True, 128, "wsb"), (torch.float32, False, 128, "wsb")])):
        g = gnnio.Graph(*_diagonal_tiles(blocks, count=count))
        assert g.wsb_stats()["edges_per_tile"] == count
        for dtype, training, channels, want in cases:
            got = attention_backend(None, graph=g, dtype=dtype, training=training, device_type="cuda",
                                    channels=channels)
            assert got[0] == want, (count, dtype, training, channels, got)


def test_graph_attention_passes_the_channels_a_head(monkeypatch):
    # The rule must see a head's width (value's last dimension), for GATConv's bipartite and
    # concat=False calls too (a spy on the rule; a helper's review: nothing caught heads x C).
    seen = []
    rule = gnnio.ops.attention_backend

    def spy(*args, **kwargs):
        seen.append(kwargs.get("channels"))
        return rule(*args, **kwargs)

    monkeypatch.setattr(gnnio.ops, "attention_backend", spy)
    ei = torch.randint(0, 20, (2, 60))
    gnnio.nn.GATConv(8, 32, heads=4)(torch.randn(20, 8), ei)
    gnnio.nn.GATConv((8, 6), 48, heads=2, concat=False)((torch.randn(20, 8), torch.randn(20, 6)), ei)
    assert seen == [32, 48]


def test_graph_plan_sees_the_heads(monkeypatch):
    # 128 edges a tile, training in bfloat16: above the narrow build's break-even (105, heads of
    # <= 32 channels), below the wide build's (150), which the plan takes without the heads.
    monkeypatch.delenv("GNNIO_ATTENTION_BACKEND", raising=False)
    half = gnnio.Graph(*_diagonal_tiles(gnnio.plan.WSB_ATTENTION_MIN_ROWS // 16, full=False))
    assert half.plan("GATConv", 128, torch.bfloat16).backend != "wsb"
    plan = half.plan("GATConv", 128, torch.bfloat16, heads=4)
    assert plan.backend == "wsb" and ">= 105 (training" in plan.reason
    # An attention layer gives its own heads and channels, whatever features says (concat=False
    # included: the attention runs on heads x out_channels).
    for layer in (gnnio.nn.GATConv(16, 32, heads=4), gnnio.nn.GATConv(16, 32, heads=4, concat=False)):
        plan = half.plan(layer, 7, torch.bfloat16)
        assert plan.backend == "wsb" and plan.features == 128
    assert half.plan(gnnio.nn.GATConv(16, 64, heads=2), 128, torch.bfloat16).backend != "wsb"  # wide
    narrow = half.plan("GATConv", 128, torch.bfloat16, heads=8)  # 16 channels a head: never tiles
    assert narrow.backend != "wsb" and "16 channels a head" in narrow.reason
    dense = gnnio.Graph(*_diagonal_tiles(gnnio.plan.WSB_ATTENTION_MIN_ROWS // 16, full=True))
    over = dense.plan("GATConv", 1024, torch.bfloat16, heads=4)  # 256 channels: the call refuses
    assert over.backend != "wsb" and "256 channels a head" in over.reason
    assert gnnio.plan.WSB_ATTENTION_MAX_CHANNELS == gnnio.wsb_attention.MAX_CHANNELS
    with pytest.raises(ValueError, match="heads"):
        half.plan("GCNConv", heads=4)
    with pytest.raises(ValueError, match="heads"):
        half.plan("GATConv", heads=0)
    with pytest.raises(ValueError, match="channels a head"):
        half.plan("GATConv", 100, heads=3)  # no whole channels a head
    with pytest.raises(ValueError, match="contradict"):
        half.plan(gnnio.nn.GATConv(16, 32, heads=4), 128, heads=2)


def test_rows_whose_scores_are_all_minus_inf_are_nan_as_in_pyg():
    # exp(-inf - -inf) = NaN in PyG's softmax; an isolated destination stays 0.
    ei = torch.tensor([[0, 1, 2], [1, 1, 2]])
    g = gnnio.Graph(ei, num_nodes=4)
    v = torch.randn(4, 1, 3)
    s = torch.tensor([[-float("inf")], [-float("inf")], [0.5], [0.0]])
    ref = gnnio.ops.graph_attention(g, "gat", v, src_score=s, backend="csr")
    out = wsb_op(g)(v, s, None)
    assert torch.isnan(out[1]).all() and torch.isnan(ref[1]).all()
    assert torch.equal(out[[0, 3]], torch.zeros(2, 1, 3)) and torch.allclose(out[2], v[2])
