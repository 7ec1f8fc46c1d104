"""gnnio.nn.TransformerConv's reassociated form (W_k and W_v around the aggregation, the op with
rows shared by the heads) against PyG 2.8 on the same weights, and the planner's choice of form
(gnnio.plan.plan_transformer): where it applies, where it falls back, how it is forced."""
import pytest
import torch

import gnnio
from gnnio.plan import plan_transformer
from graphs import hub
from test_attention import TRANSFORMER_OPTIONS, cases, layer_call, make_pair, run_pair

FORM = "GNNIO_TRANSFORMER_FORM"
# Every option without an edge term: the ones the reassociated form runs.
NO_EDGE = {k: v for k, v in TRANSFORMER_OPTIONS.items() if "edge_dim" not in v}


def count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("opt", list(NO_EDGE))
@pytest.mark.parametrize("name,ei,n", cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_reassociated_matches_pyg(monkeypatch, opt, name, ei, n):
    """Output and every gradient no worse against PyG's float64 than PyG's own float32 (2x, the
    suite's rule), and no key or value projection made (lin_key / lin_value never called)."""
    monkeypatch.setenv(FORM, "reassociated")
    pyg, ours = make_pair("TransformerConv", 7, 5, **NO_EDGE[opt])
    key_calls, value_calls = count_calls(ours.lin_key), count_calls(ours.lin_value)
    x = torch.randn(n, 7)
    run_pair(pyg, ours, layer_call(x, ei, None), rows=n + ei.size(1))
    assert not key_calls and not value_calls


@pytest.mark.parametrize("ns,nd", [(30, 12), (12, 30)])
def test_reassociated_bipartite(monkeypatch, ns, nd):
    monkeypatch.setenv(FORM, "reassociated")
    pyg, ours = make_pair("TransformerConv", (6, 4), 3, heads=2)
    gen = torch.Generator().manual_seed(ns * 100 + nd)
    ei = torch.stack([torch.randint(ns, (90,), generator=gen), torch.randint(nd, (90,), generator=gen)])
    ei = ei[:, ei[1] != 0]  # a destination without neighbours: no value bias there
    x_src, x_dst = torch.randn(ns, 6, generator=gen), torch.randn(nd, 4, generator=gen)

    def call(module, dtype):
        a, b = x_src.to(dtype).requires_grad_(), x_dst.to(dtype).requires_grad_()
        return module((a, b), ei), [a, b]
    run_pair(pyg, ours, call, rows=ns + nd + ei.size(1))


def test_reassociated_hub_of_100k_neighbours(monkeypatch):
    monkeypatch.setenv(FORM, "reassociated")
    ei, n = hub()
    pyg, ours = make_pair("TransformerConv", 6, 4, heads=2, beta=True)
    run_pair(pyg, ours, layer_call(torch.randn(n, 6), ei, None), rows=n + ei.size(1))


def test_key_bias_gradient_is_an_exact_zero(monkeypatch):
    """The softmax drops q . b_k, so the gradient is exactly 0; it is a tensor, as in the direct
    form (DistributedDataParallel waits for every parameter's gradient)."""
    monkeypatch.setenv(FORM, "reassociated")
    conv = gnnio.nn.TransformerConv(5, 3, heads=2)
    ei = torch.randint(20, (2, 80))
    conv(torch.randn(20, 5), ei).square().sum().backward()
    assert conv.lin_key.bias.grad is not None
    assert torch.equal(conv.lin_key.bias.grad, torch.zeros(6))
    assert conv.lin_key.weight.grad.abs().sum() > 0 and conv.lin_value.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["edge_dim", "dropout", "weights"])
def test_reassociated_falls_back_to_direct(monkeypatch, case):
    """Asked for where it does not apply, the layer runs PyG's form (it projects keys) and the
    plan says why."""
    monkeypatch.setenv(FORM, "reassociated")
    conv = gnnio.nn.TransformerConv(5, 3, heads=2, edge_dim=2 if case == "edge_dim" else None,
                                    dropout=0.5 if case == "dropout" else 0.0)
    key_calls = count_calls(conv.lin_key)
    ei = torch.randint(20, (2, 80))
    args = (torch.randn(80, 2),) if case == "edge_dim" else ()
    kwargs = dict(return_attention_weights=True) if case == "weights" else {}
    conv(torch.randn(20, 5), ei, *args, **kwargs)
    assert key_calls
    form, reason = plan_transformer(torch.device("cpu"), edge_term=case == "edge_dim",
                                    dropout=case == "dropout", weights=case == "weights")
    fragment = {"edge_dim": "an edge term", "dropout": "dropout", "weights": "attention weights"}[case]
    assert form == "direct" and fragment in reason and FORM in reason


def test_dropout_in_eval_mode_runs_reassociated(monkeypatch):
    monkeypatch.setenv(FORM, "reassociated")
    conv = gnnio.nn.TransformerConv(5, 3, heads=2, dropout=0.5).eval()
    key_calls = count_calls(conv.lin_key)
    conv(torch.randn(20, 5), torch.randint(20, (2, 80)))
    assert not key_calls


def test_plan_transformer_default_and_forcing(monkeypatch):
    monkeypatch.delenv(FORM, raising=False)
    cpu = torch.device("cpu")
    flags = dict(edge_term=False, dropout=False, weights=False)
    assert plan_transformer(cpu, **flags) == ("direct", "direct: the default on cpu")
    assert plan_transformer(torch.device("cuda"), **flags)[0] == "direct"
    assert plan_transformer(cpu, form="reassociated", **flags) == \
        ("reassociated", "reassociated: forced (argument)")
    monkeypatch.setenv(FORM, "reassociated")
    assert plan_transformer(cpu, **flags) == ("reassociated", f"reassociated: forced ({FORM})")
    assert plan_transformer(cpu, form="direct", **flags) == ("direct", "direct: forced (argument)")
    monkeypatch.setenv(FORM, "auto")
    assert plan_transformer(cpu, **flags)[0] == "direct"
    monkeypatch.setenv(FORM, "fused")
    with pytest.raises(ValueError, match=f"{FORM} must be 'direct', 'reassociated' or 'auto'"):
        plan_transformer(cpu, **flags)
    with pytest.raises(ValueError, match="argument must be"):
        plan_transformer(cpu, form="both", **flags)
