"""attnplug for Python: load attention backends through the attnplug core and run them on
DLPack tensors (torch, CuPy, JAX, numpy) with no copy.

    import attnplug
    registry = attnplug.open_registry()                       # finds the packaged plugins
    model = attnplug.Model("my-llama", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                           dtype="bf16", page_size=16, max_batch=8, max_tokens=4096,
                           max_kv_len=4096)
    inst, walk = registry.open_config(attnplug.Config.load("models.yaml"), model.as_dict())
    layer = attnplug.Layer(k_pages, v_pages, layer_id=0)      # the paged KV cache, held
    inst.init_metadata("decode", qo_indptr, seq_lens, kv_page_indptr, kv_page_indices,
                       kv_last_page_len, positions)
    inst.forward_decode(layer, q, None, None, out)

Every failure raises attnplug.Error with .status ("AP_ERR_SHAPE_MISMATCH"), .code and .message
(the core's words); shapes and dtypes are checked before any backend runs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._attnplug import (  # noqa: F401  (re-exported)
    HOOK_APPEND_KV_V1,
    HOOK_CUDA_GRAPH_V1,
    HOOK_MERGE_STATE_V1,
    HOOK_PACK_PREFIX_CHUNK_KV_V1,
    ERR_REFUSED,
    Config,
    Error,
    Instance,
    Layer,
    Registry,
    core_abi_version,
    device,
    last_error,
    status_name,
)

__version__ = "0.1.0"

#: Where a wheel puts the plugins it carries (absent in a build tree, which the core finds itself).
PLUGIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")


@dataclasses.dataclass
class Model:
    """What one model looks like to a backend, per GPU (after tensor parallelism).

    head_dim sets both head_dim_qk and head_dim_v unless they are given. kv_dtype None means the
    model's dtype. as_dict() gives the mapping the Registry's calls take.
    """

    name: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int = 0
    dtype: str = "bf16"
    kv_dtype: Optional[str] = None
    page_size: int = 16
    num_layers: int = 1
    causal: bool = True
    embedding: bool = False
    max_batch: int = 1
    max_tokens: int = 1
    max_kv_len: int = 1
    kind: str = "mha"
    head_dim_qk: int = 0
    head_dim_v: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    def as_dict(self) -> Dict[str, Any]:
        fields = dataclasses.asdict(self)
        head_dim = fields.pop("head_dim")
        fields["head_dim_qk"] = fields["head_dim_qk"] or head_dim
        fields["head_dim_v"] = fields["head_dim_v"] or head_dim
        fields["kv_dtype"] = fields["kv_dtype"] or fields["dtype"]
        return fields


def plugin_dirs() -> List[str]:
    """The folders this package gives the core first: its own plugin folder when it has one."""
    return [PLUGIN_DIR] if os.path.isdir(PLUGIN_DIR) else []


def open_registry(
    search_dirs: Optional[Iterable[Union[str, os.PathLike]]] = None,
    config: Optional[Config] = None,
    no_default_paths: bool = False,
) -> Registry:
    """A scanned Registry: `search_dirs` first, then this package's plugins, then the config's
    plugin_path, then the core's defaults (AP_PLUGIN_PATH, AP_ADD_PLUGIN_PATH, the install folder,
    the build tree) unless no_default_paths."""
    dirs = [os.fspath(d) for d in (search_dirs or ())] + plugin_dirs()
    registry = Registry(dirs, no_default_paths=no_default_paths)
    if config is not None:
        for path in config.plugin_paths():
            registry.add_dir(path)
    registry.scan()
    return registry


def _model_dict(model: Union[Model, Dict[str, Any]]) -> Dict[str, Any]:
    return model.as_dict() if isinstance(model, Model) else dict(model)


def open_instance(
    registry: Registry,
    model: Union[Model, Dict[str, Any]],
    *,
    config: Optional[Config] = None,
    backend: Optional[Union[str, Sequence[str]]] = None,
    options: Optional[Dict[str, Any]] = None,
    device: Union[None, int, str] = None,
) -> Tuple[Instance, Dict[str, Any]]:
    """Open an instance for `model`: by the config's rule for the model's name, or by a backend
    name (or a preference list). Returns (instance, selection walk with every verdict)."""
    as_dict = _model_dict(model)
    if config is not None:
        return registry.open_config(config, as_dict, device)
    if backend is None:
        raise ValueError("open_instance needs a config or a backend")
    names = [backend] if isinstance(backend, str) else list(backend)
    walk = registry.select(names, as_dict, options, device, explicit_single=isinstance(backend, str))
    if walk["chosen"] is None:
        reasons = "; ".join(
            f"{v['backend']}: {', '.join(v['reasons']) or v['status']}" for v in walk["verdicts"]
        )
        error = Error(f"no backend of {names} can serve model '{as_dict.get('name')}': {reasons}")
        error.status, error.code = "AP_ERR_REFUSED", ERR_REFUSED
        error.message, error.selection = str(error), walk
        raise error
    return registry.open(walk["chosen"], as_dict, options, device), walk


__all__ = [
    "Config",
    "Error",
    "HOOK_APPEND_KV_V1",
    "HOOK_CUDA_GRAPH_V1",
    "HOOK_MERGE_STATE_V1",
    "HOOK_PACK_PREFIX_CHUNK_KV_V1",
    "Instance",
    "Layer",
    "Model",
    "PLUGIN_DIR",
    "Registry",
    "core_abi_version",
    "device",
    "last_error",
    "open_instance",
    "open_registry",
    "plugin_dirs",
    "status_name",
]
