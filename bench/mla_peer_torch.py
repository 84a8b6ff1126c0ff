#!/usr/bin/env python3
"""mla_peer_torch.py: the torch peers of mla-bench, timed the same way (CUDA events around each
call, warm-up, median; inputs rotated past the L2):
  naive MLA decode by bmm: scores = q [B, H, 576] @ kv^T [B, 576, L] * scale, softmax in float32,
      out = P (bf16) @ kv[..., :512]; contiguous (not paged) latent, so torch reads its best case.
      GB/s = B * L * 576 * 2 / t, TFLOP/s = B * H * L * (576 + 512) * 2 / t (as mla-bench).
  eager three-step pack: k = cat(k_nope, k_pe broadcast over heads); k.div(scale).to(fp8);
      v.div(scale).to(fp8). Bytes as mla-bench counts them (the minimum a fused pass moves).
  MLA prefill in the MHA form: SDPA with the cuDNN backend on q [B, H, S, 192], k [B, H, S, 192],
      v [B, H, S, 128] (flash has no kernel for qk != v), causal or not; TFLOP/s count
      2 * B * H * S * S * (192 + 128), halved when causal (as mla-bench).
    python3 bench/mla_peer_torch.py [--runs N] [--only TEXT] [--json FILE]
"""
import argparse
import json
import statistics

import torch

L2_FLUSH = 200 << 20


def time_calls(call, nsets, runs, warmup=10):
    for i in range(max(warmup, nsets)):
        call(i % nsets)
    torch.cuda.synchronize()
    ms = []
    for i in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call(i % nsets)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    ms.sort()
    return statistics.median(ms), ms[0]


def time_loop(call, calls=500):
    for _ in range(20):
        call(0)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        call(0)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


def decode(B, L, H, rows, runs):
    dev = "cuda"
    set_bytes = B * L * 576 * 2
    nsets = max(1, min(8, -(-L2_FLUSH // set_bytes)))
    sets = [(torch.empty(B, H, 576, device=dev, dtype=torch.bfloat16).uniform_(-1, 1),
             torch.empty(B, L, 576, device=dev, dtype=torch.bfloat16).uniform_(-1, 1))
            for _ in range(nsets)]
    scale = 192 ** -0.5

    def call(i):
        q, kv = sets[i]
        s = torch.bmm(q, kv.transpose(1, 2)).float() * scale
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.bmm(p, kv[:, :, :512])

    ms, mn = time_calls(call, nsets, runs)
    rows.append(dict(kind="decode", name=f"decode B{B} L{L} H{H} page64 bf16", peer="torch_bmm",
                     ms=ms, min_ms=mn, GBps=set_bytes / (ms * 1e6),
                     TFLOPs=B * H * L * 1088 * 2 / (ms * 1e9)))


def pack(T, H, rows, runs):
    dev = "cuda"
    kn = torch.empty(T, H, 128, device=dev, dtype=torch.bfloat16).uniform_(-3, 3)
    pe = torch.empty(T, 64, device=dev, dtype=torch.bfloat16).uniform_(-3, 3)
    v = torch.empty(T, H, 128, device=dev, dtype=torch.bfloat16).uniform_(-3, 3)
    ks, vs = 0.02, 0.03

    def call(i):
        k = torch.cat([kn, pe.unsqueeze(1).expand(T, H, 64)], dim=-1)
        return (k / ks).to(torch.float8_e4m3fn), (v / vs).to(torch.float8_e4m3fn)

    if T <= 64:
        ms = mn = time_loop(call)
    else:
        ms, mn = time_calls(call, 1, runs)
    nbytes = T * H * 128 * 2 * 2 + T * 64 * 2 + T * H * 320
    rows.append(dict(kind="pack", name=f"pack s={T} H{H} (128/64/128) bf16->fp8",
                     peer="torch_eager", ms=ms, min_ms=mn, GBps=nbytes / (ms * 1e6), TFLOPs=0))


def prefill(B, S, H, causal, rows, runs):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = "cuda"
    q = torch.empty(B, H, S, 192, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    k = torch.empty(B, H, S, 192, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    v = torch.empty(B, H, S, 128, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    name = f"MLA prefill B{B} S{S} H{H} qk192/v128 {'causal' if causal else 'chunk'}"

    def call(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    scale=192 ** -0.5)

    try:
        ms, mn = time_calls(call, 1, runs)
    except RuntimeError as e:
        print(f"prefill {name}: cuDNN SDPA failed: {e}")
        return
    flops = 2 * B * H * S * S * 320 * (0.5 if causal else 1.0)
    rows.append(dict(kind="prefill", name=name, peer="torch_cudnn", ms=ms, min_ms=mn, GBps=0,
                     TFLOPs=flops / (ms * 1e9)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="prefill, pack or decode")
    args = ap.parse_args()
    rows = []
    want = lambda kind: args.only is None or args.only == kind
    if want("prefill"):
        for B, S, H, causal in ((1, 4096, 128, True), (4, 4096, 16, True), (1, 4096, 128, False)):
            prefill(B, S, H, causal, rows, args.runs)
    if want("pack"):
        pack(4096, 128, rows, args.runs)
        for t in (1, 2, 3, 4):
            pack(t, 128, rows, args.runs)
    if want("decode"):
        for B, L, H in ((128, 4096, 16), (128, 4096, 128), (1, 32768, 16), (64, 4096, 128)):
            decode(B, L, H, rows, args.runs)
    for r in rows:
        print(f"{r['kind']:6s} {r['name']:46s} {r['peer']:12s} {r['ms']:9.4f} ms "
              f"{r['GBps']:8.1f} GB/s {r['TFLOPs']:7.1f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
