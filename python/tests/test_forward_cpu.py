"""test_forward_cpu.py: numpy arrays through DLPack on cpu_ref against a float64 reference."""

import numpy as np
import pytest
from attn_reference import PagedSequences, open_paged, reference_attention

import attnplug


def open_cpu(registry, model):
    instance = registry.open("cpu_ref", model.as_dict(), device="cpu")
    return instance


def run_and_check(instance, layer, seqs, k_all, v_all, q_lens, rng, mode, model, sm_scale):
    """One forward over every sequence (new K/V saved), checked against the reference."""
    qo, seq_lens, page_indptr, page_indices, last, positions = seqs.batch(q_lens)
    tokens = int(qo[-1])
    hq, hkv, d = model.num_qo_heads, model.num_kv_heads, model.head_dim
    q = rng.standard_normal((tokens, hq, d)).astype(np.float32)
    k = rng.standard_normal((tokens, hkv, d)).astype(np.float32)
    v = rng.standard_normal((tokens, hkv, d)).astype(np.float32)
    out = np.full((tokens, hq, d), np.nan, np.float32)
    lse = np.full((tokens, hq), np.nan, np.float32)
    instance.init_metadata(mode, qo, seq_lens, page_indptr, page_indices, last, positions)
    forward = instance.forward_decode if mode == "decode" else instance.forward_extend
    forward(layer, q, k, v, out, lse=lse, save_kv=True)
    for i in range(len(q_lens)):
        rows = slice(qo[i], qo[i + 1])
        # the cache holds the new K/V rounded to f16: so does the reference
        k_all[i] = np.concatenate([k_all[i], k[rows].astype(np.float16)])
        v_all[i] = np.concatenate([v_all[i], v[rows].astype(np.float16)])
        prefix = int(seq_lens[i]) - (qo[i + 1] - qo[i])
        want_out, want_lse = reference_attention(q[rows], k_all[i], v_all[i], prefix, sm_scale)
        np.testing.assert_allclose(out[rows], want_out, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(lse[rows], want_lse, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_extend_then_decode_matches_reference(registry, make_model, rng, page_size):
    model = make_model(page_size=page_size)
    instance = open_cpu(registry, model)
    prompt_lens = [5, 1, 13]
    steps = 4
    seqs = PagedSequences([p + steps for p in prompt_lens], page_size, rng)
    shape = (seqs.num_pages, page_size, model.num_kv_heads, model.head_dim)
    k_pages = np.zeros(shape, np.float16)
    v_pages = np.zeros(shape, np.float16)
    layer = attnplug.Layer(k_pages, v_pages, layer_id=1)
    sm_scale = 1.0 / np.sqrt(model.head_dim)
    assert layer.sm_scale == pytest.approx(sm_scale)
    assert (layer.num_pages, layer.page_size, layer.kv_dtype) == (seqs.num_pages, page_size, "f16")
    empty = np.zeros((0, model.num_kv_heads, model.head_dim), np.float16)
    k_all = [empty] * len(prompt_lens)
    v_all = [empty] * len(prompt_lens)
    run_and_check(instance, layer, seqs, k_all, v_all, prompt_lens, rng, "extend", model, sm_scale)
    for _ in range(steps):
        run_and_check(instance, layer, seqs, k_all, v_all, [1] * 3, rng, "decode", model, sm_scale)
    # the cache itself holds the saved keys, in the pages the table says (no copy was made)
    first_page = seqs.pages[2][0]
    np.testing.assert_array_equal(k_pages[first_page], k_all[2][:page_size])
    instance.close()
    assert instance.closed


def test_chunked_extend_over_cached_prefix(registry, make_model, rng):
    """An extend of 3 tokens on top of 6 cached ones sees the prefix and its own causal part."""
    model = make_model(page_size=4)
    instance, seqs, layer, _, _ = open_paged(registry, model, [9, 9], rng)
    empty = np.zeros((0, model.num_kv_heads, model.head_dim), np.float16)
    k_all, v_all = [empty, empty], [empty, empty]
    scale = layer.sm_scale
    run_and_check(instance, layer, seqs, k_all, v_all, [6, 2], rng, "extend", model, scale)
    run_and_check(instance, layer, seqs, k_all, v_all, [3, 7], rng, "extend", model, scale)


def test_explicit_scale_and_capsule_input(registry, make_model, rng):
    """A DLPack capsule is taken as is; sm_scale given by hand reaches the backend."""
    model = make_model(num_qo_heads=2, num_kv_heads=1, page_size=8)
    instance = open_cpu(registry, model)
    seqs = PagedSequences([5], 8, rng)
    shape = (seqs.num_pages, 8, 1, model.head_dim)
    layer = attnplug.Layer(np.zeros(shape, np.float16), np.zeros(shape, np.float16), sm_scale=0.5)
    qo, seq_lens, indptr, indices, last, positions = seqs.batch([5])
    q = rng.standard_normal((5, 2, model.head_dim)).astype(np.float32)
    k = rng.standard_normal((5, 1, model.head_dim)).astype(np.float32)
    v = rng.standard_normal((5, 1, model.head_dim)).astype(np.float32)
    out = np.zeros((5, 2, model.head_dim), np.float32)
    instance.init_metadata("extend", qo, seq_lens, indptr, indices, last, positions)
    instance.forward_extend(layer, q.__dlpack__(), k, v, out, save_kv=True)
    want, _ = reference_attention(q, k.astype(np.float16), v.astype(np.float16), 0, 0.5)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)


def test_append_kv_hook_rotates_and_stores(registry, make_model, rng):
    """append_kv/1 on cpu_ref: NeoX RoPE of q and k, k and v written to their slots."""
    model = make_model(num_qo_heads=2, num_kv_heads=1, head_dim=8, page_size=4)
    instance = open_cpu(registry, model)
    assert instance.has_hook(attnplug.HOOK_APPEND_KV_V1)
    shape = (3, 4, 1, 8)
    k_pages, v_pages = np.zeros(shape, np.float16), np.zeros(shape, np.float16)
    layer = attnplug.Layer(k_pages, v_pages)
    tokens, rotary = 3, 8
    positions = np.array([0, 5, 9], np.int32)
    out_loc = np.array([4, 9, 2], np.int32)  # page 1 slot 0, page 2 slot 1, page 0 slot 2
    freqs = 10000.0 ** (-np.arange(rotary // 2) * 2.0 / rotary)
    angles = np.arange(16)[:, None] * freqs[None, :]
    cos_sin = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    q = rng.standard_normal((tokens, 2, 8)).astype(np.float32)
    k = rng.standard_normal((tokens, 1, 8)).astype(np.float32)
    v = rng.standard_normal((tokens, 1, 8)).astype(np.float32)
    q_out = np.zeros_like(q)
    instance.append_kv(layer, k, v, positions, out_loc, cos_sin, rotary, q=q, q_out=q_out)

    def rope(x):  # NeoX: pairs (i, i + rotary/2)
        c = cos_sin[positions][:, None, : rotary // 2].astype(np.float64)
        s = cos_sin[positions][:, None, rotary // 2 :].astype(np.float64)
        a, b = x[..., : rotary // 2].astype(np.float64), x[..., rotary // 2 :].astype(np.float64)
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    np.testing.assert_allclose(q_out, rope(q), rtol=1e-5, atol=1e-5)
    flat_k, flat_v = k_pages.reshape(-1, 1, 8), v_pages.reshape(-1, 1, 8)
    np.testing.assert_allclose(flat_k[out_loc], rope(k), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(flat_v[out_loc], v.astype(np.float16))
    untouched = np.setdiff1d(np.arange(12), out_loc)
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_torch_cpu_tensors_bf16(registry, make_model, rng):
    """torch CPU tensors (versioned DLPack, bf16) on cpu_ref; a strided view is refused."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    model = make_model(dtype="bf16", kv_dtype="bf16", page_size=8)
    instance = registry.open("cpu_ref", model.as_dict(), device="cpu")
    seqs = PagedSequences([11], 8, rng)
    k_pages = torch.zeros((seqs.num_pages, 8, 2, 16), dtype=torch.bfloat16)
    layer = attnplug.Layer(k_pages, torch.zeros_like(k_pages))
    assert layer.kv_dtype == "bf16"
    arrays = [torch.from_numpy(a) for a in seqs.batch([11])]
    instance.init_metadata("extend", *arrays)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn((11, h, 16), generator=gen).to(torch.bfloat16) for h in (4, 2, 2))
    out = torch.zeros((11, 4, 16), dtype=torch.bfloat16)
    instance.forward_extend(layer, q, k, v, out, save_kv=True)
    want, _ = reference_attention(q.float().numpy(), k.float().numpy(), v.float().numpy(), 0,
                                  16 ** -0.5)
    got = out.float().numpy()
    # bf16 output: one rounding of the result (2^-8 relative)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 4e-3
    assert torch.equal(k_pages[int(seqs.pages[0][0]), 3], k[3])
    with pytest.raises(attnplug.Error) as caught:
        instance.forward_extend(layer, q.transpose(0, 1).contiguous().transpose(0, 1), k, v, out)
    assert caught.value.status == "AP_ERR_INVALID_ARGUMENT" and "dense" in caught.value.message


def test_merge_state_hook_matches_full_softmax(registry, make_model, rng):
    """merge_state/1: attention over keys split in two sets, merged, equals attention over all."""
    instance = open_cpu(registry, make_model())
    assert instance.has_hook(attnplug.HOOK_MERGE_STATE_V1)
    tokens, heads, dim, keys = 5, 3, 16, 23
    logits = rng.standard_normal((tokens, heads, keys))
    values = rng.standard_normal((keys, dim))

    def attend(part):
        s = logits[:, :, part]
        m = s.max(axis=2, keepdims=True)
        w = np.exp(s - m)
        lse = (m[:, :, 0] + np.log(w.sum(axis=2))).astype(np.float32)
        return (w @ values[part] / w.sum(axis=2, keepdims=True)).astype(np.float32), lse

    o_a, lse_a = attend(slice(0, 9))
    o_b, lse_b = attend(slice(9, keys))
    o_b[1, 2] = np.nan  # a side with no keys is not read: lse -inf there
    lse_b[1, 2] = -np.inf
    want, want_lse = attend(slice(0, keys))
    want[1, 2], want_lse[1, 2] = o_a[1, 2], lse_a[1, 2]
    o = np.full_like(o_a, np.nan)
    lse = np.full_like(lse_a, np.nan)
    instance.merge_state(o_a, lse_a, o_b, lse_b, o, lse=lse)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    # in place: o_a and lse_a take the result
    instance.merge_state(o_a, lse_a, o_b, lse_b, o_a, lse=lse_a)
    np.testing.assert_array_equal(o_a, o)
    instance.close()
