"""attnplug.integrations.transformers: run a Hugging Face transformers model's attention on attnplug.

    from attnplug.integrations import transformers as ap_hf
    model = ap_hf.enable(model, config="models.yaml")        # attn_implementation="attnplug"
    cache = ap_hf.AttnplugCache(model, max_batch=4, max_len=256)
    out = model.generate(input_ids, attention_mask=mask, past_key_values=cache, max_new_tokens=32)

enable() registers "attnplug" with transformers' AttentionInterface (and a padding-mask function
with AttentionMaskInterface: the backend is told which tokens are real, as FlashAttention is) and
switches the model to it. AttnplugCache keeps K/V in attnplug's paged cache: the prefill writes
it through forward_extend(save_kv=True), each generated token through forward_decode(save_kv=True);
transformers' own cache holds nothing. Padding tokens never enter the paged cache, so left-padded
batches attend exactly as the padding mask says. The backend is the one the YAML config chooses
for the model's name (or a name or preference list given by hand).

Without an AttnplugCache (a plain forward, or generate's default DynamicCache) the attention still
runs on attnplug, statelessly: every call writes the keys it is given into a scratch paged cache
and runs one extend over them. That path is correct but pays for the whole context each step.
"""

from __future__ import annotations

import math
import os
import weakref
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface

import attnplug

IMPLEMENTATION = "attnplug"

_AP_DTYPE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}
for _name, _attr in (("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _TORCH_DTYPE[_name] = getattr(torch, _attr)

ConfigArg = Union[None, str, os.PathLike, attnplug.Config]



class _ByConfig:
    """Values kept per transformers config object (configs are unhashable), dropped with it.
    Kept beside the config, not in it, so the config still serialises."""

    def __init__(self):
        self._items: Dict[int, Any] = {}

    def get(self, config, default=None):
        item = self._items.get(id(config))
        return item[1] if item is not None and item[0]() is config else default

    def __setitem__(self, config, value):
        key = id(config)
        self._items[key] = (weakref.ref(config, lambda _, key=key: self._items.pop(key, None)), value)


_options = _ByConfig()  # enable()'s choices
_scratch = _ByConfig()  # the scratch backend of runs without an AttnplugCache


def _text_config(hf_config):
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def _device_arg(device: torch.device):
    if device.type == "cpu":
        return "cpu"
    return device.index if device.index is not None else torch.cuda.current_device()


class Backend:
    """One attnplug instance serving one transformers model: its paged KV cache (one Layer per
    model layer, pages owned per sequence) and the batch plan shared by all layers of a forward."""

    def __init__(
        self,
        hf_config,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_batch: int,
        max_len: int,
        config: ConfigArg = None,
        backend: Union[None, str, Sequence[str]] = None,
        model_name: Optional[str] = None,
        registry: Optional[attnplug.Registry] = None,
    ):
        text = _text_config(hf_config)
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        if dtype not in _AP_DTYPE:
            raise attnplug.Error(f"attnplug cannot run a model in {dtype}")
        if isinstance(config, (str, os.PathLike)):
            config = attnplug.Config.load(config)
        name = model_name or getattr(hf_config, "name_or_path", "") or text.model_type
        self.model = attnplug.Model(
            name,
            num_qo_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=_AP_DTYPE[dtype],
            # a float32 model keeps its cache in f16 unless the config says otherwise
            kv_dtype="f16" if dtype == torch.float32 else _AP_DTYPE[dtype],
            page_size=16,
            num_layers=text.num_hidden_layers,
            max_batch=max_batch,
            max_tokens=max_batch * max_len,
            max_kv_len=max_len,
        )
        self.registry = registry or attnplug.open_registry(config=config)
        if config is None and backend is None:
            backend = ["flashinfer_like", "cpu_ref"] if device.type == "cuda" else ["cpu_ref"]
        self.instance, self.selection = attnplug.open_instance(
            self.registry, self.model, config=config, backend=backend, device=_device_arg(device)
        )
        seen = self.instance.model  # with the config's options applied
        self.page_size = seen["page_size"]
        self.kv_dtype = seen["kv_dtype"]
        if self.kv_dtype not in _TORCH_DTYPE:
            raise attnplug.Error(f"no torch dtype holds an attnplug {self.kv_dtype} cache")
        self.device, self.dtype = device, dtype
        self.max_batch, self.max_len = max_batch, max_len
        self.pages_per_seq = math.ceil(max_len / self.page_size)
        shape = (max_batch * self.pages_per_seq, self.page_size, kv_heads, head_dim)
        self.k_pages = [torch.zeros(shape, dtype=_TORCH_DTYPE[self.kv_dtype], device=device)
                        for _ in range(text.num_hidden_layers)]
        self.v_pages = [torch.zeros_like(pages) for pages in self.k_pages]
        self.layers: Dict[int, attnplug.Layer] = {}
        self.lens = [0] * max_batch
        self.num_tokens = 0

    def layer(self, layer_idx: int, scaling: float, softcap: Optional[float],
              sliding_window: Optional[int]) -> attnplug.Layer:
        layer = self.layers.get(layer_idx)
        if layer is None:
            layer = attnplug.Layer(
                self.k_pages[layer_idx],
                self.v_pages[layer_idx],
                layer_id=layer_idx,
                sm_scale=scaling,
                logit_softcap=float(softcap or 0.0),
                # transformers' window W keeps keys with q - k < W: W - 1 to the left
                window_left=(sliding_window - 1) if sliding_window else -1,
            )
            self.layers[layer_idx] = layer
        return layer

    def plan(self, real: torch.Tensor, fresh: bool) -> None:
        """Plan one forward: real[b, t] says whether token t of row b is a real (not padding)
        token. Real tokens are appended to their sequence (all sequences restart when fresh)."""
        real = real.to("cpu", torch.bool)
        batch, width = real.shape
        if batch > self.max_batch:
            raise attnplug.Error(f"batch of {batch} rows, the cache holds {self.max_batch}")
        if fresh:
            self.lens = [0] * self.max_batch
        counts = real.sum(dim=1).tolist()
        qo, indptr, indices, last, seq_lens, positions = [0], [0], [], [], [], []
        for b, count in enumerate(counts):
            prefix, seq_len = self.lens[b], self.lens[b] + count
            if seq_len > self.max_len:
                raise attnplug.Error(f"sequence {b} reaches {seq_len} tokens, past max_len {self.max_len}")
            used = max(1, math.ceil(seq_len / self.page_size))
            qo.append(qo[-1] + count)
            indices.extend(range(b * self.pages_per_seq, b * self.pages_per_seq + used))
            indptr.append(len(indices))
            last.append(seq_len - (used - 1) * self.page_size)
            seq_lens.append(seq_len)
            positions.extend(range(prefix, seq_len))
            self.lens[b] = seq_len
        mode = "decode" if all(count == 1 for count in counts) else "extend"
        host = [torch.tensor(values, dtype=torch.int32)
                for values in (qo, seq_lens, indptr, indices, last, positions)]
        names = ("qo_indptr", "seq_lens", "kv_page_indptr", "kv_page_indices", "kv_last_page_len",
                 "positions")
        if self.device.type == "cpu":
            self.instance.init_metadata(mode, *host)
        else:
            arrays = [values.to(self.device, non_blocking=True) for values in host]
            self.instance.init_metadata(mode, *arrays, host=dict(zip(names, host)))
            self._device_arrays = arrays  # the backend may read them until the next plan
        self.mode = mode
        self.num_tokens = qo[-1]
        self.rows = torch.nonzero(real.reshape(-1)).reshape(-1).to(self.device)

    def attend(self, module, query, key, value, scaling, softcap, sliding_window):
        """query [B][Hq][T][D], key/value [B][Hkv][T][D] of the tokens planned: the output
        [B][T][Hq][Dv], zero on padding rows."""
        batch, heads, width, _ = query.shape
        layer = self.layer(module.layer_idx, scaling, softcap, sliding_window)

        def packed(states):  # [B][H][T][D] -> the real tokens, [N][H][D]
            flat = states.transpose(1, 2).reshape(batch * width, states.shape[1], states.shape[3])
            return flat.index_select(0, self.rows).contiguous()

        q, k, v = packed(query), packed(key), packed(value)
        out = torch.empty((self.num_tokens, heads, value.shape[3]), dtype=query.dtype,
                          device=query.device)
        forward = self.instance.forward_decode if self.mode == "decode" else self.instance.forward_extend
        forward(layer, q, k.to(query.dtype), v.to(query.dtype), out, save_kv=True)
        full = torch.zeros((batch * width, heads, value.shape[3]), dtype=query.dtype,
                           device=query.device)
        full.index_copy_(0, self.rows, out)
        return full.view(batch, width, heads, value.shape[3])

    def close(self) -> None:
        self.layers.clear()
        self.instance.close()


class AttnplugLayer(DynamicLayer):
    """One model layer's view of an AttnplugCache: counts tokens (padding included, as
    transformers' positions do) and hands the new K/V through; the paged cache holds the rest."""

    is_croppable = False

    def __init__(self, backend: Backend, layer_idx: int):
        super().__init__()
        self.backend = backend
        self.layer_idx = layer_idx
        self.length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.length += key_states.shape[-2]
        self.keys, self.values = key_states, value_states  # the newest only
        _note_update(key_states, self.backend)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.backend.max_len

    def reset(self) -> None:
        self.length = 0
        self.keys = self.values = None
        self.backend.lens = [0] * self.backend.max_batch

    def crop(self, *args, **kwargs) -> None:
        raise NotImplementedError("AttnplugCache cannot drop tokens")

    def reorder_cache(self, *args, **kwargs) -> None:
        raise NotImplementedError("AttnplugCache does not serve beam search")

    def batch_repeat_interleave(self, *args, **kwargs) -> None:
        raise NotImplementedError("AttnplugCache cannot repeat its rows")

    def batch_select_indices(self, *args, **kwargs) -> None:
        raise NotImplementedError("AttnplugCache cannot select rows")


class AttnplugCache(Cache):
    """A transformers Cache whose K/V live in attnplug's paged cache (see the module docstring).

    max_batch rows of up to max_len tokens each (prompt and generated, padding excluded). The
    backend is the config's choice for model_name (default: the model's name_or_path); without a
    config, `backend` names one or a preference list (default: flashinfer_like then cpu_ref on a
    GPU, cpu_ref on the CPU)."""

    def __init__(
        self,
        model,
        max_batch: int,
        max_len: int,
        *,
        config: ConfigArg = None,
        backend: Union[None, str, Sequence[str]] = None,
        model_name: Optional[str] = None,
        registry: Optional[attnplug.Registry] = None,
    ):
        options = _options.get(model.config, {})
        self.backend = Backend(
            model.config,
            dtype=model.dtype,
            device=model.device,
            max_batch=max_batch,
            max_len=max_len,
            config=config if config is not None else options.get("config"),
            backend=backend if backend is not None else options.get("backend"),
            model_name=model_name or options.get("model_name"),
            registry=registry,
        )
        layers = [AttnplugLayer(self.backend, i)
                  for i in range(_text_config(model.config).num_hidden_layers)]
        super().__init__(layers=layers)

    @property
    def instance(self) -> attnplug.Instance:
        return self.backend.instance


# The key tensor AttnplugLayer.update handed out last, and its backend: the attention call that
# follows gets that very tensor, which tells it to use the paged cache.
_last_update: List[Any] = [None, None]


def _note_update(key_states, backend) -> None:
    _last_update[0], _last_update[1] = key_states, backend


def _padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                  mask_function=None, attention_mask=None, **kwargs):
    """The mask "attnplug" gets: the 2-D padding mask (real tokens True) of the kv_length
    columns, or None when every token is real, as FlashAttention's is."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


def attnplug_attention_forward(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, softcap=None, sliding_window=None, **kwargs):
    """transformers' attention function for "attnplug": returns (output [B][T][Hq][Dv], None)."""
    if dropout:
        raise attnplug.Error("attnplug runs inference only (dropout > 0)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    batch, _, width, _ = query.shape
    first = module.layer_idx == 0
    if _last_update[0] is key:
        backend = _last_update[1]
        if first:
            real = (attention_mask[:, -width:] if attention_mask is not None
                    else torch.ones((batch, width), dtype=torch.bool))
            backend.plan(real, fresh=False)
        return backend.attend(module, query, key, value, scaling, softcap, sliding_window), None
    # No AttnplugCache: all keys come each call; the queries are the last `width` of them.
    length = key.shape[2]
    backend = _stateless(module, batch, length, query)
    if first or backend.num_tokens == 0:
        real = (attention_mask[:, -length:] if attention_mask is not None
                else torch.ones((batch, length), dtype=torch.bool))
        backend.plan(real, fresh=True)
    padded = query.new_zeros((batch, query.shape[1], length, query.shape[3]))
    padded[:, :, length - width :, :] = query
    out = backend.attend(module, padded, key, value, scaling, softcap, sliding_window)
    return out[:, length - width :], None


def _stateless(module, batch: int, length: int, query) -> Backend:
    """The scratch backend of a model run without an AttnplugCache, regrown as calls need."""
    config = module.config
    backend = _scratch.get(config)
    if backend is None or backend.max_batch < batch or backend.max_len < length or \
            backend.device != query.device or backend.dtype != query.dtype:
        if backend is not None:
            backend.close()
        options = _options.get(config, {})
        backend = Backend(config, dtype=query.dtype, device=query.device,
                          max_batch=max(batch, 1), max_len=max(2 * length, 64),
                          config=options.get("config"), backend=options.get("backend"),
                          model_name=options.get("model_name"))
        _scratch[config] = backend
    return backend


def register() -> None:
    """Register "attnplug" with transformers' AttentionInterface and AttentionMaskInterface."""
    AttentionInterface.register(IMPLEMENTATION, attnplug_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, _padding_mask)


def enable(model, *, config: ConfigArg = None, backend: Union[None, str, Sequence[str]] = None,
           model_name: Optional[str] = None):
    """Switch a transformers model to attn_implementation="attnplug"; `config` (a YAML file or
    attnplug.Config) picks the backend for model_name (default: the model's name_or_path).
    Returns the model."""
    register()
    if isinstance(config, (str, os.PathLike)):
        config = attnplug.Config.load(config)
    _options[model.config] = dict(config=config, backend=backend, model_name=model_name)
    model.set_attn_implementation(IMPLEMENTATION)
    return model
