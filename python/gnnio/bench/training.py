"""The ``GATv2x3-train`` rows of ``gnnio bench``: one full training step (forward, loss, backward,
Adam step) of the 3-layer GATv2 model of the training examples (``examples/models.py``, model
``gatv2``: hidden 4 heads x 64, a 1-head output layer, PyG's default self loops), timed as
``fwd_bwd_ms`` (``fwd_ms``: forward and loss alone), with ``peak_extra_gib`` = peak memory of one
step above what was allocated before it (model, optimizer state, the inputs and the graph caches
held between steps: ``state_gib``).

Implementations, same process, same graph, features and labels, identical initial weights (the
examples' ``build_model``: PyG's model built from the seed, its state_dict loaded into gnnio's):
``gnnio`` (eager, one shared ``gnnio.Graph``), ``pyg`` (PyG's layers on the edge_index) and
``gnnio+compile`` (the gnnio model under ``torch.compile``; ``fullgraph=True``, or without it
when that fails, said in ``note``). Each row also carries its loss curve: ``--train-steps`` steps
of the examples' own training loop (``train.train_full_graph``, Adam lr 0.01, no dropout) from the
initial weights, and, on the ``pyg`` and ``gnnio+compile`` rows, ``loss_max_abs_diff``: the
largest |loss - loss of gnnio eager| over those ``loss_steps`` steps.

Any failure of one implementation (out of memory, a compile error) becomes that row's ``error``
and the others still run. The task: the bench's random features, labels = argmax of a seeded
random projection of them over 7 classes, half of the nodes (seeded) as training nodes.
"""
import gc
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from gnnio.bench.timing import median_ms, peak_extra_gib

LAYER = "GATv2x3-train"
MODEL = "gatv2"
NUM_CLASSES = 7  # examples/train.py's default
LR = 0.01  # examples/train.py's default
IMPLS = ("gnnio", "pyg", "gnnio+compile")
_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")


def add_arguments(parser):
    parser.add_argument("--train-steps", type=int, default=20,
                        help=f"{LAYER}: training steps of each loss curve (default 20)")
    parser.add_argument("--compile-backend", default="inductor",
                        help=f"{LAYER}: torch.compile backend of the gnnio+compile row (default "
                             "inductor; 'none' skips the row)")
    parser.add_argument("--train-hidden", type=int, default=None,
                        help=f"{LAYER}: channels per head of the hidden layers (default: the "
                             "examples' 64; smaller for quick CPU runs)")
    parser.add_argument("--train-heads", type=int, default=None,
                        help=f"{LAYER}: heads of the hidden layers (default: the examples' 4)")


def check_arguments(args, parser):
    if args.train_steps < 1:
        parser.error(f"--train-steps must be 1 or more, got {args.train_steps}")
    for flag, v in (("--train-hidden", args.train_hidden), ("--train-heads", args.train_heads)):
        if v is not None and v < 1:
            parser.error(f"{flag} must be 1 or more, got {v}")
    if LAYER in args.layers:
        try:
            examples()
        except ImportError as e:
            parser.error(f"--layers {LAYER}: {e}")


def examples():
    """The examples' ``models`` and ``train`` modules (this checkout's examples/ folder), whose
    model and training loop the rows reuse."""
    folder = os.path.normpath(_EXAMPLES)
    if not os.path.isfile(os.path.join(folder, "models.py")):
        raise ImportError(f"needs the repository's examples/ folder (not found at {folder}); run "
                          "from a checkout of gnnio")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import models
    import train
    for m in (models, train):
        if os.path.dirname(os.path.abspath(m.__file__)) != folder:
            raise ImportError(f"a different module named {m.__name__!r} was imported first "
                              f"({m.__file__})")
    return models, train


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def describe(e: BaseException) -> str:
    """A one-line error for a results row."""
    text = " ".join(str(e).split())
    kind = "out of memory" if is_oom(e) else type(e).__name__
    return f"{kind}: {text[:400]}" if text else kind


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def bench_train_step(name, x, gout, ei, n, device, dtype, args, rows):
    """Appends one row per implementation (see the module doc). Matches gnnio.bench's OPS."""
    models, train = examples()
    dt = str(dtype).split(".")[-1]
    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    features = x.detach()
    proj = torch.randn(features.size(1), NUM_CLASSES, generator=gen, device=device)
    perm = torch.randperm(n, generator=gen, device=device)
    data = SimpleNamespace(x=features, y=(features.float() @ proj).argmax(1),
                           train_idx=perm[: max(1, n // 2)], device=device)
    del proj, perm
    impls = ["gnnio"] + (["pyg"] if args.compare == "pyg" else []) \
        + (["gnnio+compile"] if args.compile_backend != "none" else [])
    curves = {}
    for impl in impls:
        row = dict(graph=name, layer=LAYER, impl=impl, dtype=dt, fwd_ms=None, fwd_bwd_ms=None,
                   peak_extra_gib=None)
        try:
            _measure(impl, row, models, train, data, ei, n, device, dtype, args, curves)
        except Exception as e:  # noqa: BLE001 - one implementation's failure is its row's result
            row["error"] = describe(e)
        if impl != "gnnio" and impl in curves and "gnnio" in curves:
            steps = min(len(curves[impl]), len(curves["gnnio"]))
            row["loss_max_abs_diff"] = max(abs(a - b) for a, b in
                                           zip(curves[impl][:steps], curves["gnnio"][:steps]))
        rows.append(row)
        getattr(args, "save", lambda: None)()  # the bench's JSON, rewritten row by row
        free(device)  # after the except block: the traceback no longer holds the step's tensors


def _measure(impl, row, models, train, data, ei, n, device, dtype, args, curves):
    cuda = device.type == "cuda"
    layers = "gnnio" if impl.startswith("gnnio") else "pyg"
    before = torch.cuda.memory_allocated(device) if cuda else 0
    graph = models.graph_input(layers, ei, n)

    model = models.build_model(MODEL, layers, data.x.size(1), NUM_CLASSES, seed=args.seed,
                               hidden=args.train_hidden, heads=args.train_heads)
    model = model.to(device=device, dtype=dtype)
    row.update(model=f"{MODEL} x{model.num_layers}: hidden {model.heads} heads x {model.hidden}",
               params=sum(p.numel() for p in model.parameters()))
    net = model
    if impl == "gnnio+compile":
        net, row["compile_s"], note = _compile(model, data, graph, args.compile_backend, device)
        row["compile_backend"] = args.compile_backend
        if note:
            row["note"] = note

    # The loss curve from the initial weights (its steps also warm up caches and plans).
    t0 = time.perf_counter()
    curve = train.train_full_graph(net, data, graph, args.train_steps, lr=LR, log=None)
    row["loss_steps"] = len(curve)
    row["loss_curve"] = curve
    row["curve_s"] = time.perf_counter() - t0
    curves[impl] = curve

    # Timing: further steps of a fresh optimizer (the same work as the curve's steps).
    loss_of, step, opt = _step_fns(net, data, graph)
    row["fwd_bwd_ms"] = median_ms(step, device, args.warmup, args.repeat)
    row["fwd_ms"] = median_ms(loss_of, device, 1, args.repeat)
    opt.zero_grad(set_to_none=True)
    if cuda:
        row["state_gib"] = (torch.cuda.memory_allocated(device) - before) / 2**30
    row["peak_extra_gib"] = peak_extra_gib(step, device)


def _step_fns(net, data, graph):
    """(loss_of, step, opt): the loss of one forward (cross entropy on ``data.train_idx``) and
    one training step with a fresh Adam ``opt`` (zero_grad, forward, loss, backward, step)."""
    opt = torch.optim.Adam(net.parameters(), lr=LR)

    def loss_of():
        out = net(data.x, graph)
        return F.cross_entropy(out[data.train_idx], data.y[data.train_idx])

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of().backward()
        opt.step()
    return loss_of, step, opt


def example_step(edge_index, num_nodes, device, features=128, seed=0):
    """A closure that runs one step (zero_grad, forward, cross entropy on half the nodes,
    backward, Adam) of the gnnio model of these rows on random features and labels: what
    ``bench/profile_layers.py --train`` and ``bench/memory_snapshot.py`` look inside. Not a
    timed row (those are ``bench_train_step``'s). ``step.model`` is the model."""
    models, _ = examples()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_nodes, features, generator=gen, device=device)
    y = torch.randint(0, NUM_CLASSES, (num_nodes,), generator=gen, device=device)
    idx = torch.randperm(num_nodes, generator=gen, device=device)[: num_nodes // 2]
    graph = models.graph_input("gnnio", edge_index, num_nodes)
    net = models.build_model(MODEL, "gnnio", features, NUM_CLASSES, seed=seed).to(device)
    _, step, _ = _step_fns(net, SimpleNamespace(x=x, y=y, train_idx=idx), graph)
    step.model = net
    return step


def _compile(model, data, graph, backend, device):
    """(compiled model, seconds of its first forward+backward, note). One eager call first fills
    the Graph's caches (the self-loop graph, the transpose, the plans: a Graph is built outside a
    compiled region); then fullgraph=True and, when that fails, once more without it. The
    gradients of these calls are discarded, so the weights stay the initial ones."""
    note = None
    F.cross_entropy(model(data.x, graph)[data.train_idx], data.y[data.train_idx]).backward()
    model.zero_grad(set_to_none=True)
    for fullgraph in (True, False):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            net = torch.compile(model, backend=backend, fullgraph=fullgraph)
            loss = F.cross_entropy(net(data.x, graph)[data.train_idx], data.y[data.train_idx])
            loss.backward()
        except Exception as e:  # noqa: BLE001
            if not fullgraph or is_oom(e):
                raise RuntimeError(f"compile failed ({'' if fullgraph else 'fullgraph=False; '}"
                                   f"{note + '; ' if note else ''}{describe(e)})") from None
            note = f"fullgraph=True failed, compiled with graph breaks: {describe(e)[:200]}"
            continue
        finally:
            model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return net, time.perf_counter() - t0, note
    raise AssertionError("unreachable")
