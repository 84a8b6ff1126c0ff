#!/usr/bin/env python3
"""report.py: merge attnplug-bench's and peer_torch.py's JSON into the bench/results/ table.

With --png it also draws the results as a chart (ours vs each peer, per case; matplotlib). A table
already in bench/results/ is drawn again with --from-md TABLE.md --png CHART.png.
"""
import argparse
import json
import re
import sys

PEERS = ("torch flash", "torch cuDNN")

DECODE_METRIC = ("decode GB/s = K+V bytes of every token in the cache, read once "
                 "(B * L * HK * D * 2 * bytes per element; nvfp4: 9/16, the values and their "
                 "block scales) / median time")
APPEND_METRIC = ("append GB/s = bytes moved once: q read and rotated in place, new k and v read, "
                 "k and v written into their cache slots / median time")
EXTEND_METRIC = ("extend TFLOP/s = 4 * B * HQ * D * (S * P + S^2 / 2) / median time, S new tokens "
                 "over a prefix of P (P = 0: 2 * B * HQ * S^2 * D, the causal half of QK^T and PV)")


def load(path, default):
    """The JSON at `path`, or `default` (with a message) when a step left none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        print("report: %s: %s" % (path, err), file=sys.stderr)
        return default


def shape(case):
    heads = "H%d/%d D%d" % (case["num_qo_heads"], case["num_kv_heads"], case["head_dim"])
    if case["mode"] == "decode":
        what = "B%d L%d" % (case["batch"], case["prefix"] + case["q_len"])
    elif case["mode"] == "append":
        what = "T%d rope %d" % (case["batch"] * case["q_len"], case["rotary_dim"])
    elif case["prefix"] == 0:
        what = "B%d S%d causal" % (case["batch"], case["q_len"])
    else:
        what = "B%d P%d+S%d" % (case["batch"], case["prefix"], case["q_len"])
    return "%s %s %s page %d, KV %s" % (case["mode"], what, heads, case["page_size"],
                                       case["kv_dtype"])


def cell(result, decode):
    """'time ms / metric' for one side, or why it did not run."""
    if not result:
        return "-", None
    if not result.get("ok"):
        return "not run", None
    metric = result["gbps"] if decode else result["tflops"]
    return "%.4f ms / %.0f %s" % (result["ms_median"], metric, "GB/s" if decode else "TFLOP/s"), \
        result["ms_median"]


def ratio(ours_ms, peer_ms):
    return "%.2fx" % (peer_ms / ours_ms) if ours_ms and peer_ms else "-"


def metric_of(result, decode):
    """(GB/s for decode or TFLOP/s for extend, median ms) of one side, or None when not run."""
    if not result or not result.get("ok"):
        return None
    return (result["gbps"] if decode else result["tflops"]), result["ms_median"]


def rows_from_markdown(path):
    """The chart rows of the first results table of a file: (case, shape, mode, {side: (metric,
    ms) or None}). Later tables (earlier runs kept for comparison) are left out."""
    rows, backend = [], None
    cell_re = re.compile(r"([0-9.]+) ms / ([0-9.]+) (GB/s|TFLOP/s)")
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 7 and cells[0] == "case":
                backend = cells[2]
                continue
            if backend is not None and rows and not line.startswith("|"):
                break  # the first table ended
            if backend is None or len(cells) != 7 or cells[0].startswith("---"):
                continue
            values = {}
            for side, text in ((backend, cells[2]), (PEERS[0], cells[3]), (PEERS[1], cells[5])):
                match = cell_re.match(text)
                values[side] = (float(match.group(2)), float(match.group(1))) if match else None
            rows.append((cells[0], cells[1], cells[1].split()[0], values))
    if backend is None:
        raise SystemExit("report: no results table in %s" % path)
    return backend, rows


def draw(rows, backend, title, path):
    """Grouped bars, one panel per mode: ours and each peer per case, with ours/peer above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("decode", "extend") if any(r[2] == m for r in rows)]
    sides = (backend,) + PEERS
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c")
    widths = [sum(r[2] == m for r in rows) for m in modes]
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 + 1.6 * sum(widths), 5.6),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        mine = [r for r in rows if r[2] == mode]
        unit = "GB/s (K+V bytes read once / time)" if mode == "decode" else \
            "TFLOP/s (causal FLOPs / time)"
        for i, side in enumerate(sides):
            xs = [j + (i - 1) * 0.27 for j in range(len(mine))]
            heights = [r[3][side][0] if r[3].get(side) else 0.0 for r in mine]
            bars = ax.bar(xs, heights, 0.27, label=side, color=colors[i])
            for bar, row in zip(bars, mine):
                ours, value = row[3].get(backend), row[3].get(side)
                if value is None:
                    label = "not run"
                elif side == backend or ours is None:
                    label = "%.0f" % value[0]
                else:
                    # ours/peer as the table gives it, from the times: above 1, ours is faster
                    label = "%.0f\n%.2fx" % (value[0], value[1] / ours[1])
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels([r[0] for r in mine], rotation=25, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(mode)
        ax.margins(y=0.25)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(loc="upper center", ncol=3, fontsize=8)
    fig.suptitle(title + "\n(above a peer's bar: ours/peer, peer time / our time; "
                 "above 1 ours is faster)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("report: drew %s" % path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases")
    parser.add_argument("--ours")
    parser.add_argument("--peer")
    parser.add_argument("--png", help="also draw the results as a PNG chart here")
    parser.add_argument("--from-md", help="draw an existing results table (with --png), no JSON")
    parser.add_argument("--gpu", default="unknown GPU")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--date", default="")
    parser.add_argument("--backend", default="flashinfer_like")
    parser.add_argument("--out")
    args = parser.parse_args()

    if args.from_md:
        if not args.png:
            parser.error("--from-md draws a chart: give --png")
        backend, rows = rows_from_markdown(args.from_md)
        with open(args.from_md) as f:
            title = f.readline().lstrip("# ").strip()
            when = f.readline() + f.readline()
        match = re.search(r"date: ([0-9-]+); commit: (\w+)", when)
        if match:
            title += ", %s, commit %s" % match.groups()
        draw(rows, backend, title, args.png)
        return 0
    missing = [name for name in ("cases", "ours", "peer", "out") if not getattr(args, name)]
    if missing:
        parser.error("needs --" + ", --".join(missing) + " (or --from-md)")

    cases = load(args.cases, [])
    ours = {r["case"]: r for r in load(args.ours, [])}
    peer_doc = load(args.peer, {})
    peer_results = peer_doc.get("results", [])
    peers = {(r["case"], r["peer"]): r for r in peer_results}
    notes = sorted({"%s: %s" % (r["case"], r["note"]) for r in peer_results if r.get("note")})

    lines = [
        "# attnplug benchmarks: %s on %s" % (args.backend, args.gpu),
        "",
        "- date: %s; commit: %s; torch %s (CUDA %s, cuDNN %s)" % (
            args.date, args.commit, peer_doc.get("torch", "?"), peer_doc.get("cuda", "?"),
            peer_doc.get("cudnn", "?")),
        "- timing: CUDA events around every call, warm-up first, median of the timed calls; "
        "input sets rotated so one pass reads more than 4x the L2; ours through the attnplug "
        "core API on a paged cache in shuffled page order, the peers (torch SDPA flash and "
        "cuDNN backends) on contiguous K/V of the same shape, in the same call",
        "- " + DECODE_METRIC,
        "- " + EXTEND_METRIC,
        "- " + APPEND_METRIC,
        "- ours/peer = peer median time / our median time: above 1, ours is faster",
        "",
        "| case | shape | %s | torch flash | ours/flash | torch cuDNN | ours/cuDNN |" %
        args.backend,
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in cases:
        name = case["case"]
        decode = case["mode"] != "extend"  # decode and append: GB/s
        ours_text, ours_ms = cell(ours.get(name), decode)
        flash_text, flash_ms = cell(peers.get((name, "torch_flash")), decode)
        cudnn_text, cudnn_ms = cell(peers.get((name, "torch_cudnn")), decode)
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, shape(case), ours_text, flash_text, ratio(ours_ms, flash_ms), cudnn_text,
            ratio(ours_ms, cudnn_ms)))
    not_run = ["%s (ours): %s" % (name, r["status"]) for name, r in ours.items() if not r.get("ok")]
    not_run += ["%s (%s): %s" % (r["case"], r["peer"], r["status"])
                for r in peer_results if not r.get("ok")]
    if notes or not_run:
        lines += ["", "Notes:"]
        lines += ["- " + n for n in notes]
        lines += ["- not run: " + n for n in not_run]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.png:
        rows = []
        for case in cases:
            decode = case["mode"] != "extend"  # decode and append: GB/s
            values = {args.backend: metric_of(ours.get(case["case"]), decode)}
            for side, key in zip(PEERS, ("torch_flash", "torch_cudnn")):
                values[side] = metric_of(peers.get((case["case"], key)), decode)
            rows.append((case["case"], shape(case), case["mode"], values))
        draw(rows, args.backend, "attnplug benchmarks: %s on %s, %s, commit %s" % (
            args.backend, args.gpu, args.date, args.commit), args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
