# fil_extend_torch.py: the torch SDPA peers of bench/fil_extend_check's prefill shapes, same count.
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, sets, iters=50, warmup=10):
    times = []
    for i in range(warmup + iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    B, S, H, D = 4, 4096, 32, 128
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    for hkv, causal in ((32, True), (8, True), (32, False), (8, False)):
        flops = (2.0 if causal else 4.0) * B * H * S * S * D
        sets = []
        for _ in range(2):  # two input sets, together larger than L2
            q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, hkv, S, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, hkv, S, D, device="cuda", dtype=torch.bfloat16)
            sets.append((q, k, v))
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def run(q, k, v):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=hkv != H)
            try:
                ms = median_ms(run, sets)
                print(f"torch {name:5s} B{B} S{S} H{H}/{hkv} D{D} "
                      f"{'causal' if causal else 'noncausal'}: {ms:.3f} ms "
                      f"{flops / ms / 1e9:.1f} TFLOP/s", flush=True)
            except RuntimeError as err:
                print(f"torch {name} H{H}/{hkv}: not run ({str(err).splitlines()[0][:100]})")


if __name__ == "__main__":
    main()
