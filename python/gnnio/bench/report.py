"""The results file as a markdown table: gnnio next to each reference, with the ratio."""


def _fmt(v, spec=".3f"):
    return "—" if v is None else format(v, spec)


def _ratio(ref, ours):
    return "—" if ref is None or ours is None or ours <= 0 else f"{ref / ours:.2f}x"


def markdown_table(result):
    lines = [
        f"# gnnio benchmark — {result['card']}",
        "",
        f"torch {result['torch']}, PyG {result['pyg']}, gnnio {result['gnnio']} (commit "
        f"{result['commit'][:10]}), {result['date']}; copy rate {result['copy_tbps']:.3f} TB/s; "
        f"{result['features']} features. Times are medians in ms; speedup = reference / gnnio; "
        "memory = peak allocated during one forward+backward above what was allocated before.",
        "",
        "| graph | layer | dtype | ref | ref fwd | gnnio fwd | fwd speedup | ref fwd+bwd | gnnio fwd+bwd "
        "| fwd+bwd speedup | ref mem GiB | gnnio mem GiB | gnnio fwd vs floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    ours = {(r["graph"], r["layer"], r["dtype"]): r for r in rows if r["impl"] == "gnnio"}
    for (graph, layer, dtype), g in ours.items():
        refs = [r for r in rows if (r["graph"], r["layer"], r["dtype"]) == (graph, layer, dtype)
                and r["impl"] != "gnnio"] or [None]
        for ref in refs:
            floor = "—"
            if g.get("floor_bytes") and g.get("fwd_ms"):
                floor_ms = g["floor_bytes"] / (result["copy_tbps"] * 1e12) * 1e3
                floor = f"{g['fwd_ms'] / floor_ms:.2f}x"
            rf = ref or {}
            lines.append(
                f"| {graph} | {layer} | {dtype} | {rf.get('impl', '—')} | {_fmt(rf.get('fwd_ms'))} "
                f"| {_fmt(g.get('fwd_ms'))} | {_ratio(rf.get('fwd_ms'), g.get('fwd_ms'))} "
                f"| {_fmt(rf.get('fwd_bwd_ms'))} | {_fmt(g.get('fwd_bwd_ms'))} "
                f"| {_ratio(rf.get('fwd_bwd_ms'), g.get('fwd_bwd_ms'))} "
                f"| {_fmt(rf.get('peak_extra_gib'), '.2f')} | {_fmt(g.get('peak_extra_gib'), '.2f')} | {floor} |")
    tiles = [r for r in rows if r.get("wsb_build_ms") is not None and r["impl"] == "gnnio"]
    if tiles:  # spmm(wsb) rows: what the 16 x 16 tiles cost on each graph
        lines.append("")
        lines += [f"- {r['graph']} ({r['dtype']}): WSB fill ratio {r['fill_ratio']:.3f} (stored zeros / "
                  f"stored entries), {r['num_tiles']:,} tiles, {r['edges_per_tile']:.1f} edges per "
                  f"tile, both WSB builds {r['wsb_build_ms']:.1f} ms" for r in tiles]
    errors = [r for r in rows if r.get("error")]
    for r in errors:
        lines.append(f"\n{r['graph']} {r['layer']} ({r['impl']}): {r['error']}")
    for r in rows:  # training rows: loss curves against gnnio's from the same initial weights
        if r.get("loss_max_abs_diff") is not None:
            lines.append(f"\n{r['graph']} {r['layer']} {r['dtype']}: {r['impl']} loss curve within "
                         f"{r['loss_max_abs_diff']:.3g} of gnnio's over {r['loss_steps']} steps")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    # python -m gnnio.bench.report RESULTS.json...: (re)writes the .md table beside each file.
    import json
    import os
    import sys

    for path in sys.argv[1:]:
        with open(path) as f:
            table = markdown_table(json.load(f))
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write(table)
