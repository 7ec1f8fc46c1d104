"""gnnio.nn.TransformerConv's reassociated form (W_k and W_v around the aggregation, the op with
rows shared by the heads) and its fused form (the same algorithm in one op per tile of
destinations, gnnio::transformer_fused_forward; on the CPU at any shape) against PyG 2.8 on the
same weights, and the planner's choice of form
(gnnio.plan.plan_transformer): where it applies, where it falls back, how it is forced."""
import pytest
import torch

import gnnio
from gnnio.plan import plan_transformer
from graphs import hub
from test_attention import TRANSFORMER_OPTIONS, cases, layer_call, make_pair, run_pair

FORM = "GNNIO_TRANSFORMER_FORM"
FORMS = ["reassociated", "fused"]
# Every option without an edge term: the ones the reassociated form runs.
NO_EDGE = {k: v for k, v in TRANSFORMER_OPTIONS.items() if "edge_dim" not in v}


def count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


def count_reassociated(monkeypatch):
    """Calls of the reassociated form's autograd node from the layer."""
    from gnnio.nn.conv import transformer_conv

    calls = []
    real = transformer_conv.ReassociatedAttention

    class Counting:
        @staticmethod
        def apply(*args):
            calls.append(1)
            return real.apply(*args)
    monkeypatch.setattr(transformer_conv, "ReassociatedAttention", Counting)
    return calls


def count_fused(monkeypatch):
    """Calls of the fused op from the reassociated node."""
    from gnnio.nn.conv import _reassociated

    calls = []
    real = _reassociated._fused_forward
    monkeypatch.setattr(_reassociated, "_fused_forward", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opt", list(NO_EDGE))
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_reassociated_matches_pyg(monkeypatch, opt, name, ei, n, form):
    """Output and every gradient no worse against PyG's float64 than PyG's own float32 (2x, the
    suite's rule), through the reassociated node (and the fused op, in its form)."""
    monkeypatch.setenv(FORM, form)
    fused_calls = count_fused(monkeypatch)
    pyg, ours = make_pair("TransformerConv", 7, 5, **NO_EDGE[opt])
    calls = count_reassociated(monkeypatch)
    x = torch.randn(n, 7)
    run_pair(pyg, ours, layer_call(x, ei, None), rows=n + ei.size(1))
    assert calls
    assert bool(fused_calls) == (form == "fused")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("ns,nd", [(30, 12), (12, 30)])
def test_reassociated_bipartite(monkeypatch, ns, nd, form):
    monkeypatch.setenv(FORM, form)
    pyg, ours = make_pair("TransformerConv", (6, 4), 3, heads=2)
    gen = torch.Generator().manual_seed(ns * 100 + nd)
    ei = torch.stack([torch.randint(ns, (90,), generator=gen), torch.randint(nd, (90,), generator=gen)])
    ei = ei[:, ei[1] != 0]  # a destination without neighbours: no value bias there
    x_src, x_dst = torch.randn(ns, 6, generator=gen), torch.randn(nd, 4, generator=gen)

    def call(module, dtype):
        a, b = x_src.to(dtype).requires_grad_(), x_dst.to(dtype).requires_grad_()
        return module((a, b), ei), [a, b]
    run_pair(pyg, ours, call, rows=ns + nd + ei.size(1))


@pytest.mark.parametrize("form", FORMS)
def test_reassociated_hub_of_100k_neighbours(monkeypatch, form):
    monkeypatch.setenv(FORM, form)
    ei, n = hub()
    pyg, ours = make_pair("TransformerConv", 6, 4, heads=2, beta=True)
    run_pair(pyg, ours, layer_call(torch.randn(n, 6), ei, None), rows=n + ei.size(1))


@pytest.mark.parametrize("form", FORMS)
def test_every_parameter_gets_a_gradient(monkeypatch, form):
    """lin_key.bias's gradient is zero up to rounding (the softmax drops q . b_k), and a tensor,
    as in the direct form (DistributedDataParallel waits for every parameter's gradient)."""
    monkeypatch.setenv(FORM, form)
    conv = gnnio.nn.TransformerConv(5, 3, heads=2).double()
    ei = torch.randint(20, (2, 80))
    conv(torch.randn(20, 5, dtype=torch.float64), ei).square().sum().backward()
    for name, param in conv.named_parameters():
        assert param.grad is not None, name
    scale = conv.lin_key.weight.grad.abs().max().item()
    assert conv.lin_key.bias.grad.abs().max().item() <= 1e-12 * max(scale, 1.0)
    assert conv.lin_value.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["edge_dim", "dropout", "weights", "hooked", "autocast"])
def test_reassociated_falls_back_to_direct(monkeypatch, case):
    """Asked for where it does not apply, the layer runs PyG's form (it projects keys) and the
    plan says why."""
    monkeypatch.setenv(FORM, "reassociated")
    conv = gnnio.nn.TransformerConv(5, 3, heads=2, edge_dim=2 if case == "edge_dim" else None,
                                    dropout=0.5 if case == "dropout" else 0.0)
    key_calls = count_calls(conv.lin_key) if case == "hooked" else None
    calls = count_reassociated(monkeypatch)
    ei = torch.randint(20, (2, 80))
    args = (torch.randn(80, 2),) if case == "edge_dim" else ()
    kwargs = dict(return_attention_weights=True) if case == "weights" else {}
    if case != "autocast":  # (the CPU kernels take no bfloat16: the plan alone, below)
        conv(torch.randn(20, 5), ei, *args, **kwargs)
        assert not calls and (key_calls is None or key_calls)
    form, reason = plan_transformer(torch.device("cpu"), edge_term=case == "edge_dim",
                                    dropout=case == "dropout", weights=case == "weights",
                                    plain=case != "hooked", autocast=case == "autocast")
    fragment = {"edge_dim": "an edge term", "dropout": "dropout", "weights": "attention weights",
                "hooked": "not plain Linears", "autocast": "autocast"}[case]
    assert form == "direct" and fragment in reason and FORM in reason


def test_dropout_in_eval_mode_runs_reassociated(monkeypatch):
    monkeypatch.setenv(FORM, "reassociated")
    conv = gnnio.nn.TransformerConv(5, 3, heads=2, dropout=0.5).eval()
    calls = count_reassociated(monkeypatch)
    conv(torch.randn(20, 5), torch.randint(20, (2, 80)))
    assert calls


def test_plan_transformer_default_and_forcing(monkeypatch):
    monkeypatch.delenv(FORM, raising=False)
    cpu = torch.device("cpu")
    flags = dict(edge_term=False, dropout=False, weights=False)
    form, reason = plan_transformer(cpu, **flags)
    assert form == "direct" and reason.startswith("direct: the default on cpu") and "v20" in reason
    assert plan_transformer(torch.device("cuda"), **flags)[0] == "direct"
    assert plan_transformer(cpu, form="reassociated", **flags) == \
        ("reassociated", "reassociated: forced (argument)")
    monkeypatch.setenv(FORM, "reassociated")
    assert plan_transformer(cpu, **flags) == ("reassociated", f"reassociated: forced ({FORM})")
    assert plan_transformer(cpu, form="direct", **flags) == ("direct", "direct: forced (argument)")
    monkeypatch.setenv(FORM, "auto")
    assert plan_transformer(cpu, **flags)[0] == "direct"
    cuda = torch.device("cuda")  # (a device object: no GPU needed)
    for heads, features, fits in ((8, 128, True), (9, 128, False), (4, 256, True), (5, 256, False),
                                  (1, 300, False)):
        form, reason = plan_transformer(cuda, heads=heads, features=features, form="reassociated",
                                        **flags)
        assert (form == "reassociated") == fits, (heads, features, reason)
        assert fits or "more heads or input features" in reason
        assert plan_transformer(cpu, heads=heads, features=features, form="reassociated",
                                **flags)[0] == "reassociated"
    assert plan_transformer(cpu, form="fused", **flags) == ("fused", "fused: forced (argument)")
    for heads, channels, features, dtype, fits in (
            (4, 32, 128, torch.float32, True), (2, 64, 128, torch.float32, True),
            (1, 128, 128, torch.float32, True), (8, 16, 128, torch.float32, False),
            (4, 32, 128, torch.bfloat16, False), (4, 16, 128, torch.float32, False),
            (4, 32, 64, torch.float32, False)):
        form, reason = plan_transformer(cuda, heads=heads, features=features, channels=channels,
                                        dtype=dtype, form="fused", **flags)
        assert form == ("fused" if fits else "reassociated"), (heads, channels, features, reason)
        # (the CPU's reassociated kernels take float32 and float64: 16-bit runs direct's op,
        # which widens it, gnnio._ops.widened_on_cpu)
        cpu_form, cpu_reason = plan_transformer(cpu, heads=heads, features=features,
                                                channels=channels, dtype=dtype, form="fused", **flags)
        assert cpu_form == ("direct" if dtype == torch.bfloat16 else "fused"), cpu_reason
        assert dtype != torch.bfloat16 or "16-bit on the CPU" in cpu_reason
    monkeypatch.setenv(FORM, "both")
    with pytest.raises(ValueError, match=f"{FORM} must be 'direct', 'reassociated', 'fused' or 'auto'"):
        plan_transformer(cpu, **flags)
    with pytest.raises(ValueError, match="argument must be"):
        plan_transformer(cpu, form="both", **flags)


def test_plan_transformer_auto_runs_fused_for_inference_on_large_dense_graphs(monkeypatch):
    """'auto' (NOTES v23): fused on CUDA without a backward, where the kernel fits, on graphs of
    >= FUSED_AUTO_MIN_EDGES edges and mean in-degree >= FUSED_AUTO_MIN_DEGREE; direct otherwise."""
    from gnnio.plan import FUSED_AUTO_MIN_DEGREE, FUSED_AUTO_MIN_EDGES
    monkeypatch.delenv(FORM, raising=False)
    cuda = torch.device("cuda")  # (a device object: no GPU needed)
    base = dict(edge_term=False, dropout=False, weights=False, heads=4, features=128, channels=32,
                dtype=torch.float32, grad=False, num_edges=16_000_000, num_dst=1_000_000)
    form, reason = plan_transformer(cuda, **base)
    assert form == "fused" and "no backward" in reason and "v23" in reason
    edges_at_min = FUSED_AUTO_MIN_EDGES
    assert plan_transformer(cuda, **dict(base, num_edges=edges_at_min,
                                          num_dst=edges_at_min // FUSED_AUTO_MIN_DEGREE))[0] == "fused"
    for change in (dict(grad=True), dict(num_edges=edges_at_min - 1, num_dst=1000),
                   dict(num_dst=16_000_000 // FUSED_AUTO_MIN_DEGREE + 1),  # mean degree < 12
                   dict(dtype=torch.bfloat16), dict(heads=8, channels=16), dict(edge_term=True),
                   dict(dropout=True), dict(weights=True), dict(plain=False), dict(autocast=True)):
        form, reason = plan_transformer(cuda, **dict(base, **change))
        assert form == "direct" and reason.startswith("direct: the default on cuda"), change
    assert plan_transformer(torch.device("cpu"), **base)[0] == "direct"
    monkeypatch.setenv(FORM, "direct")
    assert plan_transformer(cuda, **base) == ("direct", f"direct: forced ({FORM})")


def test_layer_tells_the_plan_about_the_backward_and_the_graph(monkeypatch):
    """The layer's call passes grad (grad mode and any input or parameter needing one) and the
    graph's edge and destination counts to plan_transformer."""
    from gnnio.nn.conv import transformer_conv
    seen = []
    real = transformer_conv.plan_transformer
    monkeypatch.setattr(transformer_conv, "plan_transformer",
                        lambda *a, **k: seen.append(k) or real(*a, **k))
    conv = gnnio.nn.TransformerConv((5, 4), 3, heads=2)
    ei = torch.stack([torch.randint(20, (80,)), torch.randint(7, (80,))])
    x = (torch.randn(20, 5), torch.randn(7, 4))
    conv(x, ei)
    with torch.no_grad():
        conv(x, ei)
    conv.requires_grad_(False)
    conv(x, ei)
    conv((x[0].requires_grad_(), x[1]), ei)
    assert [k["grad"] for k in seen] == [True, False, False, True]
    assert all(k["num_edges"] == 80 and k["num_dst"] == 7 for k in seen)


@pytest.mark.parametrize("bias", [True, False])
def test_reassociated_node_gradcheck_float64(bias):
    """The node's backward (the direct form's, on the forward's statistics shifted by the key
    bias's term) is the gradient of its forward, for every input."""
    from gnnio.nn.conv._reassociated import ReassociatedAttention

    gen = torch.Generator().manual_seed(21)
    ei = torch.randint(15, (2, 60), generator=gen)
    ei = ei[:, ei[1] != 4]  # a destination without neighbours
    graph = gnnio.Graph(ei, num_nodes=15)
    heads, channels, features = 2, 3, 4

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
    inputs = (r(15, features), r(15, heads, channels), r(heads * channels, features),
              r(heads * channels) if bias else None, r(heads * channels, features),
              r(heads * channels) if bias else None)

    for fused in (False, True):
        def fn(*args):
            return ReassociatedAttention.apply(*args, graph, 0.6, None, True, fused)
        assert torch.autograd.gradcheck(fn, inputs)


def test_reassociated_frozen_query_and_inference(monkeypatch):
    """A frozen lin_query on an input without gradient (the backward walks no query gradient)
    gives the direct form's parameter gradients; an inference call the same output as a
    training call."""
    gen = torch.Generator().manual_seed(4)
    ei = torch.randint(40, (2, 300), generator=gen)
    x = torch.randn(40, 6, generator=gen, dtype=torch.float64)
    results = {}
    for form in ("direct", "reassociated", "fused"):
        monkeypatch.setenv(FORM, form)
        torch.manual_seed(0)
        conv = gnnio.nn.TransformerConv(6, 3, heads=2).double()
        conv.lin_query.requires_grad_(False)
        out = conv(x, ei)
        out.square().sum().backward()
        with torch.no_grad():
            torch.testing.assert_close(conv(x, ei), out.detach(), rtol=0, atol=0)
        results[form] = [out.detach()] + [p.grad for p in conv.parameters() if p.requires_grad]
    # float64: the forms sum the same terms in another order (rows of ~8 edges, 6-feature dots),
    # a few hundred eps apart at most; lin_key.bias's gradient is rounding noise around 0 in both.
    for form in ("reassociated", "fused"):
        for a, b in zip(results["direct"], results[form]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_reassociated_inference_prepares_no_backward(monkeypatch, form):
    """Under torch.no_grad(), with weights that require grad, the reassociated call builds no
    transposed CSR (as the direct form's op does not); a training call builds it in its forward
    (a compiled backward cannot: test_fused_compiles_fullgraph)."""
    monkeypatch.setenv(FORM, form)
    conv = gnnio.nn.TransformerConv(6, 3, heads=2)
    graph = gnnio.Graph(torch.randint(30, (2, 200)), num_nodes=30)
    with torch.no_grad():
        conv(torch.randn(30, 6), graph)
    assert not graph.has_csr_by_src
    out = conv(torch.randn(30, 6), graph)
    assert graph.has_csr_by_src  # by the forward
    out.sum().backward()


@pytest.mark.parametrize("opts", [{}, {"bias": False}, {"root_weight": False}, {"beta": True},
                                  {"concat": False}], ids=["default", "no_bias", "no_root", "beta", "mean"])
def test_fused_inference_writes_into_the_skip(monkeypatch, opts):
    """Without a backward the fused form writes out into lin_skip's own output
    (gnnio::transformer_fused_inference) where the skip is a plain sum (concatenated heads, no
    beta): the training call's output bits, eager and under torch.compile(fullgraph=True); the
    op that allocates out otherwise."""
    from gnnio.nn.conv import _reassociated
    monkeypatch.setenv(FORM, "fused")
    into = []
    real = _reassociated._fused_forward
    monkeypatch.setattr(_reassociated, "_fused_forward",
                        lambda *a: into.append(len(a) > 10 and a[10]) or real(*a))
    gen = torch.Generator().manual_seed(17)
    ei = torch.randint(50, (2, 300), generator=gen)
    ei = ei[:, ei[1] % 7 != 0]  # rows without edges: out = the skip there
    conv = gnnio.nn.TransformerConv(6, 4, heads=2, **opts)
    x = torch.randn(50, 6, generator=gen)
    ref = conv(x, ei)
    assert into == [False]
    with torch.no_grad():
        out = conv(x, ei)
        torch._dynamo.reset()
        compiled = torch.compile(conv, fullgraph=True)(x, gnnio.Graph(ei, num_nodes=50))
    plain_skip = opts.get("root_weight", True) and not opts.get("beta") and opts.get("concat", True)
    assert into[1:] == [plain_skip] * 2
    assert torch.equal(out, ref.detach())
    if plain_skip:  # lin_skip's output itself, not a view: a later in-place op may take it
        assert not out._is_view()
    torch.testing.assert_close(compiled, out, rtol=0, atol=0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", ["zero_nodes", "zero_sources"])
def test_reassociated_backward_without_sources(monkeypatch, form, case):
    """No source rows: the backward's [0, H C] gradients (a view(0, -1) is ambiguous)."""
    monkeypatch.setenv(FORM, form)
    ei = torch.empty(2, 0, dtype=torch.long)
    x_src = torch.randn(0, 5, dtype=torch.float64, requires_grad=True)
    x_dst = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    pyg, ours = make_pair("TransformerConv", 5 if case == "zero_nodes" else (5, 3), 4, heads=2)
    ours = ours.double()
    out = ours(x_src if case == "zero_nodes" else (x_src, x_dst), ei)
    out.square().sum().backward()
    assert x_src.grad.shape == x_src.shape
    if case == "zero_sources":  # the skip's and the query's gradients still reach x_dst
        ref_src, ref_dst = x_src.detach().requires_grad_(), x_dst.detach().requires_grad_()
        pyg.double()((ref_src, ref_dst), ei).square().sum().backward()
        torch.testing.assert_close(x_dst.grad, ref_dst.grad)


def test_fused_compiles_fullgraph(monkeypatch):
    """torch.compile(fullgraph=True) of the fused form on a prepared Graph: the backward finds
    the transposed CSR built (by the eager forward), as the direct form's does."""
    monkeypatch.setenv(FORM, "fused")
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(9)
    graph = gnnio.Graph(torch.randint(60, (2, 400), generator=gen), num_nodes=60)
    conv = gnnio.nn.TransformerConv(8, 4, heads=2)
    x = torch.randn(60, 8, generator=gen, requires_grad=True)
    ref = conv(x, graph)  # (its backward after the compiled call's: it would build the transpose)
    out = torch.compile(conv, fullgraph=True)(x, graph)
    grads = torch.autograd.grad(out.sum(), [x] + list(conv.parameters()))
    ref_grads = torch.autograd.grad(ref.sum(), [x] + list(conv.parameters()))
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opts", [{}, {"root_weight": False}, {"root_weight": False, "concat": False}],
                         ids=["default", "no_root", "no_root_mean"])
def test_output_changed_in_place(monkeypatch, form, opts):
    """An in-place activation after the layer (the node copies what its backward reads, and
    returns no view made inside it, which autograd would refuse to let the caller change)."""
    monkeypatch.setenv(FORM, form)
    gen = torch.Generator().manual_seed(8)
    ei = torch.randint(20, (2, 80), generator=gen)
    x = torch.randn(20, 5, generator=gen, dtype=torch.float64)
    conv = gnnio.nn.TransformerConv(5, 4, heads=2, **opts).double()
    grads = []
    for inplace in (False, True):
        xi = x.clone().requires_grad_()
        out = torch.nn.functional.relu(conv(xi, ei), inplace=inplace)
        grads.append(torch.autograd.grad(out.square().sum(), [xi] + list(conv.lin_query.parameters())))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
