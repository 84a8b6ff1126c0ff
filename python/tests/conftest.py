"""conftest.py: fixtures of the Python suites: a scanned registry and cpu_ref instances."""

import numpy as np
import pytest

attnplug = pytest.importorskip("attnplug", reason="attnplug is not importable: build it first")


@pytest.fixture(scope="session")
def registry():
    registry = attnplug.open_registry()
    names = [b["name"] for b in registry.backends()]
    assert "cpu_ref" in names, f"cpu_ref was not found; files seen: {registry.files()}"
    return registry


def tiny_model(**overrides):
    """A small GQA model served by cpu_ref: float32 queries over an f16 cache."""
    fields = dict(
        name="test/tiny-gqa",
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=16,
        dtype="f32",
        kv_dtype="f16",
        page_size=4,
        num_layers=2,
        max_batch=4,
        max_tokens=64,
        max_kv_len=64,
    )
    fields.update(overrides)
    return attnplug.Model(**fields)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def make_model():
    return tiny_model
