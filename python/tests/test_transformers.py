"""test_transformers.py: transformers' generate() on attnplug agrees with attn_implementation="sdpa".

Llama- and Qwen3-architecture models built from their configs with random weights (32 query and
8 KV heads of dim 128, 2 layers, small hidden size and vocabulary; nothing downloaded). Greedy
generation of 32 tokens, single and left-padded batches: the tokens must agree with sdpa's (a row
may part only at a tie: sdpa's top-2 margin within twice the runs' largest logit difference) and
the logits' relative L2 error must stay small at every step; each step's numbers are printed (-s).
On the CPU cpu_ref serves (float32 model, f16 paged cache); on a GPU flashinfer_like (bf16).
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the transformers suite needs it")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: pip install transformers")

from attnplug.integrations import transformers as ap_hf  # noqa: E402

STEPS = 32
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# per device: model dtype, backend, logits' relative L2 limit
# (cpu: ~2e-4 measured, the f16 cache's rounding; cuda: bf16 on both sides, not yet measured)
SETUPS = {"cpu": (torch.float32, "cpu_ref", 1e-3), "cuda": (torch.bfloat16, "flashinfer_like", 3e-2)}


def build(arch, device):
    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=None,
                  tie_word_embeddings=False)
    if arch == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3Config(**common)
        cls = transformers.Qwen3ForCausalLM
    dtype = SETUPS[device][0]
    torch.manual_seed(0)
    model = cls(config).to(device=device, dtype=dtype).eval()
    model.generation_config.pad_token_id = 0
    return model


def generate(model, input_ids, attention_mask, cache=None):
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                             max_new_tokens=STEPS, min_new_tokens=STEPS, past_key_values=cache,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, input_ids.shape[1]:], torch.stack(out.logits, dim=1).float()


def compare(label, model, input_ids, attention_mask, device):
    model.set_attn_implementation("sdpa")
    want_tokens, want_logits = generate(model, input_ids, attention_mask)
    dtype, backend, limit = SETUPS[device]
    ap_hf.enable(model, backend=backend)
    cache = ap_hf.AttnplugCache(model, max_batch=input_ids.shape[0],
                                max_len=input_ids.shape[1] + STEPS + 1)
    assert cache.instance.backend == backend
    got_tokens, got_logits = generate(model, input_ids, attention_mask, cache)
    # Greedy decoding flips where the reference's two best logits are closer than the two runs'
    # logits differ (a tie at bf16 precision). Such a row is compared up to and including that
    # step (after it the two runs feed different tokens); any other difference fails.
    last = [STEPS - 1] * got_tokens.shape[0]
    for row in range(got_tokens.shape[0]):
        differ = (got_tokens[row] != want_tokens[row]).nonzero()
        if differ.numel() == 0:
            continue
        step = differ[0].item()
        top = want_logits[row, step].topk(2).values.tolist()
        margin = top[0] - top[1]
        noise = (got_logits[row, step] - want_logits[row, step]).abs().max().item()
        if margin > 2 * noise:
            pytest.fail(f"tokens differ from sdpa first at row {row} step {step}: sdpa's top-2 "
                        f"logit margin there {margin:.3e} is more than twice the largest logit "
                        f"difference {noise:.3e}, so this is no tie:\n{got_tokens}\n{want_tokens}")
        print(f"\n  row {row}: a tie at step {step} (sdpa's top-2 margin {margin:.2e} <= 2 x the "
              f"largest logit difference {noise:.2e}); compared up to that step")
        last[row] = step
    kept = torch.tensor(last, device=got_logits.device)
    kept = (torch.arange(STEPS, device=got_logits.device)[None, :] <= kept[:, None]).float()
    diff = ((got_logits - want_logits) ** 2).sum(dim=2) * kept
    norm = (want_logits ** 2).sum(dim=2) * kept
    errors = (diff.sum(dim=0) / norm.sum(dim=0).clamp_min(1e-30)).sqrt().tolist()
    agree = (got_tokens == want_tokens).float().mean().item()
    print(f"\n{label} on {backend} ({device}, {dtype}): token agreement {agree * 100:.1f}% "
          f"of {got_tokens.numel()}, logits rel L2 max {max(errors):.2e} (rows up to a tie)")
    print("  step rel-L2: " + " ".join(f"{e:.1e}" for e in errors))
    assert max(errors) < limit, f"logits rel L2 {max(errors):.3e} >= {limit}"
    # the paged cache holds every real token fed: the prompt and all but the last generated one
    # (no forward follows it), padding excluded
    real = attention_mask.sum(dim=1).tolist()
    assert cache.backend.lens[: len(real)] == [n + STEPS - 1 for n in real]
    return errors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_generation_matches_sdpa(arch, device):
    model = build(arch, device)
    torch.manual_seed(1)
    input_ids = torch.randint(3, 512, (1, 24), device=device)
    compare(f"{arch} single", model, input_ids, torch.ones_like(input_ids), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_left_padded_batch_matches_sdpa(arch, device):
    model = build(arch, device)
    torch.manual_seed(2)
    lengths = [19, 5, 12]
    width = max(lengths)
    input_ids = torch.zeros((len(lengths), width), dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, width - length:] = torch.randint(3, 512, (length,), device=device)
        attention_mask[row, width - length:] = 1
    compare(f"{arch} left-padded batch {lengths}", model, input_ids, attention_mask, device)


@pytest.mark.parametrize("device", DEVICES)
def test_plain_forward_without_attnplug_cache(device):
    """No AttnplugCache: the stateless path runs each forward on attnplug all the same."""
    model = build("llama", device)
    torch.manual_seed(3)
    input_ids = torch.randint(3, 512, (2, 17), device=device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :6] = 0  # row 1 left-padded
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
        ap_hf.enable(model, backend=SETUPS[device][1])
        got = model(input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
    scratch = ap_hf._scratch.get(model.config)
    assert scratch is not None and scratch.instance.backend == SETUPS[device][1]
    assert scratch.lens[:2] == [17, 11]  # it planned the real tokens of each row
    keep = attention_mask.bool()  # padding rows' outputs are not defined by either
    error = ((got - want)[keep].norm() / want[keep].norm()).item()
    print(f"\nplain forward on {SETUPS[device][1]}: logits rel L2 {error:.2e}")
    assert error < SETUPS[device][2]


def test_config_picks_the_backend():
    """The YAML config's rule for the model's name chooses the backend, as for any host."""
    import attnplug

    model = build("llama", "cpu")
    config = attnplug.Config.parse(
        'version: 1\nrules:\n  - match: "test/*"\n    backends: [not_installed, cpu_ref]\n'
        '    options: {page_size: 8}\n')
    ap_hf.enable(model, config=config, model_name="test/llama-random")
    cache = ap_hf.AttnplugCache(model, max_batch=1, max_len=64)
    assert cache.instance.backend == "cpu_ref"
    assert cache.backend.page_size == 8
    assert cache.backend.selection["verdicts"][0]["status"] == "AP_ERR_NOT_FOUND"
