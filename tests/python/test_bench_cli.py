"""`gnnio bench` end to end on the CPU: the console entry point (in process) and
`python -m gnnio.bench` (a subprocess) on the bundled Cora graph with a fast setting, the files
they write (results-schema JSON, markdown, PNG), .pt edge_index input, and the refusal of bad
input with a message instead of a traceback. No timing is asserted."""
import datetime
import importlib.metadata
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

import gnnio
from gnnio import cli
from gnnio.bench import __main__ as bench
from gnnio.bench.plot import ratios

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LAYERS = ["GCNConv", "SAGEConv(max)"]
FAST = ["--graphs", "cora", "--layers", ",".join(LAYERS), "--repeat", "1", "--warmup", "0",
        "--features", "16", "--device", "cpu"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROW_KEYS = {"graph", "layer", "impl", "dtype", "fwd_ms", "fwd_bwd_ms", "peak_extra_gib"}


def env_with_gnnio():
    """The subprocess imports this checkout's gnnio (installed or not)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(gnnio.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def check_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    assert width >= 300 and height >= 300, (width, height)
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"


def check_results(json_path, graph="cora", layers=LAYERS):
    with open(json_path) as f:
        result = json.load(f)
    import torch_geometric

    assert result["card"].startswith("CPU")
    assert result["torch"] == torch.__version__
    assert result["pyg"] == torch_geometric.__version__
    assert result["gnnio"] == gnnio.__version__
    datetime.date.fromisoformat(result["date"])
    assert isinstance(result["commit"], str) and result["commit"]
    assert result["copy_tbps"] > 0
    rows = result["rows"]
    assert rows and all(ROW_KEYS <= set(r) for r in rows)
    for layer in layers:
        mine = {r["impl"]: r for r in rows if r["graph"] == graph and r["layer"] == layer}
        assert set(mine) == {"gnnio", "pyg"}, (layer, set(mine))
        for r in mine.values():
            assert r["dtype"] == "float32"
            assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
            assert r["peak_extra_gib"] is None  # measured on CUDA only
        assert mine["pyg"]["max_rel_diff_vs_gnnio"] < 1e-3
    return result


# ---------------------------------------------------------------------------------------------
# the two ways in, each writing table, JSON, markdown and plot

def test_gnnio_bench_console_entry_in_process(tmp_path, capsys):
    out = tmp_path / "results" / "cpu-cora.json"
    assert cli.main(["bench", *FAST, "--compare", "pyg", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "| graph | layer | dtype |" in captured.out and "| cora | SAGEConv(max) |" in captured.out
    assert "[1/3] cora: loading" in captured.err and "[3/3] cora: SAGEConv(max)" in captured.err
    assert "[1/3]" not in captured.out  # progress stays off stdout
    check_results(out)
    md = (tmp_path / "results" / "cpu-cora.md").read_text()
    assert "| cora | GCNConv | float32 | pyg |" in md
    check_png(tmp_path / "results" / "cpu-cora.png")


def test_python_m_gnnio_bench_subprocess(tmp_path):
    out, plot = tmp_path / "r.json", tmp_path / "figs" / "speedup.png"
    proc = subprocess.run([sys.executable, "-m", "gnnio.bench", *FAST, "--out", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, timeout=300,
                          env=env_with_gnnio(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| cora | GCNConv |" in proc.stdout
    assert "cora: GCNConv" in proc.stderr and "Traceback" not in proc.stderr
    check_results(out)
    assert (tmp_path / "r.md").exists()
    check_png(plot)
    assert not (tmp_path / "r.png").exists()  # --plot chose where it goes


def test_plot_skipped_with_a_note_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "have_matplotlib", lambda: False)
    out = tmp_path / "r.json"
    cli.main(["bench", "--graphs", "grid-8x8", "--layers", "spmm", "--repeat", "1", "--warmup", "0",
              "--features", "4", "--device", "cpu", "--compare", "none", "--out", str(out)])
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert out.exists() and (tmp_path / "r.md").exists() and not (tmp_path / "r.png").exists()


def test_ratios_use_fwd_bwd_where_present_else_fwd():
    row = lambda impl, layer, fwd, both, mem: dict(  # noqa: E731
        graph="g", layer=layer, impl=impl, dtype="float32", fwd_ms=fwd, fwd_bwd_ms=both, peak_extra_gib=mem)
    result = {"rows": [row("gnnio", "GCNConv", 1.0, 2.0, 0.5), row("pyg", "GCNConv", 4.0, 10.0, 2.0),
                       row("gnnio", "spmm", 1.0, 3.0, 0.1), row("torch.sparse", "spmm", 3.0, None, None),
                       row("gnnio", "Graph", 0.1, None, None)]}
    got = {(r["layer"], r["ref"]): r for r in ratios(result)}
    assert set(got) == {("GCNConv", "pyg"), ("spmm", "torch.sparse")}
    assert got["GCNConv", "pyg"]["speedup"] == 5.0 and got["GCNConv", "pyg"]["basis"] == "fwd+bwd"
    assert got["GCNConv", "pyg"]["memory"] == 4.0
    assert got["spmm", "torch.sparse"]["speedup"] == 3.0 and got["spmm", "torch.sparse"]["basis"] == "fwd"
    assert got["spmm", "torch.sparse"]["memory"] is None


# ---------------------------------------------------------------------------------------------
# a user's edge_index saved with torch.save

def test_pt_edge_index_tensor_and_dict(tmp_path, capsys):
    ei = gnnio.datasets.grid(6, 7)
    torch.save(ei.to(torch.int32), tmp_path / "plain.pt")
    torch.save({"edge_index": ei, "num_nodes": torch.tensor(50)}, tmp_path / "withn.pt")

    plain = bench.load_edge_index_file(str(tmp_path / "plain.pt"))
    assert plain.name == "plain" and plain.num_nodes == 42
    assert plain.edge_index.dtype == torch.int64 and torch.equal(plain.edge_index, ei)
    assert bench.load_edge_index_file(str(tmp_path / "withn.pt")).num_nodes == 50  # 8 isolated

    out = tmp_path / "pt.json"
    cli.main(["bench", "--graphs", f"{tmp_path / 'plain.pt'},{tmp_path / 'withn.pt'}", "--layers",
              "spmm,GCNConv", "--repeat", "1", "--warmup", "0", "--features", "8", "--device", "cpu",
              "--out", str(out), "--no-plot"])
    assert "plain: 42 nodes, 142 edges" in capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    assert {r["graph"] for r in rows} == {"plain", "withn"}
    assert {(r["layer"], r["impl"]) for r in rows if r["graph"] == "withn"} >= {
        ("spmm", "gnnio"), ("spmm", "torch.sparse"), ("GCNConv", "gnnio"), ("GCNConv", "pyg")}
    assert not (tmp_path / "pt.png").exists()


# ---------------------------------------------------------------------------------------------
# bad input: a non-zero exit and a message naming the problem, never a traceback

def bad_files(tmp_path):
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    files = {
        "float.pt": ei.float(), "three_rows.pt": torch.zeros(3, 4, dtype=torch.long),
        "one_dim.pt": torch.arange(6), "no_key.pt": {"edges": ei}, "a_list.pt": {"edge_index": [[0, 1]]},
        "negative.pt": torch.tensor([[0, -1], [1, 0]]), "small_n.pt": {"edge_index": ei, "num_nodes": 2},
        "empty.pt": torch.zeros(2, 0, dtype=torch.long),
    }
    for name, obj in files.items():
        torch.save(obj, tmp_path / name)
    (tmp_path / "text.pt").write_text("not a torch file\n")
    (tmp_path / "edges.csv").write_text("0,1\n")
    return tmp_path


BAD = [
    (["--graphs", "{tmp}/missing.pt"], "no such file"),
    (["--graphs", "{tmp}/missing.mtx"], "no such file"),
    (["--graphs", "cora,no-such-graph"], "unknown graph 'no-such-graph'"),
    (["--graphs", "{tmp}/edges.csv"], "unknown file type"),
    (["--graphs", "{tmp}/float.pt"], "must be an integer tensor, got torch.float32"),
    (["--graphs", "{tmp}/three_rows.pt"], "must have shape [2, E], got [3, 4]"),
    (["--graphs", "{tmp}/one_dim.pt"], "must have shape [2, E], got [6]"),
    (["--graphs", "{tmp}/no_key.pt"], "no 'edge_index' key"),
    (["--graphs", "{tmp}/a_list.pt"], "edge_index must be a tensor, got list"),
    (["--graphs", "{tmp}/negative.pt"], "negative node ids"),
    (["--graphs", "{tmp}/small_n.pt"], "'num_nodes' is 2 but edge_index refers to node 2"),
    (["--graphs", "{tmp}/empty.pt"], "edge_index is empty"),
    (["--graphs", "{tmp}/text.pt"], "torch.load cannot read it"),
    (["--layers", "GCNConv,NoSuchConv"], "unknown layer 'NoSuchConv'"),
    (["--dtype", "bfloat16"], "--dtype bfloat16 does not run on cpu"),
    (["--dtype", "float16"], "--dtype float16 does not run on cpu"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--features", "0"], "--features must be positive, got 0"),
    (["--features", "-4"], "--features must be positive, got -4"),
    (["--repeat", "0"], "--repeat must be 1 or more"),
    (["--device", "nonsense"], "unknown --device 'nonsense'"),
    (["--device", "mps"], "gnnio's kernels run on cpu and cuda"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_exits_with_a_message(extra, message, tmp_path, capsys):
    tmp = bad_files(tmp_path)
    argv = ["bench", *FAST, *[a.format(tmp=tmp) for a in extra]]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err
    assert message in err, err
    assert "gnnio bench: error:" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *FAST, "--device", "cuda"])
    assert e.value.code == 2 and "torch sees no GPU" in capsys.readouterr().err


def test_unparsable_mtx_stops_with_a_message(tmp_path):
    path = tmp_path / "broken.mtx"
    path.write_text("this is not matrix market\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *FAST, "--graphs", str(path)])
    assert "cannot load graph" in str(e.value.code) and "broken.mtx" in str(e.value.code)


def test_bad_input_in_a_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gnnio.bench", "--graphs", str(tmp_path / "gone.pt")],
                          capture_output=True, text=True, timeout=120, env=env_with_gnnio())
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "gone.pt" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------------------------------------
# the `gnnio` command itself, and the progress display

def test_gnnio_command_help_version_and_unknown(capsys):
    assert cli.main([]) == 2
    assert "bench" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and gnnio.__version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["benchmark"])
    assert e.value.code == 2 and "invalid choice: 'benchmark'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0 and "usage: gnnio bench" in capsys.readouterr().out


def test_console_script_is_registered():
    with open(os.path.join(ROOT, "setup.py")) as f:
        setup_py = f.read()
    assert re.search(r'"gnnio=gnnio\.cli:main"', setup_py)
    ep = importlib.metadata.EntryPoint(name="gnnio", value="gnnio.cli:main", group="console_scripts")
    assert ep.load() is cli.main
    # Where this checkout is pip-installed (CI's scripts/install.sh), the script itself runs.
    exe = shutil.which("gnnio")
    installed = [e for e in importlib.metadata.entry_points(group="console_scripts")
                 if e.name == "gnnio" and e.value == "gnnio.cli:main"]
    if exe and installed:
        proc = subprocess.run([exe, "bench", "--help"], capture_output=True, text=True, timeout=120,
                              env=env_with_gnnio())
        assert proc.returncode == 0 and "usage: gnnio bench" in proc.stdout, proc.stderr[-2000:]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_lines_without_a_terminal():
    stream = io.StringIO()
    p = bench.Progress(2, stream)
    p.start("cora: loading")
    p.step()
    p.start("cora: spmm")
    p.log("  spmm: done")
    p.step()
    p.close()
    assert stream.getvalue().splitlines() == ["[1/2] cora: loading", "[2/2] cora: spmm", "  spmm: done"]


def test_progress_bar_on_a_terminal():
    pytest.importorskip("tqdm")
    stream = _Terminal()
    p = bench.Progress(2, stream)
    assert p.bar is not None
    p.start("cora: spmm")
    p.log("  spmm: done")
    p.step()
    p.step()
    p.close()
    text = stream.getvalue()
    assert "cora: spmm:" in text and "/2 [" in text  # the bar (tqdm redraws at most every 0.1 s)
    assert "  spmm: done\n" in text and "[1/2]" not in text


def test_weighted_bench_case_gives_both_sides_the_same_weights():
    from gnnio.bench.cases import LAYERS as CASES

    case = CASES["GraphConv(max)+weight"]
    ours, ref = case.make_gnnio(8), case.make_pyg(8)
    ours.load_state_dict(ref.state_dict())
    ei = torch.randint(0, 50, (2, 400))
    x = torch.randn(50, 8)
    out, ref_out = ours(x, ei), ref(x, ei)
    assert torch.equal(ours._weight, ref._weight)
    assert ours._weight.min() >= 0.5 and ours._weight.max() < 1.5
    # The same selection of the same products feeds the same float32 linear maps.
    assert torch.equal(out, ref_out)
