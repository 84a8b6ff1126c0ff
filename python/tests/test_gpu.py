"""test_gpu.py: torch CUDA tensors through DLPack on flashinfer_like, against the float64 reference.

Skipped (with the reason) where torch, a CUDA device or the flashinfer_like plugin is missing.
"""

import sys

import numpy as np
import pytest
from attn_reference import PagedSequences, reference_attention

import attnplug

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

BACKEND = "flashinfer_like"


@pytest.fixture(scope="module")
def gpu_registry():
    registry = attnplug.open_registry()
    if BACKEND not in [b["name"] for b in registry.backends()]:
        pytest.skip(f"{BACKEND} is not built here (no nvcc at build time?)")
    return registry


def llama_model(kv_dtype="bf16", page_size=16):
    return attnplug.Model("meta-llama/Llama-3-8B", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                          dtype="bf16", kv_dtype=kv_dtype, page_size=page_size, num_layers=1,
                          max_batch=4, max_tokens=256, max_kv_len=128)


def cuda_batch(seqs, q_lens):
    host = dict(zip(("qo_indptr", "seq_lens", "kv_page_indptr", "kv_page_indices",
                     "kv_last_page_len", "positions"), seqs.batch(q_lens)))
    return {name: torch.from_numpy(values).cuda() for name, values in host.items()}, host


def rel_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# the reference reads the cache's own (rounded) K/V: what is left is bf16 output and summation
# order (limits not yet measured on the H100)
@pytest.mark.parametrize("kv_dtype, limit", [("bf16", 1e-2), ("fp8_e4m3", 2e-2)])
@pytest.mark.parametrize("side_stream", [False, True])
def test_extend_then_decode_on_the_gpu(gpu_registry, kv_dtype, limit, side_stream):
    model = llama_model(kv_dtype)
    instance = gpu_registry.open(BACKEND, model.as_dict(), device=0)
    assert instance.backend == BACKEND
    gen = torch.Generator(device="cpu").manual_seed(7)
    seqs = PagedSequences([40, 9, 70], 16, np.random.default_rng(7))
    torch_kv = torch.bfloat16 if kv_dtype == "bf16" else torch.float8_e4m3fn
    shape = (seqs.num_pages, 16, 8, 128)
    # fp8 pages travel as bytes named by kv_dtype (not every torch exports float8 via DLPack)
    storage = torch.bfloat16 if kv_dtype == "bf16" else torch.uint8
    k_pages = torch.zeros(shape, dtype=storage, device="cuda")
    v_pages = torch.zeros(shape, dtype=storage, device="cuda")
    layer = attnplug.Layer(k_pages, v_pages, kv_dtype=kv_dtype, k_scale=1.0, v_scale=1.0)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    k_all, v_all = [[] for _ in range(3)], [[] for _ in range(3)]
    for q_lens, mode in [([31, 5, 64], "extend")] + [([1, 1, 1], "decode")] * 4:
        arrays, host = cuda_batch(seqs, q_lens)
        tokens = sum(q_lens)
        q, k, v = (torch.randn((tokens, h, 128), generator=gen).to(torch.bfloat16).cuda()
                   for h in (32, 8, 8))
        out = torch.full((tokens, 32, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        with torch.cuda.stream(stream):  # the binding launches on torch's current stream
            instance.init_metadata(mode, **arrays, host=host)
            forward = instance.forward_decode if mode == "decode" else instance.forward_extend
            forward(layer, q, k, v, out, save_kv=True)
        stream.synchronize()
        qo, seq_lens = host["qo_indptr"], host["seq_lens"]
        for i in range(3):
            rows = slice(int(qo[i]), int(qo[i + 1]))
            k_all[i].append(k[rows].to(torch_kv).float().cpu().numpy())
            v_all[i].append(v[rows].to(torch_kv).float().cpu().numpy())
            want, _ = reference_attention(q[rows].float().cpu().numpy(),
                                          np.concatenate(k_all[i]), np.concatenate(v_all[i]),
                                          int(seq_lens[i]) - q_lens[i], 128 ** -0.5)
            error = rel_l2(out[rows].float().cpu().numpy(), want)
            assert error < limit, f"{mode} sequence {i}: rel L2 {error:.3e}"


def test_explicit_stream_and_errors(gpu_registry):
    instance = gpu_registry.open(BACKEND, llama_model().as_dict(), device=0)
    seqs = PagedSequences([8], 16, np.random.default_rng(1))
    k_pages = torch.zeros((seqs.num_pages, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
    layer = attnplug.Layer(k_pages, k_pages.clone())
    arrays, host = cuda_batch(seqs, [8])
    side = torch.cuda.Stream()
    instance.init_metadata("extend", **arrays, host=host, stream=side.cuda_stream)
    q = torch.randn((8, 32, 128), dtype=torch.bfloat16, device="cuda")
    k = torch.randn((8, 8, 128), dtype=torch.bfloat16, device="cuda")
    out = torch.zeros_like(q)
    instance.forward_extend(layer, q, k, k, out, save_kv=True, stream=side.cuda_stream)
    side.synchronize()
    assert torch.isfinite(out).all() and out.abs().sum() > 0
    with pytest.raises(attnplug.Error) as caught:
        instance.forward_extend(layer, q.cpu(), k, k, out)
    assert caught.value.status == "AP_ERR_INVALID_ARGUMENT"
    with pytest.raises(attnplug.Error) as caught:
        instance.forward_extend(layer, q.float(), k, k, out)
    assert caught.value.status == "AP_ERR_SHAPE_MISMATCH"
    with pytest.raises(attnplug.Error) as caught:
        instance.cuda_graph_prepare(4)
    assert caught.value.status == "AP_ERR_UNSUPPORTED"


def test_no_leak_over_10k_gpu_calls(gpu_registry):
    instance = gpu_registry.open(BACKEND, llama_model().as_dict(), device=0)
    seqs = PagedSequences([8, 8], 16, np.random.default_rng(2))
    k_pages = torch.zeros((seqs.num_pages, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
    layer = attnplug.Layer(k_pages, k_pages.clone())
    seqs.lens = [5, 2]
    arrays, host = cuda_batch(seqs, [1, 1])
    instance.init_metadata("decode", **arrays, host=host)
    q = torch.randn((2, 32, 128), dtype=torch.bfloat16, device="cuda")
    out = torch.zeros_like(q)
    for _ in range(100):
        instance.forward_decode(layer, q, None, None, out)
    torch.cuda.synchronize()
    memory, counts = torch.cuda.memory_allocated(), [sys.getrefcount(x) for x in (q, out, layer)]
    for _ in range(10_000):
        instance.forward_decode(layer, q, None, None, out)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == memory
    assert [sys.getrefcount(x) for x in (q, out, layer)] == counts
