"""test_errors.py: every refusal raises attnplug.Error with the right status, before anything runs."""

import numpy as np
import pytest
from attn_reference import open_paged

import attnplug


@pytest.fixture
def setup(registry, make_model, rng):
    """An extend batch planned on cpu_ref, with good tensors to spoil one at a time."""
    model = make_model(page_size=4)
    instance, seqs, layer, k_pages, v_pages = open_paged(registry, model, [6, 3], rng)
    arrays = seqs.batch([6, 3])
    instance.init_metadata("extend", *arrays)
    t, hq, hkv, d = 9, model.num_qo_heads, model.num_kv_heads, model.head_dim
    good = dict(
        q=rng.standard_normal((t, hq, d)).astype(np.float32),
        k=rng.standard_normal((t, hkv, d)).astype(np.float32),
        v=rng.standard_normal((t, hkv, d)).astype(np.float32),
        out=np.zeros((t, hq, d), np.float32),
    )
    return dict(instance=instance, layer=layer, good=good, arrays=arrays, k_pages=k_pages,
                v_pages=v_pages, model=model)


def expect(status, call, *args, match=None, **kwargs):
    with pytest.raises(attnplug.Error) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert error.status == status, f"{error.status}: {error.message}"
    assert error.code == getattr(attnplug._attnplug, status.replace("AP_", ""))
    assert error.message and str(error) == error.message
    if match is not None:
        assert match in error.message, error.message
    return error


def forward(s, save_kv=True, **changes):
    args = dict(s["good"], **changes)
    sentinel = args["out"].copy()
    s["instance"].forward_extend(s["layer"], args["q"], args["k"], args["v"], args["out"],
                                 save_kv=save_kv)
    return sentinel


@pytest.mark.parametrize(
    "name, bad, status, words",
    [
        ("q", np.zeros((9, 4, 8), np.float32), "AP_ERR_SHAPE_MISMATCH", "q has shape [9][4][8]"),
        ("q", np.zeros((9, 4, 16), np.float64), "AP_ERR_SHAPE_MISMATCH", "dtype"),
        ("q", np.zeros((8, 4, 16), np.float32), "AP_ERR_SHAPE_MISMATCH", "q has shape"),
        ("k", np.zeros((9, 3, 16), np.float32), "AP_ERR_SHAPE_MISMATCH", "k has shape"),
        ("v", np.zeros((9, 2, 16), np.int32), "AP_ERR_SHAPE_MISMATCH", "v has dtype"),
        ("out", np.zeros((9, 4, 16), np.float16), "AP_ERR_SHAPE_MISMATCH", "out has dtype"),
        ("out", np.zeros((9, 4, 32), np.float32)[:, :, ::2], "AP_ERR_INVALID_ARGUMENT", "dense"),
    ],
)
def test_bad_tensor_raises_before_running(setup, name, bad, status, words):
    k_before = setup["k_pages"].copy()
    out = setup["good"]["out"]
    out[:] = 7.0
    expect(status, forward, setup, match=words, **{name: bad})
    # nothing ran: the cache and the output are as they were
    np.testing.assert_array_equal(setup["k_pages"], k_before)
    if name != "out":
        assert (out == 7.0).all()


def test_not_a_tensor(setup):
    expect("AP_ERR_INVALID_ARGUMENT", forward, setup, match="list", q=[[1.0]])
    with pytest.raises(TypeError):
        setup["instance"].forward_extend("not a layer", *setup["good"].values())


def test_read_only_output_is_refused(setup):
    out = setup["good"]["out"].copy()
    out.flags.writeable = False
    if int(np.__version__.split(".")[0]) < 2:  # numpy 1 exports no read-only array at all
        with pytest.raises(BufferError):
            forward(setup, out=out)
        return
    # numpy 2 exports it with DLPack 1's read-only flag: the binding refuses to write it
    expect("AP_ERR_INVALID_ARGUMENT", forward, setup, match="out is read-only", out=out)
    q = setup["good"]["q"].copy()
    q.flags.writeable = False
    forward(setup, q=q)  # a read-only input is fine


def test_decode_call_on_an_extend_plan(setup):
    s = setup
    g = s["good"]
    expect("AP_ERR_INVALID_ARGUMENT", s["instance"].forward_decode, s["layer"], g["q"], g["k"],
           g["v"], g["out"], save_kv=True)


def test_forward_before_any_plan(registry, make_model):
    model = make_model()
    instance = registry.open("cpu_ref", model.as_dict(), device="cpu")
    shape = (2, 4, 2, 16)
    layer = attnplug.Layer(np.zeros(shape, np.float16), np.zeros(shape, np.float16))
    q = np.zeros((1, 4, 16), np.float32)
    out = np.zeros((1, 4, 16), np.float32)
    error = expect("AP_ERR_INVALID_ARGUMENT", instance.forward_decode, layer, q, None, None, out)
    assert "init_metadata" in error.message


def test_layer_cache_not_matching_the_model(setup):
    s = setup
    wrong = np.zeros((4, 4, 2, 8), np.float16)  # head dim 8, the model's is 16
    layer = attnplug.Layer(wrong, wrong)
    g = s["good"]
    expect("AP_ERR_SHAPE_MISMATCH", s["instance"].forward_extend, layer, g["q"], g["k"], g["v"],
           g["out"], match="head_dim_qk")


def test_layer_construction_errors():
    pages = np.zeros((4, 4, 2, 16), np.float16)
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, np.zeros((4, 4, 16), np.float16),
           match="4-D")
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, pages, np.zeros((3, 4, 2, 16), np.float16),
           match="dim 0")
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, pages, np.zeros((4, 4, 2, 16), np.float32))
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, np.zeros((4, 4, 2, 16), np.float32))
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, np.zeros((4, 4, 2, 16), np.uint8),
           match="kv_dtype")
    expect("AP_ERR_SHAPE_MISMATCH", attnplug.Layer, pages, kv_dtype="bf16", match="holds f16")
    expect("AP_ERR_INVALID_ARGUMENT", attnplug.Layer, pages, kv_dtype="float99")
    expect("AP_ERR_INVALID_ARGUMENT", attnplug.Layer, np.zeros((4, 4, 2, 32), np.float16)[..., ::2],
           match="dense")
    # bytes named as fp8 are fine
    layer = attnplug.Layer(np.zeros((4, 4, 2, 16), np.uint8), kv_dtype="fp8_e4m3")
    assert layer.kv_dtype == "fp8_e4m3" and layer.head_dim_v == 16


def test_batch_errors(setup):
    s = setup
    instance = s["instance"]
    qo, seq_lens, indptr, indices, last, positions = s["arrays"]
    expect("AP_ERR_INVALID_ARGUMENT", instance.init_metadata, "prefill", *s["arrays"],
           match="'extend' or 'decode'")
    expect("AP_ERR_SHAPE_MISMATCH", instance.init_metadata, "extend", qo, seq_lens[:1], indptr,
           indices, last, positions, match="seq_lens has 1 elements, expected 2")
    expect("AP_ERR_SHAPE_MISMATCH", instance.init_metadata, "extend", qo.astype(np.int64),
           seq_lens, indptr, indices, last, positions, match="int32")
    expect("AP_ERR_SHAPE_MISMATCH", instance.init_metadata, "extend", qo, seq_lens, indptr,
           indices, last, positions[:-1], match="positions")
    bad_last = last.copy()
    bad_last[0] = 9  # longer than a page
    expect("AP_ERR_SHAPE_MISMATCH", instance.init_metadata, "extend", qo, seq_lens, indptr,
           indices, bad_last, positions, match="kv_last_page_len_host[0] is 9")
    decode_qo = np.array([0, 6, 9], np.int32)  # 6 tokens in one sequence
    expect("AP_ERR_SHAPE_MISMATCH", instance.init_metadata, "decode", decode_qo, seq_lens,
           indptr, indices, last, positions, match="one token each")
    expect("AP_ERR_INVALID_ARGUMENT", instance.init_metadata, "extend", qo, seq_lens, indptr,
           indices, last, positions, host={"qo_indptr": qo, "typo": qo}, match="host has a key")


def test_a_page_past_the_cache_is_refused(setup):
    s = setup
    qo, seq_lens, indptr, indices, last, positions = s["arrays"]
    far = indices.copy()
    far[0] = 1000  # no such page in the layer's cache
    s["instance"].init_metadata("extend", qo, seq_lens, indptr, far, last, positions)
    expect("AP_ERR_SHAPE_MISMATCH", forward, s, match="uses page 1000 but layer.kv has")


def test_absent_and_unknown_hooks(setup):
    instance = setup["instance"]
    assert not instance.has_hook(attnplug.HOOK_CUDA_GRAPH_V1)
    expect("AP_ERR_UNSUPPORTED", instance.cuda_graph_prepare, 4, match="cuda_graph/1")
    assert not instance.has_hook("vendor.nothing/1")
    expect("AP_ERR_NOT_FOUND", instance.hook_address, "vendor.nothing/1")
    assert instance.hook_address(attnplug.HOOK_APPEND_KV_V1) != 0


def test_pack_prefix_chunk_kv_shape_error(setup):
    instance = setup["instance"]
    k_nope = np.zeros((3, 2, 8), np.float32)
    k_pe = np.zeros((3, 4), np.float32)
    v = np.zeros((3, 2, 8), np.float32)
    k_out = np.zeros((3, 2, 11), np.uint8)  # 8 + 4 = 12 wide, not 11
    v_out = np.zeros((3, 2, 8), np.uint8)
    expect("AP_ERR_SHAPE_MISMATCH", instance.pack_prefix_chunk_kv, k_nope, k_pe, v, k_out, v_out)


def test_closed_objects(registry, make_model):
    instance = registry.open("cpu_ref", make_model().as_dict(), device="cpu")
    with instance:
        assert instance.backend == "cpu_ref"
    assert instance.closed
    expect("AP_ERR_INVALID_ARGUMENT", instance.kv_spec, match="closed")
    instance.close()  # twice is fine


def test_registry_close_with_open_instance(make_model):
    registry = attnplug.open_registry()
    instance = registry.open("cpu_ref", make_model().as_dict(), device="cpu")
    expect("AP_ERR_INVALID_ARGUMENT", registry.close, match="open instance")
    instance.close()
    registry.close()
    expect("AP_ERR_INVALID_ARGUMENT", registry.scan, match="closed")


def test_model_and_options_errors(registry, make_model):
    model = make_model().as_dict()
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", dict(model, typo=1),
           match="unknown key 'typo'")
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", dict(model, dtype="f99"))
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", dict(model, kind="gqa"))
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", dict(model, num_qo_heads=2**40))
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", dict(model, num_qo_heads="4"))
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", model, {"page_sise": 4})
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", model, device="tpu")
    # cpu_ref takes no backend-specific option: refused with the reason
    expect("AP_ERR_REFUSED", registry.open, "cpu_ref", model, {"extra": {"cpu_ref.x": "1"}},
           device="cpu")
    expect("AP_ERR_NOT_FOUND", registry.open, "no_such_backend", model, device="cpu")
    expect("AP_ERR_INVALID_ARGUMENT", registry.open, "cpu_ref", [1, 2], match="must be a dict")


def test_cpu_instance_never_asks_torch_for_a_cuda_stream(setup):
    """With torch loaded but no GPU serving, stream=None must not reach torch.cuda (which raises
    without a driver): the hook answers for itself."""
    pytest.importorskip("torch", reason="the case needs torch loaded")
    expect("AP_ERR_UNSUPPORTED", setup["instance"].cuda_graph_prepare, 2, match="cuda_graph/1")
