#!/usr/bin/env python3
"""peer_torch.py: the peer of attnplug-bench: torch SDPA (flash, cuDNN) on the same shapes.

Reads the case list `attnplug-bench --list` prints, builds contiguous q/k/v of each shape
([B, H, S, D], bf16), and times F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION)
and sdpa_kernel(CUDNN_ATTENTION) the way attnplug-bench times its backend: CUDA events around
every call, a warm-up, the median of --runs calls, input sets rotated so the KV read exceeds 4x
the L2. Bytes and FLOPs come from the case list, so both sides count alike:
  decode GB/s    = K+V elements read once * bytes per element / median time
  extend TFLOP/s = 4 * B * HQ * D * (S * P + S^2 / 2) / median time
Decode is one query token per sequence over the whole cache (no mask); extend without prefix
is causal (is_causal=True); extend over a prefix uses the lower-right causal mask
(torch.nn.attention.bias.causal_lower_right), which is what a paged extend computes. Torch's
SDPA has no fp8 KV: an fp8 case runs with bf16 K/V, and its GB/s counts those bf16 bytes.
"""
import argparse
import json
import math
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

PEERS = {
    "torch_flash": SDPBackend.FLASH_ATTENTION,
    "torch_cudnn": SDPBackend.CUDNN_ATTENTION,
}
MAX_SETS = 16


def make_set(case, device, seed):
    """One input set: q [B, HQ, S, D], k/v [B, HK, P + S, D], bf16, uniform like ours."""
    gen = torch.Generator(device=device).manual_seed(seed)
    b, hq, hk, d = case["batch"], case["num_qo_heads"], case["num_kv_heads"], case["head_dim"]
    s, kv_len = case["q_len"], case["prefix"] + case["q_len"]

    def uniform(shape, bound):
        x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
        return ((2 * x - 1) * bound).to(torch.bfloat16)

    return (uniform((b, hq, s, d), 2.0), uniform((b, hk, kv_len, d), 2.0),
            uniform((b, hk, kv_len, d), 2.0))


def attention_call(case, gqa_mode):
    """The SDPA call for a case: decode (no mask), causal, or lower-right causal over a prefix."""
    s, kv_len = case["q_len"], case["prefix"] + case["q_len"]
    group = case["num_qo_heads"] // case["num_kv_heads"]
    mask = None
    causal = False
    if case["mode"] == "extend" and case.get("causal") is False:
        causal = False  # fav-bench's non-causal cases (no mask at all)
    elif case["mode"] == "extend" and case["prefix"] == 0:
        causal = True
    elif case["mode"] == "extend":
        mask = causal_lower_right(s, kv_len)

    def call(q, k, v):
        if gqa_mode == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    def expand(k, v):
        # Outside the timed region; the peer then reads `group` times the KV bytes.
        if gqa_mode == "repeat" and group > 1:
            return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return k, v

    return call, expand


def time_calls(call, sets, runs, warmup):
    stream = torch.cuda.current_stream()
    for i in range(max(warmup, len(sets))):
        call(*sets[i % len(sets)])
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(runs)]
    for i, (start, stop) in enumerate(events):
        start.record(stream)
        call(*sets[i % len(sets)])
        stop.record(stream)
    torch.cuda.synchronize()
    ms = sorted(start.elapsed_time(stop) for start, stop in events)
    return statistics.median(ms), ms[0], ms[min(len(ms) - 1, (len(ms) * 9) // 10)]


def num_sets(case, l2_bytes):
    b, s, kv_len = case["batch"], case["q_len"], case["prefix"] + case["q_len"]
    set_bytes = 2 * (2 * b * case["num_kv_heads"] * kv_len * case["head_dim"] +
                     2 * b * case["num_qo_heads"] * s * case["head_dim"])
    return max(1, min(MAX_SETS, math.ceil(4 * l2_bytes / set_bytes)))


def run_peer(case, peer, backend, args, l2_bytes, device):
    result = {"case": case["case"], "peer": peer, "ok": False, "status": "", "note": ""}
    notes = []
    if case["kv_dtype"] != "bf16":
        notes.append("bf16 K/V (SDPA has no %s KV)" % case["kv_dtype"])
    if case["mode"] == "extend" and case["prefix"] > 0:
        notes.append("lower-right causal through CausalBias (a backend without it gets the "
                     "mask materialized)")
    result["note"] = "; ".join(notes)
    kv_bytes = case["kv_elems"] * 2  # bf16
    sets_raw = [make_set(case, device, 1000 + i) for i in range(num_sets(case, l2_bytes))]
    errors = []
    for gqa_mode in ("enable_gqa", "repeat"):
        call, expand = attention_call(case, gqa_mode)
        sets = [(q, *expand(k, v)) for q, k, v in sets_raw]
        try:
            with sdpa_kernel(backend):
                median, low, p90 = time_calls(call, sets, args.runs, args.warmup)
        except RuntimeError as err:  # the backend refuses the shape or the GQA form
            errors.append("%s: %s" % (gqa_mode, str(err).splitlines()[0][:160]))
            torch.cuda.synchronize()
            continue
        seconds = median * 1e-3
        if gqa_mode == "repeat" and case["num_qo_heads"] > case["num_kv_heads"]:
            result["note"] = (result["note"] + "; " if result["note"] else "") + \
                "K/V repeated to HQ heads (enable_gqa refused)"
        result.update(ok=True, status="ok", gqa=gqa_mode, ms_median=median, ms_min=low,
                      ms_p90=p90, runs=args.runs, sets=len(sets), kv_bytes=kv_bytes,
                      gbps=kv_bytes / seconds * 1e-9, tflops=case["flops"] / seconds * 1e-12,
                      tokens_per_s=case["new_tokens"] / seconds)
        return result
    result["status"] = "; ".join(errors)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="JSON from attnplug-bench --list")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--case", help="only cases whose name contains this")
    args = parser.parse_args()
    # SDPA warns on every refused kernel; the refusal is reported in the results instead.
    warnings.filterwarnings("ignore", category=UserWarning)
    if not torch.cuda.is_available():
        print("peer_torch: no CUDA device", file=sys.stderr)
        return 77
    with open(args.cases) as f:
        cases = json.load(f)
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    l2_bytes = getattr(props, "L2_cache_size", 50 * 1024 * 1024)
    print("peer_torch: torch %s (CUDA %s, cuDNN %s) on %s" %
          (torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), props.name))
    results = []
    for case in cases:
        if args.case and args.case not in case["case"]:
            continue
        if case["mode"] == "append":  # the append_kv/1 hook: ours alone (no SDPA counterpart)
            continue
        for peer, backend in PEERS.items():
            r = run_peer(case, peer, backend, args, l2_bytes, device)
            results.append(r)
            if r["ok"]:
                metric = ("%8.1f GB/s   " % r["gbps"] if case["mode"] == "decode"
                          else "%8.1f TFLOP/s" % r["tflops"])
                print("%-30s %-12s %9.4f ms  %s  %12.0f tok/s  %s" %
                      (case["case"], peer, r["ms_median"], metric, r["tokens_per_s"], r["note"]))
            else:
                print("%-30s %-12s not run: %s" % (case["case"], peer, r["status"]))
            sys.stdout.flush()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version(), "gpu": props.name,
                       "results": results}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
