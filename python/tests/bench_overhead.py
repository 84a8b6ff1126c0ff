"""bench_overhead.py: the host overhead of one forward_decode call from Python.

Times Instance.forward_decode on a tiny shape (1 sequence, 1 query and 1 KV head, one cached
token) from Python, and the same call made by a C loop over the core's API with the tensors
imported once (Instance._time_forward_decode). The difference is what the binding adds: argument
parsing and the DLPack import and release of each tensor (and, on CUDA with stream=None, asking
torch for its current stream).

    PYTHONPATH=build/python python3 python/tests/bench_overhead.py            # numpy, cpu_ref
    python3 python/tests/bench_overhead.py --device cuda                      # torch, flashinfer_like
"""

import argparse
import statistics
import time

import numpy as np

import attnplug

BATCH = dict(qo_indptr=[0, 1], seq_lens=[1], kv_page_indptr=[0, 1], kv_page_indices=[1],
             kv_last_page_len=[1], positions=[0])


def setup(device):
    """(backend, model, k_pages, v_pages, q, out, batch arrays, host mirrors or None)"""
    host = {name: np.array(values, np.int32) for name, values in BATCH.items()}
    if device == "cpu":
        model = attnplug.Model("overhead", num_qo_heads=1, num_kv_heads=1, head_dim=8,
                               dtype="f32", kv_dtype="f16", page_size=1, max_batch=1,
                               max_tokens=1, max_kv_len=2)
        pages = np.zeros((2, 1, 1, 8), np.float16)
        q = np.ones((1, 1, 8), np.float32)
        return "cpu_ref", model, pages, pages.copy(), q, np.zeros_like(q), host, None
    import torch

    # flashinfer_like serves head dims 64, 128 and 256
    model = attnplug.Model("overhead", num_qo_heads=1, num_kv_heads=1, head_dim=64, dtype="bf16",
                           page_size=1, max_batch=1, max_tokens=1, max_kv_len=2)
    pages = torch.zeros((2, 1, 1, 64), dtype=torch.bfloat16, device="cuda")
    q = torch.ones((1, 1, 64), dtype=torch.bfloat16, device="cuda")
    arrays = {name: torch.from_numpy(values).cuda() for name, values in host.items()}
    return "flashinfer_like", model, pages, pages.clone(), q, torch.zeros_like(q), arrays, host


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--calls", type=int, default=20000, help="per run (at most 400 on cuda)")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    backend, model, k_pages, v_pages, q, out, arrays, host = setup(args.device)
    registry = attnplug.open_registry()
    instance = registry.open(backend, model.as_dict(), device="cpu" if args.device == "cpu" else 0)
    layer = attnplug.Layer(k_pages, v_pages)
    instance.init_metadata("decode", **arrays, host=host)
    stream = None
    if args.device == "cuda":
        import torch

        stream = torch.cuda.current_stream().cuda_stream
    forward = instance.forward_decode
    sync = lambda: None  # noqa: E731
    if args.device == "cuda":
        import torch

        sync = torch.cuda.synchronize
        # host time only: short runs, so the launch queue never fills and waits on the GPU
        args.calls = min(args.calls, 400)
    for _ in range(1000):
        forward(layer, q, None, None, out)
    rows = []
    for _ in range(args.runs):
        runs = []
        for stream_arg in (None, stream) if stream is not None else (None,):
            sync()
            start = time.perf_counter()
            for _ in range(args.calls):
                forward(layer, q, None, None, out, stream=stream_arg)
            runs.append((time.perf_counter() - start) / args.calls)
        sync()
        runs.append(instance._time_forward_decode(args.calls, layer, q, None, None, out))
        rows.append(runs)
    sync()
    median = [statistics.median(column) * 1e6 for column in zip(*rows)]
    c_us = median[-1]
    print(f"forward_decode on {backend} ({args.device}), tiny shape, median of {args.runs} runs "
          f"of {args.calls} calls (on CUDA: host time of asynchronous launches):")
    print(f"  C API loop (baseline):         {c_us:7.3f} us/call")
    print(f"  from Python, stream=None:      {median[0]:7.3f} us/call, binding overhead "
          f"{median[0] - c_us:6.3f} us")
    if len(median) == 3:
        print(f"  from Python, stream=<int>:     {median[1]:7.3f} us/call, binding overhead "
              f"{median[1] - c_us:6.3f} us")
    print("  (aim: binding overhead under 5 us)")


if __name__ == "__main__":
    main()
