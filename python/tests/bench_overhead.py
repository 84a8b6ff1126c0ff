"""bench_overhead.py: the host overhead of one forward_decode call from Python on cpu_ref.

Times Instance.forward_decode on a tiny shape (1 sequence, 1 query and 1 KV head, head dim 8,
one cached token) from Python, and the same call made by a C loop over the core's API with the
tensors imported once (Instance._time_forward_decode). The difference is what the binding adds:
argument parsing and the DLPack import and release of each tensor.

    PYTHONPATH=build/python python3 python/tests/bench_overhead.py [--device cpu|cuda]
"""

import argparse
import statistics
import time

import numpy as np

import attnplug


def tensors(device):
    shapes = dict(pages=(2, 1, 1, 8), q=(1, 1, 8))
    if device == "cpu":
        pages = np.zeros(shapes["pages"], np.float16)
        q = np.ones(shapes["q"], np.float32)
        return "f32", pages, pages.copy(), q, np.zeros_like(q), np.array
    import torch

    def make(shape, dtype, value=0.0):
        return torch.full(shape, value, dtype=dtype, device="cuda")

    pages = make(shapes["pages"], torch.bfloat16)
    q = make(shapes["q"], torch.bfloat16, 1.0)
    to_device = lambda values, dtype=None: torch.tensor(values, dtype=torch.int32, device="cuda")  # noqa
    return "bf16", pages, pages.clone(), q, torch.zeros_like(q), to_device


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    dtype, k_pages, v_pages, q, out, array = tensors(args.device)
    registry = attnplug.open_registry()
    backend = "cpu_ref" if args.device == "cpu" else "flashinfer_like"
    model = attnplug.Model("overhead", num_qo_heads=1, num_kv_heads=1, head_dim=8, dtype=dtype,
                           kv_dtype="f16" if args.device == "cpu" else "bf16", page_size=1, max_batch=1, max_tokens=1, max_kv_len=2)
    if args.device == "cuda":  # flashinfer_like serves head dims 64/128/256 only
        import torch

        model.head_dim = 64
        k_pages = torch.zeros((2, 1, 1, 64), dtype=torch.bfloat16, device="cuda")
        v_pages = k_pages.clone()
        q = torch.ones((1, 1, 64), dtype=torch.bfloat16, device="cuda")
        out = torch.zeros_like(q)
    instance = registry.open(backend, model.as_dict(), device="cpu" if args.device == "cpu" else 0)
    layer = attnplug.Layer(k_pages, v_pages)
    int32 = (lambda v: np.array(v, np.int32)) if args.device == "cpu" else array
    host = None
    batch = [int32(v) for v in ([0, 1], [1], [0, 1], [1], [1], [0])]
    if args.device == "cuda":
        host = dict(zip(["qo_indptr", "seq_lens", "kv_page_indptr", "kv_page_indices",
                         "kv_last_page_len", "positions"],
                        [np.array(v, np.int32) for v in ([0, 1], [1], [0, 1], [1], [1], [0])]))
    instance.init_metadata("decode", *batch, host=host)
    forward = instance.forward_decode
    for _ in range(1000):
        forward(layer, q, None, None, out)
    python_runs, c_runs = [], []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(args.calls):
            forward(layer, q, None, None, out)
        if args.device == "cuda":
            import torch

            torch.cuda.synchronize()
        python_runs.append((time.perf_counter() - start) / args.calls)
        c_runs.append(instance._time_forward_decode(args.calls, layer, q, None, None, out))
    python_us = statistics.median(python_runs) * 1e6
    c_us = statistics.median(c_runs) * 1e6
    print(f"forward_decode on {backend} ({args.device}), tiny shape, median of 5 x {args.calls}:")
    print(f"  from Python:         {python_us:7.3f} us/call")
    print(f"  C API loop:          {c_us:7.3f} us/call")
    print(f"  binding overhead:    {python_us - c_us:7.3f} us/call (aim: under 5 us)")


if __name__ == "__main__":
    main()
