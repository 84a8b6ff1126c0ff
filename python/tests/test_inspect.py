"""test_inspect.py: registry, capabilities, verdicts with reasons, selection and the YAML config."""

import os

import numpy as np
import pytest

import attnplug

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_YAML = os.path.join(REPO, "examples", "configs", "models.yaml")


def test_versions_and_names():
    assert attnplug.core_abi_version() == (attnplug._attnplug.ABI_VERSION_MAJOR,
                                           attnplug._attnplug.ABI_VERSION_MINOR)
    assert attnplug.status_name(2) == "AP_ERR_SHAPE_MISMATCH"
    assert attnplug.HOOK_APPEND_KV_V1 == "append_kv/1"


def test_cpu_ref_capabilities(registry):
    backends = {b["name"]: b for b in registry.backends()}
    cpu = backends["cpu_ref"]
    assert cpu["version"] and cpu["description"]
    assert os.path.basename(cpu["path"]) == "ap_cpu_ref.so"
    caps = cpu["caps"]
    assert caps["device_kinds"] == ["cpu"]
    assert caps["attn_kinds"] == ["mha", "mla"]
    assert set(caps["q_dtypes"]) == {"f32", "bf16", "f16"}
    assert "fp8_e4m3" in caps["kv_dtypes"] and "nvfp4" in caps["kv_dtypes"]
    assert "f32" not in caps["kv_dtypes"]
    assert caps["page_sizes"] is None and caps["head_dims"] is None  # any
    assert caps["phases"] == ["extend", "decode"]
    assert caps["cuda_graph"] == "none"
    assert "lse" in caps["features"] and caps["needs_host_mirrors"] is True
    assert caps["hooks"] == ["append_kv/1", "pack_prefix_chunk_kv/1", "merge_state/1"]
    files = {os.path.basename(f["path"]): f for f in registry.files()}
    assert files["ap_cpu_ref.so"]["status"] == "AP_OK"


def test_verdict_with_every_reason(registry, make_model):
    # fp8 queries and a float32 cache: two capability mismatches, both reported
    odd = make_model(dtype="fp8_e4m3", kv_dtype="f32")
    verdict = registry.check("cpu_ref", odd.as_dict(), device="cpu")
    assert verdict["usable"] is False
    assert verdict["status"] == "AP_ERR_UNSUPPORTED"
    text = "\n".join(verdict["reasons"])
    assert "query dtype fp8_e4m3" in text and "KV-cache dtype f32" in text
    assert len(verdict["reasons"]) >= 2
    ok = registry.check("cpu_ref", make_model().as_dict(), device="cpu")
    assert ok == dict(backend="cpu_ref", usable=True, status="AP_OK", code=0, reasons=[],
                      arch_index=-1)


def test_select_walks_the_list(registry, make_model):
    walk = registry.select(["no_such", "cpu_ref"], make_model().as_dict(), device="cpu")
    assert walk["chosen"] == "cpu_ref"
    first, second = walk["verdicts"]
    assert (first["backend"], first["status"]) == ("no_such", "AP_ERR_NOT_FOUND")
    assert second["usable"]


def test_cpu_device_has_a_reason_or_a_gpu():
    device = attnplug.device()
    if device["ordinal"] < 0:
        assert device["unusable_reason"], "a CPU fallback must say why no GPU serves"
    assert attnplug.device("cpu")["name"] == "cpu"


def test_instance_attributes(registry, make_model):
    model = make_model(page_size=4)
    options = {"page_size": 8, "kv_dtype": "bf16"}
    with registry.open("cpu_ref", model.as_dict(), options, device="cpu") as instance:
        seen = instance.model
        assert (seen["page_size"], seen["kv_dtype"], seen["name"]) == (8, "bf16", model.name)
        spec = instance.kv_spec()
        # one page: 8 tokens x 2 heads x 16 dims x 2 bytes
        assert spec["k_bytes_per_page"] == spec["v_bytes_per_page"] == 8 * 2 * 16 * 2
        assert instance.caps["device_kinds"] == ["cpu"]


def test_config_from_the_shipped_file():
    config = attnplug.Config.load(MODELS_YAML)
    assert config.version == 1
    rule = config.match("meta-llama/Llama-3-8B")
    assert rule["backends"] == ["trtllm_mha", "flashinfer_like", "cpu_ref"]
    assert rule["options"]["page_size"] == 16 and rule["options"]["kv_dtype"] == "bf16"
    assert rule["line"] > 0
    assert [r["pattern"] for r in config.rules()][-1] == "*"


def test_open_config_on_the_cpu(registry):
    config = attnplug.Config.parse(
        "version: 1\nrules:\n  - match: \"tiny*\"\n    backends: [not_installed, cpu_ref]\n"
        "    options: {page_size: 8}\n")
    model = attnplug.Model("tiny-1", num_qo_heads=2, num_kv_heads=1, head_dim=8, dtype="f32",
                           kv_dtype="f16", max_batch=1, max_tokens=4, max_kv_len=16)
    instance, walk = registry.open_config(config, model.as_dict(), "cpu")
    assert instance.backend == "cpu_ref" and walk["chosen"] == "cpu_ref"
    assert walk["verdicts"][0]["status"] == "AP_ERR_NOT_FOUND"
    assert instance.model["page_size"] == 8
    instance.close()
    again, walk = attnplug.open_instance(registry, model, config=config, device="cpu")
    assert again.backend == "cpu_ref"
    again.close()


def test_open_config_failure_carries_the_walk(registry):
    config = attnplug.Config.parse("version: 1\nrules:\n  - match: \"*\"\n    backend: cpu_ref\n")
    model = attnplug.Model("big", num_qo_heads=2, num_kv_heads=1, head_dim=8, dtype="f32",
                           kv_dtype="f32", max_batch=1, max_tokens=4, max_kv_len=16)
    with pytest.raises(attnplug.Error) as caught:
        registry.open_config(config, model.as_dict(), "cpu")
    error = caught.value
    assert error.status == "AP_ERR_UNSUPPORTED", error.message
    assert "KV-cache dtype f32" in error.message
    assert error.selection["chosen"] is None
    assert error.selection["verdicts"][0]["backend"] == "cpu_ref"


def test_config_errors_name_the_place():
    with pytest.raises(attnplug.Error) as caught:
        attnplug.Config.parse("version: 1\nrules:\n  - match: \"*\"\n    backend: cpu_ref\n"
                              "    optoins: {}\n", "bad.yaml")
    assert caught.value.status == "AP_ERR_CONFIG"
    assert caught.value.message.startswith("bad.yaml:5:")
    with pytest.raises(attnplug.Error) as caught:
        attnplug.Config.load("/nonexistent/models.yaml")
    assert caught.value.status == "AP_ERR_NOT_FOUND"
    assert "/nonexistent/models.yaml" in caught.value.message
    with pytest.raises(attnplug.Error):
        attnplug.Config()


def test_open_instance_by_list_refusal_names_each(registry, make_model):
    model = make_model(kv_dtype="nvfp4", head_dim=8)  # nvfp4 rows are whole blocks of 16
    with pytest.raises(attnplug.Error) as caught:
        attnplug.open_instance(registry, model, backend=["cpu_ref"], device="cpu")
    assert caught.value.status == "AP_ERR_REFUSED"
    assert "nvfp4" in caught.value.message
    np.testing.assert_equal(len(caught.value.selection["verdicts"]), 1)
