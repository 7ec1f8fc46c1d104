"""``python -m gnnio.bench.study`` (issue 5's reordering and planner studies) on the CPU at small
sizes: the results files' schema and rows, the permutation files (save, load, refusal of a file
made for another graph or holding no permutation), and the time limit. No timing is asserted."""
import gc
import json
import math
import os
import shutil
import time

import pytest
import torch

import gnnio
import gnnio.reorder
from gnnio.bench import perms, study, study_planner
from gnnio.bench.study_planner import verdict

pytest.importorskip("scipy")

HAVE_METIS = True
try:
    gnnio.reorder.check_available("metis")
except ImportError:
    HAVE_METIS = False
SAVED = ["rcm"] + (["metis"] if HAVE_METIS else [])
ORDERS = ["none", "degree"] + SAVED
# cora has no heavy rows; the small power-law graph has a super node (light/heavy parts).
GRAPHS = "cora,powerlaw-3K-30K"
FAST = ["--device", "cpu", "--warmup", "0", "--repeat", "1", "--features", "16"]
HEADER = {"card", "torch", "pyg", "gnnio", "date", "commit", "copy_tbps", "study", "features",
          "rows", "graphs", "skipped", "stopped"}
ROW_KEYS = {"graph", "layer", "impl", "dtype", "fwd_ms", "fwd_bwd_ms", "peak_extra_gib"}
PICKS = {"spmm": {"csr", "wsb"}, "reduce": {"degree-aware", "node-parallel"},
         "attention": {"csr-split", "csr"}, "attention-gat": {"csr-split", "csr", "wsb"}}


def positive(v):
    return v is not None and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def perm_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("perms"))
    study.main(["--save-perms", folder, "--graphs", GRAPHS, "--orders", ",".join(SAVED)])
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory, perm_dir):
    prefix = str(tmp_path_factory.mktemp("study") / "cpu")
    # Only the orders this machine can compute or read (no pymetis on the GPU machine).
    study.main(["--graphs", GRAPHS, *FAST, "--perms", perm_dir, "--out", prefix,
                "--orders", ",".join(o for o in ORDERS if o != "none")])
    out = {}
    for name, suffix in study.SUFFIX.items():
        with open(f"{prefix}-{suffix}.json") as f:
            out[name] = json.load(f)
        with open(f"{prefix}-{suffix}.md") as f:
            out[name + ".md"] = f.read()
    return out


def test_reorder_study_rows(results, perm_dir):
    res = results["reorder"]
    assert HEADER <= set(res) and res["study"] == "reorder" and res["stopped"] is None
    assert res["skipped"] == []
    assert set(res["graphs"]) == {"cora", "powerlaw-3K-30K"}
    rows = res["rows"]
    assert all(ROW_KEYS <= set(r) for r in rows)
    assert all("error" not in r for r in rows), [r["error"] for r in rows if "error" in r]
    for graph in ("cora", "powerlaw-3K-30K"):
        kernels = ["spmm", "reduce", "attention"]
        if graph != "cora":  # the super node: the planner splits, so the parts are measured
            kernels += ["reduce-light", "reduce-heavy"]
        for order in ORDERS:
            got = {r["kernel"] for r in rows if r["graph"] == graph and r["order"] == order}
            assert got == set(kernels), (graph, order)
    for r in rows:
        assert positive(r["fwd_ms"]) and positive(r["fwd_bwd_ms"]) and r["dtype"] == "float32"
        if r["order"] == "none":
            assert r["order_cost_s"] == 0.0 and "speedup_fwd" not in r
        else:
            assert positive(r["speedup_fwd"]) and positive(r["speedup_fwd_bwd"])
            assert r["order_cost_s"] >= 0 and r["order_host"]
        if r["order"] in SAVED:  # read from the files, cost from the host that computed them
            assert r["order_source"] == perms.file_path(perm_dir, r["graph"], r["order"])
        elif r["order"] == "degree":
            assert r["order_source"] == "computed here"
    orders = {(o["graph"], o["order"]): o for o in res["orders"]}
    assert set(orders) == {(g, o) for g in ("cora", "powerlaw-3K-30K") for o in ORDERS}
    # RCM shrinks the bandwidth of cora
    assert orders["cora", "rcm"]["bandwidth"] < orders["cora", "none"]["bandwidth"]
    md = results["reorder.md"]
    assert "| graph | kernel | pass | " + " | ".join(ORDERS) + " |" in md
    assert "| cora | gcn_propagate | fwd |" in md and "segment_reduce(max) heavy part" in md


def test_planner_study_rows(results):
    res = results["planner"]
    assert HEADER <= set(res) and res["study"] == "planner" and res["stopped"] is None
    rows = res["rows"]
    assert {(r["graph"], r["family"], r["dtype"]) for r in rows} == {
        (g, f, "float32") for g in ("cora", "powerlaw-3K-30K") for f in PICKS}
    for r in rows:
        assert ROW_KEYS <= set(r) and "error" not in r
        assert set(r["backends"]) == PICKS[r["family"]] and r["planner_pick"] in PICKS[r["family"]]
        assert r["planner_pick_fwd"] in PICKS[r["family"]]  # the inference call's pick
        assert r["excluded"] == {}  # the CPU has no tf32
        assert r["plan_reason"]
        for key, suffix in (("fwd_ms", "fwd"), ("fwd_bwd_ms", "fwd_bwd")):
            times = {b: m[key] for b, m in r["backends"].items()}
            assert all(positive(t) for t in times.values()) and positive(r[key])
            best = min(times, key=times.get)
            assert r[f"fastest_{suffix}"] == best
            assert r[f"ratio_{suffix}"] == pytest.approx(r[key] / times[best])
            assert r[f"within_10pct_{suffix}"] == (r[f"ratio_{suffix}"] <= 1.10)
            # planner / fastest = (planner / its pick) x (pick / fastest)
            assert r[f"ratio_{suffix}"] == pytest.approx(
                r[f"overhead_ratio_{suffix}"] * r[f"pick_ratio_{suffix}"])
            assert r[f"miss_{suffix}"] in ((None,) if r[f"within_10pct_{suffix}"]
                                           else ("same kernel", "other kernel"))
            assert r[f"{key[:-3]}_samples"] == 1  # --repeat 1
            assert all(m[f"{key[:-3]}_samples"] == 1 for m in r["backends"].values())
        # The CPU has no split; WSB attention is a kernel of its own.
        assert r["one_kernel"] == (r["family"] not in ("spmm", "attention-gat"))
        if r["family"] in ("spmm", "attention-gat"):
            assert r["planner_pick"] == r["planner_pick_fwd"] == "csr"  # the CPU keeps CSR
    md = results["planner.md"]
    assert "| graph | family | dtype | pass | fixed backends |" in md
    assert f"of {2 * len(rows)}** (graph, family, dtype, pass) within 10%" in md


def test_verdict_leaves_out_excluded_backends():
    row = verdict(dict(fwd_ms=1.05, fwd_bwd_ms=3.0, excluded={"wsb": "tf32"},
                       backends={"csr": dict(fwd_ms=1.0, fwd_bwd_ms=2.0),
                                 "wsb": dict(fwd_ms=0.5, fwd_bwd_ms=None)}))
    assert row["fastest_fwd"] == "csr" and row["ratio_fwd"] == pytest.approx(1.05)
    assert row["within_10pct_fwd"] is True
    assert row["ratio_fwd_bwd"] == pytest.approx(1.5) and row["within_10pct_fwd_bwd"] is False


def test_verdict_separates_a_wrong_choice_from_the_same_kernel():
    backends = {"csr": dict(fwd_ms=1.0, fwd_bwd_ms=2.0), "wsb": dict(fwd_ms=0.5, fwd_bwd_ms=2.6)}
    row = verdict(dict(fwd_ms=1.02, fwd_bwd_ms=2.4, excluded={}, backends=backends,
                       planner_pick="csr", one_kernel=False))
    # fwd: picked csr, wsb was fastest: the choice costs 2x, the call itself 1.02x
    assert row["miss_fwd"] == "other kernel" and row["pick_ratio_fwd"] == pytest.approx(2.0)
    assert row["overhead_ratio_fwd"] == pytest.approx(1.02)
    # fwd+bwd: picked the fastest (csr) and was 1.2x slower than it: noise / per-call cost
    assert row["miss_fwd_bwd"] == "same kernel" and row["pick_ratio_fwd_bwd"] == 1.0
    same = verdict(dict(fwd_ms=0.6, fwd_bwd_ms=2.0, excluded={}, backends=backends,
                        planner_pick="csr", one_kernel=True))
    assert same["miss_fwd"] == "same kernel" and same["miss_fwd_bwd"] is None


def test_verdict_and_report_of_device_times():
    """--device-time rows: a verdict of their own (the pass's pick), and the report's count line
    next to the host-inclusive one, each device miss with its host ratio."""
    from gnnio.bench.study_report import planner_markdown

    backends = {"csr": dict(fwd_ms=0.08, fwd_bwd_ms=0.20, fwd_device_ms=0.030, fwd_bwd_device_ms=0.07),
                "wsb": dict(fwd_ms=0.10, fwd_bwd_ms=0.18, fwd_device_ms=0.020, fwd_bwd_device_ms=0.09)}
    row = verdict(dict(graph="g", family="spmm", dtype="float32", fwd_ms=0.10, fwd_bwd_ms=0.18,
                       fwd_device_ms=0.021, fwd_bwd_device_ms=0.09, excluded={}, backends=backends,
                       planner_pick_fwd="wsb", planner_pick="wsb", one_kernel=False))
    # host: the forward's wsb pick misses (csr 0.08 ms), the device: it is the fastest
    assert row["miss_fwd"] == "other kernel" and row["within_10pct_fwd_device"] is True
    assert row["fastest_fwd_device"] == "wsb" and row["ratio_fwd_device"] == pytest.approx(1.05)
    # fwd+bwd: the reverse
    assert row["within_10pct_fwd_bwd"] is True and row["miss_fwd_bwd_device"] == "other kernel"
    assert row["pick_ratio_fwd_bwd_device"] == pytest.approx(0.09 / 0.07)
    head = dict(card="c", torch="t", pyg="p", gnnio="x", commit="h", date="d", copy_tbps=1.0,
                features=16, attention="gatv2", warmup=0, repeat=1, env={})
    md = planner_markdown(dict(head, rows=[row]))
    assert "**1 of 2** (graph, family, dtype, pass) within 10%" in md
    assert "**Device time**" in md and "**1 of 2** within 10% of the fastest fixed backend" in md
    assert "g spmm float32 fwd+bwd (1.29x on the device, 1.00x with the host; other kernel" in md
    plain = dict(row)
    for k in list(plain):
        if "device" in k:
            del plain[k]
    for m in backends.values():
        m.pop("fwd_device_ms"), m.pop("fwd_bwd_device_ms")
    assert "Device time" not in planner_markdown(dict(head, rows=[verdict(plain)]))


def test_measure_interleaved_alternates_and_times_alike(monkeypatch):
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    got = study_planner.measure_interleaved(fns, torch.device("cpu"), warmup=1, repeat=6)
    assert set(got) == set("abc")
    assert all(m["samples"] == 6 and m["inner"] == 1 and m["ms"] >= 0 for m in got.values())
    probes, rest = calls[:6], calls[6:]
    assert probes == ["a", "a", "b", "b", "c", "c"]  # untimed call + probe each
    assert rest[:3] == ["a", "b", "c"]  # warm-up round
    # the rotations of abc, then of cba: within the rounds each candidate follows each other one
    # equally often (a fixed cyclic order gave one predecessor 2 times in 3)
    order = rest[3:]
    assert order == list("abc" "bca" "cab" "cba" "bac" "acb")
    pairs = [order[i:i + 2] for r in range(6) for i in range(3 * r, 3 * r + 2)]
    assert all(pairs.count([x, y]) == 2 for x in "abc" for y in "abc" if x != y)

    # Python's garbage collector is off during the timed rounds only, and restored afterwards
    gc_on = []
    study_planner.measure_interleaved({"g": lambda: gc_on.append(gc.isenabled())},
                                      torch.device("cpu"), warmup=1, repeat=4)
    assert gc_on == [True, True, True, False, False, False, False] and gc.isenabled()

    def boom():
        raise RuntimeError("out of memory")

    slow = lambda: time.sleep(0.03)  # noqa: E731
    monkeypatch.setattr(study_planner, "FEW_SAMPLES_MS", 20.0)
    got = study_planner.measure_interleaved({"x": boom, "slow": slow, "a": fns["a"]},
                                            torch.device("cpu"), warmup=0, repeat=5)
    assert got["x"]["ms"] is None and "out of memory" in got["x"]["error"]
    assert got["slow"]["samples"] == 3 and got["a"]["samples"] == 5


def test_saved_permutations_round_trip(perm_dir):
    data = gnnio.datasets.load("cora")
    fp = perms.fingerprint(data.edge_index, data.num_nodes)
    for order in SAVED:
        saved = torch.load(perms.file_path(perm_dir, "cora", order), weights_only=True)
        assert saved["perm"].dtype == torch.int32 and saved["fingerprint"] == fp
        assert saved["cost_s"] >= 0 and saved["host"]
        loaded, why = perms.load(perm_dir, "cora", order, fp)
        assert why is None and loaded.perm.dtype == torch.int64
        assert perms.is_permutation(loaded.perm, data.num_nodes)
        graph = gnnio.Graph(data.edge_index, num_nodes=data.num_nodes)
        assert torch.equal(loaded.perm, gnnio.reorder.permutation(graph, order).perm)
    # --save-perms keeps valid files (same content, not recomputed)
    before = os.path.getmtime(perms.file_path(perm_dir, "cora", "rcm"))
    study.main(["--save-perms", perm_dir, "--graphs", "cora", "--orders", "rcm"])
    assert os.path.getmtime(perms.file_path(perm_dir, "cora", "rcm")) == before


def test_refuses_a_file_for_another_graph_or_not_a_permutation(tmp_path, perm_dir):
    data = gnnio.datasets.load("cora")
    fp = perms.fingerprint(data.edge_index, data.num_nodes)
    # one edge less: same node count, another graph
    other = perms.fingerprint(data.edge_index[:, 1:], data.num_nodes)
    assert other["sha256"] != fp["sha256"]
    found, why = perms.load(perm_dir, "cora", "rcm", other)
    assert found is None and "computed for another graph" in why and "sha256" in why
    found, why = perms.load(str(tmp_path), "cora", "rcm", fp)
    assert found is None and why.startswith("no file")
    # a file whose perm repeats a node
    bad = torch.load(perms.file_path(perm_dir, "cora", "rcm"), weights_only=True)
    bad["perm"][1] = bad["perm"][0]
    torch.save(bad, perms.file_path(str(tmp_path), "cora", "rcm"))
    found, why = perms.load(str(tmp_path), "cora", "rcm", fp)
    assert found is None and "not a permutation" in why
    assert not perms.is_permutation(torch.tensor([0, 2]), 2)
    assert perms.is_permutation(torch.tensor([1, 0], dtype=torch.int32), 2)
    # In the study: an as20000102 order saved under cora's name is refused and that order skipped
    # (nothing computed in its place: --compute-orders is empty).
    shutil.copy(perms.file_path(perm_dir, "cora", "rcm"), tmp_path / "x.pt")
    folder = tmp_path / "mixed"
    study.main(["--save-perms", str(folder), "--graphs", "as20000102", "--orders", "rcm"])
    os.replace(perms.file_path(str(folder), "as20000102", "rcm"), perms.file_path(str(folder), "cora", "rcm"))
    res = study.main(["--study", "reorder", "--graphs", "cora", *FAST, "--orders", "rcm",
                      "--kernels", "spmm", "--perms", str(folder), "--compute-orders", ""])
    res = res["reorder"]
    assert {r["order"] for r in res["rows"]} == {"none"}
    assert len(res["skipped"]) == 1 and res["skipped"][0]["order"] == "rcm"
    assert "computed for another graph" in res["skipped"][0]["why"]


def test_time_limit_stops_before_the_next_graph(tmp_path, monkeypatch):
    prefix = str(tmp_path / "cut")
    real = study_planner.run_graph

    def run_then_expire(data, fp, args, result, save, clock):  # the limit passes during cora
        real(data, fp, args, result, save, clock)
        clock.start -= 1000

    monkeypatch.setattr(study_planner, "run_graph", run_then_expire)
    study.main(["--study", "planner", "--graphs", "cora,as20000102", *FAST, "--families", "spmm",
                "--time-limit", "10", "--out", prefix])
    with open(prefix + "-planner.json") as f:
        res = json.load(f)
    assert {r["graph"] for r in res["rows"]} == {"cora"}
    assert res["stopped"] and "before planner study of graph as20000102" in res["stopped"]
    with open(prefix + "-planner.md") as f:
        assert "**Stopped:**" in f.read()


@pytest.mark.parametrize("bad", [["--orders", "random"], ["--kernels", "gemm"],
                                 ["--dtypes", "bfloat16"], ["--graphs", "no-such-graph"]])
def test_bad_arguments_exit_with_a_message(bad, capsys):
    with pytest.raises(SystemExit) as e:
        study.parse_args(["--device", "cpu", *bad])
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.cuda
def test_planner_study_device_time_on_cuda(tmp_path):
    """--device-time on a GPU: every candidate of every pass is captured and replayed (a positive
    time, no capture error), and the rows carry their device verdict."""
    prefix = str(tmp_path / "gpu")
    study.main(["--study", "planner", "--graphs", "cora", "--device", "cuda", "--dtypes", "float32",
                "--warmup", "1", "--repeat", "2", "--features", "16", "--device-time", "--out", prefix])
    with open(f"{prefix}-planner.json") as f:
        res = json.load(f)
    assert res["device_time"] is True and res["rows"]
    for r in res["rows"]:
        for key in ("fwd_device_ms", "fwd_bwd_device_ms"):
            assert positive(r[key]), (r["family"], key, r.get("device_error"))
            assert all(positive(m[key]) for m in r["backends"].values()), r["backends"]
        assert r["within_10pct_fwd_device"] is not None and r["within_10pct_fwd_bwd_device"] is not None
    with open(f"{prefix}-planner.md") as f:
        assert "**Device time**" in f.read()
