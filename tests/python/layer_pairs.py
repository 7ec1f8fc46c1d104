"""PyG and gnnio layers with the same weights, and the comparison of their outputs and
gradients that test_layers.py and test_layer_inputs.py share (the precision rule is
test_layers.py's docstring)."""
import copy

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

import gnnio
import gnnio.nn
from conftest import assert_no_worse_than_reference


def max_degree(ei) -> int:
    """The largest in- or out-degree of edge_index (0 without edges)."""
    if ei.numel() == 0:
        return 0
    return max(int(torch.bincount(ei[k]).max()) for k in (0, 1))


def gcn_adds_loops(opts):
    return opts.get("add_self_loops", opts.get("normalize", True))


# ---------------------------------------------------------------------------------------------
# helpers

def make_pair(name, *args, device="cpu", **kwargs):
    """The PyG layer and the gnnio layer of the same class and arguments, with equal weights.
    Checks that the state_dicts have the same keys and load into each other strictly, both ways."""
    pyg = getattr(pyg_nn, name)(*args, **kwargs)
    ours = getattr(gnnio.nn, name)(*args, **kwargs)
    assert set(ours.state_dict()) == set(pyg.state_dict())
    # gnnio -> PyG (a PyG layer reading a gnnio checkpoint) ...
    pyg.load_state_dict(ours.state_dict(), strict=True)
    for k, v in ours.state_dict().items():
        assert torch.equal(pyg.state_dict()[k], v), k
    # ... and PyG -> gnnio, with fresh PyG weights so the copy is not a no-op.
    pyg.reset_parameters()
    with torch.no_grad():
        for p in pyg.parameters():  # PyG zeros some biases; make every parameter informative
            p.add_(torch.randn_like(p) * 0.1)
    ours.load_state_dict(pyg.state_dict(), strict=True)
    for k, v in pyg.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    return pyg.to(device), ours.to(device)


EPS32 = torch.finfo(torch.float32).eps


def _close(what, ours, theirs, exact, terms=1):
    assert ours.shape == exact.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(exact.shape)}"
    # The floor the rule intends: 8 float32 ulp of the output's scale. (Passed explicitly:
    # conftest's default converts `ours` to float64 before it picks eps, so it would take
    # float64's eps and the floor would vanish.) For a quantity that is a sum of `terms` terms
    # of that scale, sqrt(terms) times that: their roundings add with random signs, and the
    # sum can cancel below its terms, so PyG's own error is one draw of that noise.
    scale = exact.detach().abs().max().item() if exact.numel() else 0.0
    try:
        assert_no_worse_than_reference(ours, theirs, exact,
                                       floor=8 * EPS32 * max(scale, 1.0) * terms ** 0.5)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def shadowed_self_loops(ei):
    """Mask of the self loops that a later loop of the same node overrides. GCN's
    add_remaining_self_loops keeps the last loop's weight (`loop_attr[i] = w`, last write wins),
    so the output does not depend on the others' weights. PyG's autograd of that index_put still
    hands every duplicate the full gradient; gnnio gives them 0, the true derivative."""
    src, dst = ei[0].cpu(), ei[1].cpu()
    loops = (src == dst).nonzero().view(-1)
    last = torch.full((int(src.max()) + 1 if src.numel() else 0,), -1, dtype=torch.long)
    last.scatter_reduce_(0, src[loops], loops, reduce="amax")
    mask = torch.zeros(src.numel(), dtype=torch.bool)
    mask[loops] = last[src[loops]] != loops
    return mask.to(ei.device), last.to(ei.device)


def gcn_weights(ei, w):
    """edge_weight for GCN with self loops: duplicate loops of a node get the weight of its last
    loop, so the output is the same whichever loop PyG's index_put lets win (on CUDA it is not
    defined). Returns (w, mask of the shadowed loops)."""
    mask, last = shadowed_self_loops(ei)
    if mask.any():
        w = w.clone()
        w[mask] = w[last[ei[0][mask]]]
    return w, mask


# ---------------------------------------------------------------------------------------------
# LeakyReLU's kink

# LeakyReLU's derivative jumps at 0 (1 to negative_slope): a score within float32's rounding of 0
# may land on either side in a float32 computation, and both are right, but the gradient then
# differs from float64's by the jump times that edge's weight, in one implementation and not in
# the other (a CI run at c2f25a9 failed GATConv-edge_mean_residual on as20000102, not
# reproducibly: bench/NOTES.md). A score is too close when it is within KINK of 0 (the float32
# rounding of a sum of a few O(1)-O(5) terms is below ~5e-7) or within 4 times PyG's own float32
# rounding of it (cancelling large terms); such draws are drawn again.
KINK = 1e-6
KINK_TRIES = 50


def leaky_relu_inputs(fn):
    """Every tensor torch.nn.functional.leaky_relu is given while fn() runs (PyG's GATConv and
    GATv2Conv call it as F.leaky_relu), as float64, without autograd."""
    seen, real_leaky = [], F.leaky_relu

    def spy(t, *args, **kwargs):
        seen.append(t.detach().double())
        return real_leaky(t, *args, **kwargs)
    F.leaky_relu = spy
    try:
        with torch.no_grad():
            fn()
    finally:
        F.leaky_relu = real_leaky
    return seen


def clear_of_kink(scores32, scores64) -> bool:
    """Whether no float64 LeakyReLU input is too close to 0 (see KINK), given the float32 and the
    float64 run's inputs in call order."""
    assert len(scores32) == len(scores64)
    for z32, z64 in zip(scores32, scores64):
        near = torch.maximum(torch.full_like(z64, KINK), 4 * (z32 - z64).abs())
        if bool((z64.abs() < near).any()):
            return False
    return True


def _redraw(t):
    """A fresh draw near t: every entry moved by a relative N(0, 0.01^2), signs and scales kept."""
    return t * (1 + 0.01 * torch.randn_like(t))


def _leaves(inputs, dtype):
    return {k: None if v is None else v.detach().to(dtype).requires_grad_() for k, v in inputs.items()}


def _float64_copy(pyg):
    """PyG's layer in float64, uncached (a float32 cache would spoil float64)."""
    exact = copy.deepcopy(pyg).double()
    for attr in ("_cached_edge_index", "_cached_adj_t"):
        if hasattr(exact, attr):
            setattr(exact, attr, None)
    return exact


def _draw_clear_of_kink(pyg, call, exact_call, inputs, calls):
    """inputs, or the first of KINK_TRIES redraws of them, whose scores are all clear of the
    kink in PyG's float32 and float64 forwards."""
    for _ in range(KINK_TRIES):
        exact, leaves32, leaves64 = _float64_copy(pyg), _leaves(inputs, torch.float32), _leaves(inputs, torch.float64)
        z32 = leaky_relu_inputs(lambda: [call(pyg, leaves32) for _ in range(calls)])
        z64 = leaky_relu_inputs(lambda: [exact_call(exact, leaves64) for _ in range(calls)])
        if clear_of_kink(z32, z64):
            return inputs
        inputs = {k: None if v is None else _redraw(v) for k, v in inputs.items()}
    raise AssertionError(f"no draw of {KINK_TRIES} kept every score clear of LeakyReLU's kink")


def check_against_pyg(pyg, ours, call, inputs, calls=1, shadowed=None, exact_call=None,
                      edge_weight_terms=1):
    """Runs `call(layer, inputs)` with PyG in float32, gnnio in float32 and PyG in float64 (the
    exact reference), all on the same inputs and the same upstream gradient, and checks the output
    and the gradients of every input in `inputs` and of every parameter. `calls` > 1 repeats the
    forward on the same inputs (cached layers) and differentiates the last output.
    `shadowed` (a mask over edges): edge weights the output does not depend on (see
    shadowed_self_loops); gnnio's gradient must be exactly 0 there, PyG's is not compared.
    `exact_call` (default `call`) is what the float64 reference runs; it starts uncached.
    `edge_weight_terms`: the terms summed into one edge weight's gradient (GCN's normalisation
    sums over the endpoints' neighbourhoods through deg^-1/2: the largest degree).
    Inputs that put a LeakyReLU input of PyG's float64 forward too close to 0 (see KINK; GAT and
    GATv2 scores) are drawn again, up to KINK_TRIES times, by moving every input a little."""
    # Only layers with LeakyReLU scores run the extra forwards (other layers' caches are left
    # as they are).
    # (negative_slope = 1: no kink, LeakyReLU is the identity)
    if any(isinstance(m, (pyg_nn.GATConv, pyg_nn.GATv2Conv)) and m.negative_slope != 1.0
           for m in pyg.modules()):
        inputs = _draw_clear_of_kink(pyg, call, exact_call or call, inputs, calls)
    exact = _float64_copy(pyg)
    runs = {}
    for key, layer, dtype in [("pyg", pyg, torch.float32), ("ours", ours, torch.float32),
                              ("exact", exact, torch.float64)]:
        leaves = _leaves(inputs, dtype)
        fn = exact_call if key == "exact" and exact_call is not None else call
        for _ in range(calls):
            out = fn(layer, leaves)
        runs[key] = (layer, leaves, out)
    (_, in_p, out_p), (_, in_o, out_o), (_, in_e, out_e) = runs["pyg"], runs["ours"], runs["exact"]
    assert out_o.dtype == out_p.dtype and out_o.device == out_p.device
    assert not torch.isnan(out_o).any()
    _close("output", out_o, out_p, out_e)

    gout = torch.randn(out_p.shape, device=out_p.device)
    out_p.backward(gout)
    out_o.backward(gout)
    out_e.backward(gout.double())

    def grad(t):
        return torch.zeros_like(t) if t.grad is None else t.grad

    for k in inputs:
        if inputs[k] is not None and k != "edge_weight":
            _close(f"grad of {k}", grad(in_o[k]), grad(in_p[k]), grad(in_e[k]))
    params_p, params_o = dict(pyg.named_parameters()), dict(ours.named_parameters())
    params_e = dict(exact.named_parameters())
    assert set(params_o) == set(params_p)
    for name in params_p:
        _close(f"grad of {name}", grad(params_o[name]), grad(params_p[name]), grad(params_e[name]))
    if inputs.get("edge_weight") is not None:  # last, so that everything else is checked first
        k = "edge_weight"
        g_o, g_p, g_e = grad(in_o[k]), grad(in_p[k]), grad(in_e[k])
        if shadowed is not None and shadowed.any():
            assert torch.equal(g_o[shadowed], torch.zeros_like(g_o[shadowed]))
            g_o, g_p, g_e = g_o[~shadowed], g_p[~shadowed], g_e[~shadowed]
        _close("grad of edge_weight", g_o, g_p, g_e, edge_weight_terms)
    return out_o


def graph_inputs(ei, n, f_in, device, weighted):
    x = torch.randn(n, f_in, device=device)
    w = torch.rand(ei.size(1), device=device) if weighted else None
    return {"x": x, "edge_weight": w}


def call_with_weight(ei):
    return lambda layer, t: layer(t["x"], ei, t["edge_weight"])


def call_without_weight(ei):
    return lambda layer, t: layer(t["x"], ei)
