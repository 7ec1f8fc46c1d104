"""Markdown tables of the study results (``python -m gnnio.bench.study``); ``python -m
gnnio.bench.study_report FILE.json...`` (re)writes the .md beside each results file."""
import json
import os

from gnnio.bench import __main__ as bench


def write(result, stem):
    """``stem``.json (the results) and ``stem``.md (the tables)."""
    bench._save_json(result, stem + ".json")
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))


def markdown(result):
    return (reorder_markdown if result["study"] == "reorder" else planner_markdown)(result)


def _ms(v):
    return "—" if v is None else f"{v:.3f}"


def _head(result, title, what):
    lines = [f"# {title} — {result['card']}", "",
             f"torch {result['torch']}, PyG {result['pyg']}, gnnio {result['gnnio']} (commit "
             f"{result['commit'][:10]}), {result['date']}; copy rate {result['copy_tbps']:.3f} TB/s; "
             f"F = {result['features']} ({result['attention']}); median of {result['repeat']} "
             f"samples after {result['warmup']} warm-up calls, times in ms. {what}"]
    if result.get("env"):
        lines.append(f"Environment: {', '.join(f'{k}={v}' for k, v in result['env'].items())}.")
    if result.get("stopped"):
        lines.append(f"**Stopped:** {result['stopped']}.")
    if result.get("merged"):  # rows joined from more than one device call, by hand
        lines.append(f"**Merged:** {result['merged']}.")
    for s in result.get("skipped", []):
        lines.append(f"- skipped {s['graph']} {s['order']}: {s['why']}")
    return lines + [""]


def reorder_markdown(result):
    lines = _head(result, "Reordering study", (
        "Each kernel runs on the graph relabelled by the order, on inputs permuted the same way "
        "(float32). Speedup = time in the original order / time in the new one (above 1: the "
        "order helps). Order cost: wall clock of computing the order (gnnio.reorder, CPU) on "
        "the host named; relabel: renaming the edges and building both CSRs on the device. "
        "`segment_reduce(max) light/heavy part`: the op on the edges into light (node-parallel) "
        "or heavy (split) destinations only, standing for the two parts of the degree-aware op."))
    hosts = {}
    for o in result.get("orders", []):
        if o["order_host"]:
            hosts.setdefault(o["order_host"], chr(ord("A") + len(hosts)))
    lines += ["## Graphs and orders", "",
              "| graph | nodes | edges | mean in-degree | max in-degree | order | cost s | host "
              "| relabel ms | bandwidth | edges within 1024 ids | edges / 16x16 tile |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in result.get("orders", []):
        g = result["graphs"].get(o["graph"], {})
        first = o["order"] == "none"
        lines.append(
            f"| {o['graph']} | {g.get('num_nodes', 0):,} | {g.get('num_edges', 0):,} | "
            f"{g.get('mean_in_degree', 0):.1f} | {g.get('max_in_degree', 0):,} | " if first else "| | | | | | ")
        lines[-1] += (f"{o['order']} | {o['order_cost_s']:.3f} | {hosts.get(o['order_host'], '—')} | "
                      f"{o['relabel_ms']:.1f} | {o['bandwidth']:,} | {o['near_edges']:.1%} | "
                      f"{o['edges_per_tile']:.2f} |")
    if hosts:
        lines += [""] + [f"Host {k}: {h}" + ("  " if i < len(hosts) - 1 else "")
                         for i, (h, k) in enumerate(hosts.items())]
    orders = list(dict.fromkeys(o["order"] for o in result.get("orders", [])))
    lines += ["", "## Kernel times, ms (speedup over the original order)", "",
              "| graph | kernel | pass | " + " | ".join(orders) + " |",
              "|---|---|---|" + "---|" * len(orders)]
    cells = {}
    for r in result["rows"]:
        cells.setdefault((r["graph"], r["layer"]), {})[r["order"]] = r
    for (graph, layer), by_order in cells.items():
        for key, label, speed in (("fwd_ms", "fwd", "speedup_fwd"),
                                  ("fwd_bwd_ms", "fwd+bwd", "speedup_fwd_bwd")):
            out = []
            for order in orders:
                r = by_order.get(order)
                if r is None or r.get(key) is None:
                    out.append("error" if r is not None and r.get("error") else "—")
                else:
                    sp = r.get(speed)
                    out.append(_ms(r[key]) + ("" if order == "none" or sp is None
                                              else f" ({sp:.2f}x)"))
            lines.append(f"| {graph} | {layer} | {label} | " + " | ".join(out) + " |")
    for r in result["rows"]:
        if r.get("error"):
            lines.append(f"\n{r['graph']} {r['layer']} {r['order']}: {r['error']}")
    return "\n".join(lines) + "\n"


def planner_markdown(result):
    from gnnio.bench.study_planner import pass_pick, verdict

    lines = _head(result, "Planner study", (
        "Each fixed backend and the planner's automatic choice (its default call path) on the "
        "same graph and inputs, timed the same way and interleaved round by round (fwd: an "
        "inference call, without autograd; fwd+bwd: a training call; the planner's pick is "
        "for each); ratio = "
        "planner / fastest fixed backend of that pass (above 1: the planner is slower), split "
        "into pick / fastest (the planner's choice run as a fixed backend: what the choice "
        "costs) and planner / pick (what the planner's own call adds, and noise). A miss is "
        "'same kernel' when the planner ran the fastest backend's kernel, 'other kernel' when "
        "it chose another. A backend marked * is shown but not counted (see the notes)."))
    lines += ["| graph | family | dtype | pass | fixed backends | fastest | planner pick | planner "
              "| planner / fastest | pick / fastest | planner / pick | within 10% |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    total, misses, notes, kinds = 0, [], {}, {}
    for r in result["rows"]:
        if "miss_fwd" not in r:  # a results file from before the split: derive it
            r = verdict(dict(r, one_kernel=bool(r.get("note"))))
        for key, label, suffix in (("fwd_ms", "fwd", "fwd"), ("fwd_bwd_ms", "fwd+bwd", "fwd_bwd")):
            fixed = ", ".join(f"{b}{'*' if b in r['excluded'] else ''} {_ms(m.get(key))}"
                              for b, m in r["backends"].items())
            ratio, ok = r.get(f"ratio_{suffix}"), r.get(f"within_10pct_{suffix}")
            miss = r.get(f"miss_{suffix}")
            if ok is not None:
                total += 1
                if not ok:
                    misses.append(f"{r['graph']} {r['family']} {r['dtype']} {label} ({ratio:.2f}x, "
                                  f"{miss})")
                    kinds[miss] = kinds.get(miss, 0) + 1
            lines.append(
                f"| {r['graph']} | {r['family']} | {r['dtype']} | {label} | {fixed} | "
                f"{r.get(f'fastest_{suffix}') or '—'} | "
                f"{pass_pick(r, suffix)} | "
                f"{_ms(r.get(key))} | "
                f"{_x(ratio)} | {_x(r.get(f'pick_ratio_{suffix}'))} | "
                f"{_x(r.get(f'overhead_ratio_{suffix}'))} | "
                f"{'—' if ok is None else ('yes' if ok else f'**no** ({miss})')} |")
        for b, why in r["excluded"].items():
            notes.setdefault(f"{b}* ({r['family']}, {r['dtype']})", {})[why] = None
        if r.get("note"):
            notes.setdefault(r["note"], {})[f"{r['graph']} {r['family']}"] = None
        for b, m in [*r["backends"].items(), ("planner", r)]:
            for err in ("error", "device_error"):
                if m.get(err):
                    notes.setdefault(f"{r['graph']} {r['family']} {r['dtype']} {b}", {})[m[err]] = None
    split = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    lines += ["", f"**{total - len(misses)} of {total}** (graph, family, dtype, pass) within 10% "
              "of the fastest fixed backend."
              + (f" Not within ({split}): " + "; ".join(misses) + "." if misses else "")]
    lines += _device_time_lines(result["rows"])
    if notes:
        lines += ["", "Notes:"] + [f"- {k}: {'; '.join(v)}" for k, v in notes.items()]
    return "\n".join(lines) + "\n"


def _device_time_lines(rows):
    """The verdict on the device-only timings (--device-time: CUDA-graph replays), when the rows
    have them: the count, and each miss with the host-inclusive ratio of the same pass."""
    from gnnio.bench.study_planner import verdict

    total, misses, kinds = 0, [], {}
    for r in rows:
        if "fwd_device_ms" not in r and "fwd_bwd_device_ms" not in r:
            continue
        if "miss_fwd_device" not in r and "miss_fwd_bwd_device" not in r:
            r = verdict(dict(r, one_kernel=bool(r.get("note"))))
        for label, suffix in (("fwd", "fwd_device"), ("fwd+bwd", "fwd_bwd_device")):
            ok = r.get(f"within_10pct_{suffix}")
            if ok is None:
                continue
            total += 1
            if not ok:
                miss, host = r.get(f"miss_{suffix}"), r.get(f"ratio_{suffix[:-7]}")
                kinds[miss] = kinds.get(miss, 0) + 1
                misses.append(f"{r['graph']} {r['family']} {r['dtype']} {label} "
                              f"({r[f'ratio_{suffix}']:.2f}x on the device, {_x(host)} with the host; "
                              f"{miss}; fastest {r.get(f'fastest_{suffix}')} "
                              f"{_ms(r.get(f'fastest_{suffix}_ms'))} ms)")
    if not total:
        return []
    split = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return ["", f"**Device time** (each candidate captured in a CUDA graph, its replays timed the "
                f"same way: the GPU's time without the host's per-call work): **{total - len(misses)} "
                f"of {total}** within 10% of the fastest fixed backend."
            + (f" Not within ({split}): " + "; ".join(misses) + "." if misses else "")]


def _x(v):
    return "—" if v is None else f"{v:.2f}x"


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:]:
        with open(path) as f:
            res = json.load(f)
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write(markdown(res))
