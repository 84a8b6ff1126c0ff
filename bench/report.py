#!/usr/bin/env python3
"""report.py: merge attnplug-bench's and peer_torch.py's JSON into the bench/results/ table."""
import argparse
import json
import sys

DECODE_METRIC = ("decode GB/s = K+V bytes of every token in the cache, read once "
                 "(B * L * HK * D * 2 * bytes per element) / median time")
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True)
    parser.add_argument("--ours", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--gpu", default="unknown GPU")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--date", default="")
    parser.add_argument("--backend", default="flashinfer_like")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

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
        "- ours/peer = peer median time / our median time: above 1, ours is faster",
        "",
        "| case | shape | %s | torch flash | ours/flash | torch cuDNN | ours/cuDNN |" %
        args.backend,
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in cases:
        name = case["case"]
        decode = case["mode"] == "decode"
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
