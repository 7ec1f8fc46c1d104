"""Issue 7's GPU measurements, run on the CPU at small sizes: the ``GATv2x3-train`` rows of
``gnnio bench`` (gnnio, PyG and compiled gnnio from the same weights, with loss curves) and
``python -m gnnio.bench.scale`` (the GATv2Conv scale ladder), including the paths that keep a
GPU run's numbers when something fails: one implementation out of memory or failing to compile,
a size that does not fit, and the time limit. No timing is asserted."""
import json
import math
import time

import pytest
import torch

import gnnio
from gnnio.bench import __main__ as bench
from gnnio.bench import scale, training

pytest.importorskip("torch_geometric")

ROW_KEYS = {"graph", "layer", "impl", "dtype", "fwd_ms", "fwd_bwd_ms", "peak_extra_gib"}
# Cora, the examples' 3-layer GATv2 shrunk (2 heads x 8) so that a 2-core CPU runs it quickly.
TRAIN = ["--graphs", "cora", "--layers", training.LAYER, "--device", "cpu", "--warmup", "0",
         "--repeat", "1", "--features", "16", "--train-hidden", "8", "--train-heads", "2",
         "--no-plot"]
SCALE = ["--nodes", "300", "--features", "16", "--heads", "2", "--channels", "8", "--device", "cpu",
         "--warmup", "0", "--repeat", "1"]


def train_rows(path):
    with open(path) as f:
        result = json.load(f)
    assert {"card", "torch", "pyg", "date", "commit", "copy_tbps", "rows"} <= set(result)
    rows = [r for r in result["rows"] if r["layer"] == training.LAYER]
    assert all(ROW_KEYS <= set(r) for r in rows)
    return {r["impl"]: r for r in rows}


def test_train_rows_on_cora(tmp_path):
    out = tmp_path / "train.json"
    bench.main([*TRAIN, "--train-steps", "5", "--compile-backend", "eager", "--out", str(out)])
    rows = train_rows(out)
    assert set(rows) == {"gnnio", "pyg", "gnnio+compile"}
    for impl, r in rows.items():
        assert "error" not in r, (impl, r["error"])
        assert r["dtype"] == "float32" and r["model"] == "gatv2 x3: hidden 2 heads x 8"
        assert math.isfinite(r["fwd_ms"]) and r["fwd_ms"] > 0
        assert math.isfinite(r["fwd_bwd_ms"]) and r["fwd_bwd_ms"] > 0
        assert r["peak_extra_gib"] is None  # measured on CUDA only
        assert r["loss_steps"] == 5 and len(r["loss_curve"]) == 5
        assert all(math.isfinite(v) for v in r["loss_curve"])
    assert rows["gnnio"]["loss_curve"][-1] < rows["gnnio"]["loss_curve"][0]  # it learns
    # Same initial weights, no dropout: the curves agree (and the compiled model is the model).
    assert rows["pyg"]["loss_max_abs_diff"] <= 1e-4
    assert rows["gnnio+compile"]["loss_max_abs_diff"] <= 1e-4
    assert rows["gnnio+compile"]["compile_backend"] == "eager" and rows["gnnio+compile"]["compile_s"] > 0
    assert "note" not in rows["gnnio+compile"]  # fullgraph=True compiled
    table = out.with_suffix(".md").read_text()
    assert f"| cora | {training.LAYER} | float32 | pyg |" in table
    assert "pyg loss curve within" in table


def test_train_failures_become_rows(tmp_path, monkeypatch):
    """PyG out of memory and a compile error are recorded in their rows; gnnio's row is whole."""
    models, _ = training.examples()
    real_input = models.graph_input

    def graph_input(impl, edge_index, num_nodes):
        if impl == "pyg":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return real_input(impl, edge_index, num_nodes)

    def broken_compile(*args, **kwargs):
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(models, "graph_input", graph_input)
    monkeypatch.setattr(torch, "compile", broken_compile)
    out = tmp_path / "train.json"
    bench.main([*TRAIN, "--train-steps", "2", "--out", str(out)])
    rows = train_rows(out)
    assert set(rows) == {"gnnio", "pyg", "gnnio+compile"}
    assert "error" not in rows["gnnio"] and rows["gnnio"]["fwd_bwd_ms"] > 0
    assert rows["pyg"]["error"].startswith("out of memory") and rows["pyg"]["fwd_bwd_ms"] is None
    assert "loss_max_abs_diff" not in rows["pyg"]
    assert "compile failed" in rows["gnnio+compile"]["error"]
    assert "inductor exploded" in rows["gnnio+compile"]["error"]
    assert "(pyg): out of memory" in out.with_suffix(".md").read_text()


def test_train_layer_refuses_bad_options(capsys):
    for extra, message in ((["--train-steps", "0"], "--train-steps"),
                           (["--train-hidden", "0"], "--train-hidden")):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(TRAIN + extra)
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def check_scale_file(path):
    with open(path) as f:
        result = json.load(f)
    assert {"card", "torch", "gnnio", "date", "commit", "copy_tbps", "settings", "rows",
            "largest_fit", "stopped"} <= set(result)
    for r in result["rows"]:
        assert ROW_KEYS | {"num_nodes", "num_edges", "fits"} <= set(r)
        assert r["layer"] == scale.LAYER and r["impl"] == "gnnio"
    assert path.with_suffix(".md").exists()
    return result


def test_scale_tiny_on_cpu(tmp_path):
    out = tmp_path / "scale.json"
    scale.main([*SCALE, "--edges", "2K,4K", "--time-limit", "300", "--out", str(out)])
    result = check_scale_file(out)
    assert result["stopped"] is None
    rows = result["rows"]
    assert [(r["num_edges"], r["dtype"], r["fits"]) for r in rows] == [(2000, "float32", True),
                                                                       (4000, "float32", True)]
    for r in rows:
        assert r["graph"] == f"powerlaw-300-{r['num_edges'] // 1000}K"
        assert r["index_dtype"] == "int32" and r["num_nodes"] == 300
        assert math.isfinite(r["loss"]) and r["fwd_bwd_ms"] > 0 and len(r["step_ms"]) == 1
        assert r["check_max_rel_diff"] < 1e-4 and len(r["check_rows"]) >= 2
    assert result["largest_fit"]["float32"]["num_edges"] == 4000
    assert "largest fit, float32: 4,000 edges" in out.with_suffix(".md").read_text()


def test_scale_stops_at_the_first_size_that_does_not_fit(tmp_path, monkeypatch):
    real_step = scale.run_step
    tried = []

    def run_step(graph, dtype, args, mem, row):
        tried.append(graph.num_edges)
        if graph.num_edges >= 4000:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(graph, dtype, args, mem, row)

    monkeypatch.setattr(scale, "run_step", run_step)
    out = tmp_path / "scale.json"
    scale.main([*SCALE, "--edges", "2K,4K,8K", "--check-rows", "0", "--out", str(out)])
    result = check_scale_file(out)
    assert tried == [2000, 4000]
    assert [r["fits"] for r in result["rows"]] == [True, False]
    assert result["rows"][1]["error"].startswith("out of memory")
    assert result["largest_fit"]["float32"]["num_edges"] == 2000


def test_scale_time_limit_stops_a_running_size(tmp_path, monkeypatch):
    def run_step(graph, dtype, args, mem, row):
        time.sleep(60)  # the alarm interrupts it

    monkeypatch.setattr(scale, "run_step", run_step)
    out = tmp_path / "scale.json"
    t0 = time.perf_counter()
    scale.main([*SCALE, "--edges", "2K", "--time-limit", "3", "--out", str(out)])
    assert time.perf_counter() - t0 < 60
    result = check_scale_file(out)
    assert result["stopped"] == "time limit reached while a size was running"
    assert result["rows"] == [] and result["largest_fit"] == {}


def test_scale_time_limit_skips_a_size_predicted_too_long(tmp_path, monkeypatch):
    def run_step(graph, dtype, args, mem, row):
        time.sleep(1)  # scaled by 100x the edges: far beyond the limit
        row.update(fits=True, fwd_bwd_ms=1000.0)

    monkeypatch.setattr(scale, "run_step", run_step)
    out = tmp_path / "scale.json"
    scale.main([*SCALE, "--edges", "2K,200K", "--time-limit", "20", "--out", str(out)])
    result = check_scale_file(out)
    assert result["stopped"].startswith("time limit: 200,000 edges predicted")
    assert [r["num_edges"] for r in result["rows"]] == [2000]
    assert result["largest_fit"]["float32"]["num_edges"] == 2000


def test_scale_generator_has_the_standard_distribution():
    """The chunked generator draws from gnnio.datasets.powerlaw's distribution (another random
    stream): ids in range, int32, and the same top in-degrees within sampling noise."""
    n, e = 1000, 200_000
    ei = scale.generate(n, e, chunk=30_000)
    assert ei.shape == (2, e) and ei.dtype == torch.int32
    assert int(ei.min()) >= 0 and int(ei.max()) < n
    ref = gnnio.datasets.powerlaw(n, e)
    ours_deg = torch.bincount(ei[1].long(), minlength=n).sort(descending=True).values[:5].double()
    ref_deg = torch.bincount(ref[1], minlength=n).sort(descending=True).values[:5].double()
    assert ((ours_deg - ref_deg).abs() / ref_deg).max() < 0.05, (ours_deg, ref_deg)
    src_deg = torch.bincount(ei[0].long(), minlength=n).double()  # sources uniform
    assert src_deg.max() < 2 * e / n
    assert torch.equal(scale.generate(n, e, chunk=30_000), ei)  # seeded


def test_example_step_trains_the_gnnio_model():
    """training.example_step (what the profile and the allocator trace run): one call is one
    Adam step of the gnnio GATv2 model: its weights change."""
    data = gnnio.datasets.load("cora")
    step = training.example_step(data.edge_index, data.num_nodes, torch.device("cpu"), features=16)
    net = step.model
    assert isinstance(net.convs[0], gnnio.nn.GATv2Conv)
    before = [p.detach().clone() for p in net.parameters()]
    step()
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
