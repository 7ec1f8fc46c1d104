"""gnnio.bench.transformer_reassociation (a planning study for TransformerConv, NOTES v18): its
reassociated forward is PyG's TransformerConv in exact arithmetic, checked in float64 on a graph
with isolated destinations and duplicate edges, forward and every gradient; and the study runs."""
import pytest
import torch

from gnnio.bench import transformer_reassociation as study

pytest.importorskip("torch_geometric")


def test_reassociated_form_is_pygs_layer_in_float64():
    from torch_geometric.nn import TransformerConv
    gen = torch.Generator().manual_seed(5)
    n = 60
    ei = torch.randint(50, (2, 400), generator=gen)  # destinations 50..59 receive nothing
    ei = torch.cat([ei, ei[:, :30]], 1)  # duplicate edges
    conv = TransformerConv(16, 8, heads=3).double()
    x = torch.randn(n, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    gout = torch.randn(n, 24, generator=gen, dtype=torch.float64)
    ref = conv(x, ei)
    out = study.reassociated(conv, x, ei)
    # float64 rounding of sums of O(10) terms of O(1): 1e-12 of the scale leaves a wide margin.
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12 * ref.abs().max().item())
    params = [x] + [p for name, p in conv.named_parameters() if name != "lin_key.bias"]
    g_ref = torch.autograd.grad(ref, params, gout)
    g_out = torch.autograd.grad(out, params, gout)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * b.abs().max().item())
    # Isolated destinations get the skip path alone, as in PyG.
    torch.testing.assert_close(out[50:], conv.lin_skip(x)[50:], rtol=0, atol=0)


def test_study_reports_every_quantity():
    ei = torch.randint(40, (2, 300), generator=torch.Generator().manual_seed(1))
    res = study.compare(ei, 40, features=16, heads=2, channels=8)
    assert {"out", "d x", "d lin_key.weight", "d lin_value.weight", "d lin_skip.bias"} <= set(res)
    for name, (pyg32, ours32, ours64) in res.items():
        if name.endswith("(abs)"):
            continue
        # float32 against float64: rounding of O(100)-term sums stays far below 1e-4 of the
        # scale; the float64 identity at rounding level.
        assert pyg32 < 1e-4 and ours32 < 1e-4 and ours64 < 1e-12, name
    model = study.byte_model()
    assert model["gather reassociated (GB)"] < 0.6 * model["gather now (GB)"]
