"""Type stubs of attnplug._attnplug, the C extension (stable ABI) over core/include/attnplug.h."""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypedDict, Union

class _DLPackTensor:
    """Anything with __dlpack__ and __dlpack_device__ (torch, CuPy, JAX, numpy >= 1.22)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

Tensor = Any  # a _DLPackTensor or a DLPack capsule
Stream = Optional[int]  # a cudaStream_t as an int; None = the caller's current stream
PathLike = Union[str, os.PathLike]

OK: int
ERR_INVALID_ARGUMENT: int
ERR_SHAPE_MISMATCH: int
ERR_UNSUPPORTED: int
ERR_ABI_MISMATCH: int
ERR_LOAD: int
ERR_MISSING_SYMBOL: int
ERR_NOT_FOUND: int
ERR_OUT_OF_MEMORY: int
ERR_CONFIG: int
ERR_NO_DEVICE: int
ERR_CUDA: int
ERR_REFUSED: int
ERR_DUPLICATE: int
ERR_INTERNAL: int
ABI_VERSION_MAJOR: int
ABI_VERSION_MINOR: int
HOOK_APPEND_KV_V1: str
HOOK_MERGE_STATE_V1: str
HOOK_PACK_PREFIX_CHUNK_KV_V1: str
HOOK_CUDA_GRAPH_V1: str

class Error(RuntimeError):
    """A failed call: .status is the ap_status name, .code its number, .message the core's."""

    status: str
    code: int
    message: str
    selection: "Selection"  # only on a failed Registry.open_config / attnplug.open_instance

class Verdict(TypedDict):
    backend: str
    usable: bool
    status: str
    code: int
    reasons: List[str]
    arch_index: int

class Selection(TypedDict):
    chosen: Optional[str]
    verdicts: List[Verdict]

class Caps(TypedDict):
    device_kinds: List[str]
    archs: List[str]
    attn_kinds: List[str]
    q_dtypes: List[str]
    kv_dtypes: List[str]
    page_sizes: Optional[List[int]]  # None: any
    head_dims: Optional[List[int]]  # None: any
    phases: List[str]
    cuda_graph: str
    features: List[str]
    needs_host_mirrors: bool
    hooks: List[str]  # the hook names the backend declares (get_hook is the authority)

class BackendInfo(TypedDict):
    name: str
    version: str
    description: str
    path: Optional[str]
    caps: Caps

class FileRecord(TypedDict):
    path: str
    status: str
    code: int
    message: str
    backend: Optional[str]

class KVSpec(TypedDict):
    k_bytes_per_page: int
    v_bytes_per_page: int
    scale_bytes_per_page: int
    alignment: int

class Device(TypedDict):
    ordinal: int
    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    driver_version: int
    total_memory: int
    unusable_reason: str

ModelDict = Dict[str, Any]  # attnplug.Model.as_dict()
OptionsDict = Dict[str, Any]  # page_size, kv_dtype, prefix_cache, chunked_prefill, cuda_graphs, extra
DeviceArg = Union[None, int, str]  # None: CUDA device 0 (or the CPU); an ordinal; "cpu"

def core_abi_version() -> Tuple[int, int]: ...
def status_name(code: int) -> str: ...
def device(which: DeviceArg = None) -> Device: ...
def last_error() -> str: ...

class Config:
    version: int
    @classmethod
    def load(cls, path: PathLike) -> "Config": ...
    @classmethod
    def parse(cls, text: str, source_name: str = "<string>") -> "Config": ...
    def rules(self) -> List[Dict[str, Any]]: ...
    def plugin_paths(self) -> List[str]: ...
    def match(self, model_name: str) -> Optional[Dict[str, Any]]: ...

class Registry:
    def __init__(
        self, search_dirs: Optional[Sequence[PathLike]] = None, no_default_paths: bool = False
    ) -> None: ...
    def add_dir(self, path: PathLike) -> None: ...
    def scan(self) -> None: ...
    def load_file(self, path: PathLike) -> None: ...
    def files(self) -> List[FileRecord]: ...
    def backends(self) -> List[BackendInfo]: ...
    def check(
        self,
        name: str,
        model: ModelDict,
        options: Optional[OptionsDict] = None,
        device: DeviceArg = None,
    ) -> Verdict: ...
    def select(
        self,
        names: Sequence[str],
        model: ModelDict,
        options: Optional[OptionsDict] = None,
        device: DeviceArg = None,
        explicit_single: bool = False,
    ) -> Selection: ...
    def open(
        self,
        name: str,
        model: ModelDict,
        options: Optional[OptionsDict] = None,
        device: DeviceArg = None,
    ) -> "Instance": ...
    def open_config(
        self, config: Config, model: ModelDict, device: DeviceArg = None
    ) -> Tuple["Instance", Selection]: ...
    def close(self) -> None: ...

class Layer:
    layer_id: int
    sm_scale: float
    logit_softcap: float
    k_scale: float
    v_scale: float
    window_left: int
    kv_dtype: str
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    def __init__(
        self,
        k_pages: Tensor,
        v_pages: Optional[Tensor] = None,
        *,
        layer_id: int = 0,
        kv_dtype: Optional[str] = None,
        sm_scale: Optional[float] = None,
        logit_softcap: float = 0.0,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        window_left: int = -1,
        k_block_scales: Optional[Tensor] = None,
        v_block_scales: Optional[Tensor] = None,
    ) -> None: ...

class Instance:
    backend: str
    model: ModelDict
    caps: Caps
    closed: bool
    def kv_spec(self) -> KVSpec: ...
    def init_metadata(
        self,
        mode: str,
        qo_indptr: Tensor,
        seq_lens: Tensor,
        kv_page_indptr: Optional[Tensor] = None,
        kv_page_indices: Optional[Tensor] = None,
        kv_last_page_len: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
        *,
        host: Optional[Dict[str, Tensor]] = None,
        num_tokens: int = -1,
        max_q_len: int = -1,
        max_seq_len: int = -1,
        stream: Stream = None,
    ) -> None: ...
    def forward_extend(
        self,
        layer: Layer,
        q: Tensor,
        k: Optional[Tensor],
        v: Optional[Tensor],
        out: Tensor,
        *,
        lse: Optional[Tensor] = None,
        save_kv: bool = False,
        q_rope: Optional[Tensor] = None,
        stream: Stream = None,
    ) -> None: ...
    def forward_decode(
        self,
        layer: Layer,
        q: Tensor,
        k: Optional[Tensor],
        v: Optional[Tensor],
        out: Tensor,
        *,
        lse: Optional[Tensor] = None,
        save_kv: bool = False,
        q_rope: Optional[Tensor] = None,
        stream: Stream = None,
    ) -> None: ...
    def append_kv(
        self,
        layer: Layer,
        k: Tensor,
        v: Tensor,
        positions: Tensor,
        out_loc: Tensor,
        cos_sin: Tensor,
        rotary_dim: int,
        *,
        q: Optional[Tensor] = None,
        q_out: Optional[Tensor] = None,
        is_neox: bool = True,
        stream: Stream = None,
    ) -> None: ...
    def pack_prefix_chunk_kv(
        self,
        k_nope: Tensor,
        k_pe: Tensor,
        v: Tensor,
        k_out: Tensor,
        v_out: Tensor,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        stream: Stream = None,
    ) -> None: ...
    def merge_state(
        self,
        o_a: Tensor,
        lse_a: Tensor,
        o_b: Tensor,
        lse_b: Tensor,
        o: Tensor,
        *,
        lse: Optional[Tensor] = None,
        stream: Stream = None,
    ) -> None: ...
    def cuda_graph_prepare(self, max_batch: int, *, stream: Stream = None) -> None: ...
    def has_hook(self, name: str) -> bool: ...
    def hook_address(self, name: str) -> int: ...
    def _time_forward_decode(
        self, n: int, layer: Layer, q: Tensor, k: Optional[Tensor], v: Optional[Tensor], out: Tensor
    ) -> float: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Instance": ...
    def __exit__(self, *args: Any) -> bool: ...
