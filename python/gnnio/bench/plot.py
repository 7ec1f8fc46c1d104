"""The results file as a figure: gnnio's speedup and extra-memory ratio against each reference,
per layer (groups) and graph (bars), as two grouped bar charts in one PNG.

speedup = reference time / gnnio time, forward+backward where both rows have it, else forward
(those bars are hatched); memory ratio = reference peak extra memory / gnnio's (peak allocated
during one forward+backward above what was allocated before; measured on CUDA only). Above 1,
gnnio is faster / uses less. Drawn with matplotlib's Agg canvas (no display, no pyplot state).

``python -m gnnio.bench.plot RESULTS.json...`` (re)draws the .png beside each results file.
"""
import math


def ratios(result):
    """One dict per (graph, layer, dtype, reference): graph, layer, dtype, ref, speedup, basis
    ('fwd+bwd' or 'fwd'; None when no time was measured), memory (None when not measured)."""
    rows = [r for r in result["rows"] if not r.get("error")]
    ours = {(r["graph"], r["layer"], r["dtype"]): r for r in rows if r["impl"] == "gnnio"}
    out = []
    for r in rows:
        g = ours.get((r["graph"], r["layer"], r["dtype"]))
        if r["impl"] == "gnnio" or g is None:
            continue
        speedup, basis = None, None
        for key, name in (("fwd_bwd_ms", "fwd+bwd"), ("fwd_ms", "fwd")):
            if r.get(key) and g.get(key):
                speedup, basis = r[key] / g[key], name
                break
        memory = None
        if r.get("peak_extra_gib") and g.get("peak_extra_gib"):
            memory = r["peak_extra_gib"] / g["peak_extra_gib"]
        out.append(dict(graph=r["graph"], layer=r["layer"], dtype=r["dtype"], ref=r["impl"],
                        speedup=speedup, basis=basis, memory=memory))
    return out


def _groups(items):
    """(group labels, graphs, {(group, graph): item}) in the order the rows came."""
    dtypes = {i["dtype"] for i in items}
    groups, graphs, cell = [], [], {}
    for i in items:
        label = f"{i['layer']}\nvs {i['ref']}" + (f"\n{i['dtype']}" if len(dtypes) > 1 else "")
        if label not in groups:
            groups.append(label)
        if i["graph"] not in graphs:
            graphs.append(i["graph"])
        cell[(label, i["graph"])] = i
    return groups, graphs, cell


def _bars(ax, groups, graphs, cell, key, colors, ylabel):
    """Bars rising (or falling) from 1 on a log axis; False when there was nothing to draw."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    width = 0.8 / max(1, len(graphs))
    values = []
    for gi, label in enumerate(groups):
        for bi, graph in enumerate(graphs):
            item = cell.get((label, graph))
            v = item and item[key]
            if not v or not math.isfinite(v):
                continue
            x = gi - 0.4 + width * (bi + 0.5)
            hatch = "//" if key == "speedup" and item["basis"] == "fwd" else None
            ax.bar(x, v - 1, bottom=1, width=width * 0.92, color=colors[bi], hatch=hatch,
                   edgecolor="black", linewidth=0.4)
            ax.annotate(f"{v:.2f}x" if v < 10 else f"{v:.0f}x", (x, v), ha="center",
                        va="bottom" if v >= 1 else "top", fontsize=7,
                        rotation=90 if len(graphs) * len(groups) > 12 else 0,
                        xytext=(0, 2 if v >= 1 else -2), textcoords="offset points")
            values.append(v)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    if not values:
        return False
    ax.set_yscale("log")
    lo, hi = min(values + [1.0]), max(values + [1.0])
    ax.set_ylim(lo / 1.6, hi * 1.8)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.grid(axis="y", alpha=0.3)
    return True


def write_plot(result, path):
    """Writes the PNG at path (needs matplotlib)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    items = ratios(result)
    groups, graphs, cell = _groups(items)
    width = min(40.0, max(7.0, 1.0 + len(groups) * (0.5 + 0.3 * len(graphs))))
    fig = Figure(figsize=(width, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    cmap = matplotlib.colormaps["tab10" if len(graphs) <= 10 else "tab20"]
    colors = [cmap(i % cmap.N) for i in range(len(graphs))]
    speed_ax, mem_ax = fig.subplots(2, 1)

    title = (f"gnnio vs reference — {result.get('card', '?')}\ntorch {result.get('torch')}, "
             f"PyG {result.get('pyg')}, gnnio {result.get('gnnio', '?')} "
             f"({str(result.get('commit', ''))[:10]}), {result.get('date', '')}; "
             f"{result.get('features', '?')} features")
    fig.suptitle(title, fontsize=10)

    drew = _bars(speed_ax, groups, graphs, cell, "speedup",
                 colors, "speedup (reference time / gnnio time)")
    speed_ax.set_title("Speedup: fwd+bwd (hatched: forward only); above 1 = gnnio faster", fontsize=9)
    if not drew:
        speed_ax.text(0.5, 0.5, "no timings to compare (run with --compare pyg)", ha="center",
                      va="center", transform=speed_ax.transAxes)
        speed_ax.set_yticks([])
    drew = _bars(mem_ax, groups, graphs, cell, "memory",
                 colors, "extra memory ratio (reference / gnnio)")
    mem_ax.set_title("Peak extra memory during fwd+bwd: reference / gnnio; above 1 = gnnio uses less",
                     fontsize=9)
    if not drew:
        mem_ax.text(0.5, 0.5, "no memory measurements (peak memory is measured on CUDA only)",
                    ha="center", va="center", transform=mem_ax.transAxes)
        mem_ax.set_yticks([])
    if graphs:
        handles = [Patch(facecolor=c, edgecolor="black", linewidth=0.4, label=g)
                   for g, c in zip(graphs, colors)]
        speed_ax.legend(handles=handles, title="graph", fontsize=8, title_fontsize=8,
                        loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    import json
    import os
    import sys

    for results in sys.argv[1:]:
        with open(results) as f:
            write_plot(json.load(f), os.path.splitext(results)[0] + ".png")
