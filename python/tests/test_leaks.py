"""test_leaks.py: 10k calls, good and refused, leave no reference, Python block or RSS behind."""

import gc
import sys
import tracemalloc

import numpy as np
import pytest
from attn_reference import open_paged

import attnplug

CALLS = 10_000


def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.fixture
def decode_setup(registry, make_model, rng):
    model = make_model(page_size=4)
    instance, seqs, layer, _, _ = open_paged(registry, model, [8, 8], rng, fill=1.0)
    seqs.lens = [6, 3]
    arrays = seqs.batch([1, 1])
    q = rng.standard_normal((2, model.num_qo_heads, model.head_dim)).astype(np.float32)
    out = np.zeros_like(q)
    bad_q = np.zeros((2, model.num_qo_heads, 3), np.float32)
    return instance, layer, arrays, q, out, bad_q


def measure(body):
    """Run body() CALLS times after a warm-up; the growth in traced Python memory and in RSS."""
    for _ in range(200):
        body()
    gc.collect()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    rss_before = rss_bytes()
    for _ in range(CALLS):
        body()
    gc.collect()
    traced_growth = tracemalloc.get_traced_memory()[0] - traced_before
    tracemalloc.stop()
    return traced_growth, rss_bytes() - rss_before


def test_good_calls_do_not_leak(decode_setup):
    instance, layer, arrays, q, out, _ = decode_setup

    def body():
        instance.init_metadata("decode", *arrays)
        instance.forward_decode(layer, q, None, None, out)

    body()  # from here on the instance holds the planned batch's arrays, one reference each
    counts = [sys.getrefcount(x) for x in (instance, layer, q, out, *arrays)]

    traced, rss = measure(body)
    assert [sys.getrefcount(x) for x in (instance, layer, q, out, *arrays)] == counts
    # one leaked DLPack wrapper per call would be >= 10k * 6 arrays * ~100 bytes
    assert traced < 64 * 1024, f"Python memory grew {traced} bytes over {CALLS} calls"
    assert rss < 2 * 1024 * 1024, f"RSS grew {rss} bytes over {CALLS} calls"
    assert np.isfinite(out).all() and out.any()


def test_refused_calls_do_not_leak(decode_setup):
    instance, layer, arrays, q, out, bad_q = decode_setup
    instance.init_metadata("decode", *arrays)
    counts = [sys.getrefcount(x) for x in (instance, layer, bad_q, out)]

    def body():
        try:
            instance.forward_decode(layer, bad_q, None, None, out)
        except attnplug.Error as error:
            assert error.status == "AP_ERR_SHAPE_MISMATCH"
        else:
            raise AssertionError("a bad q passed")

    traced, rss = measure(body)
    assert [sys.getrefcount(x) for x in (instance, layer, bad_q, out)] == counts
    assert traced < 64 * 1024, f"Python memory grew {traced} bytes over {CALLS} refused calls"
    assert rss < 2 * 1024 * 1024, f"RSS grew {rss} bytes over {CALLS} refused calls"


def test_layers_and_instances_give_their_tensors_back(registry, make_model):
    pages = np.zeros((2, 4, 2, 16), np.float16)
    before = sys.getrefcount(pages)
    for _ in range(1000):
        attnplug.Layer(pages, pages)
        registry.open("cpu_ref", make_model().as_dict(), device="cpu").close()
    gc.collect()
    assert sys.getrefcount(pages) == before
