"""attn_reference.py: the tests' independent oracle and paged-cache bookkeeping, in numpy.

The reference attention is computed densely in float64 from the values the cache holds (the new
K/V rounded to the cache dtype), with no paging: a bug in the page tables of the backend or of
the binding cannot hide in it.
"""

import numpy as np


def reference_attention(q, k, v, causal_offset, sm_scale, causal=True):
    """Dense attention of one sequence in float64.

    q [tq][hq][d], k [tk][hkv][d], v [tk][hkv][dv]; query j sits at position causal_offset + j
    and sees keys 0 .. causal_offset + j (all keys when not causal). Returns (out [tq][hq][dv],
    lse [tq][hq]) with lse the natural log of the softmax denominator of the scaled logits.
    """
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    v = v.astype(np.float64)
    tq, hq, _ = q.shape
    tk, hkv, dv = v.shape
    group = hq // hkv
    out = np.zeros((tq, hq, dv))
    lse = np.zeros((tq, hq))
    for h in range(hq):
        kh, vh = k[:, h // group, :], v[:, h // group, :]
        logits = (q[:, h, :] @ kh.T) * sm_scale  # [tq][tk]
        if causal:
            allowed = np.arange(tk)[None, :] <= (causal_offset + np.arange(tq))[:, None]
            logits = np.where(allowed, logits, -np.inf)
        top = logits.max(axis=1, keepdims=True)
        weights = np.exp(logits - top)
        total = weights.sum(axis=1, keepdims=True)
        out[:, h, :] = (weights / total) @ vh
        lse[:, h] = (top + np.log(total))[:, 0]
    return out, lse


class PagedSequences:
    """Sequences of a paged KV cache: each owns pages drawn from a shuffled pool, so the page
    table is never the identity. Builds the CSR arrays of one forward (int32 numpy)."""

    def __init__(self, capacities, page_size, rng, spare_pages=1):
        self.page_size = page_size
        pages_per_seq = [(c + page_size - 1) // page_size for c in capacities]
        self.num_pages = sum(pages_per_seq) + spare_pages
        pool = rng.permutation(self.num_pages)
        self.pages = []
        start = 0
        for count in pages_per_seq:
            self.pages.append(pool[start : start + count])
            start += count
        self.lens = [0] * len(capacities)

    def batch(self, q_lens):
        """Arrays of a forward adding q_lens[i] tokens to sequence i (advances the lengths)."""
        qo, page_indptr, page_indices, last, seq_lens, positions = [0], [0], [], [], [], []
        for i, q_len in enumerate(q_lens):
            prefix = self.lens[i]
            seq_len = prefix + q_len
            used = (seq_len + self.page_size - 1) // self.page_size
            qo.append(qo[-1] + q_len)
            page_indices.extend(self.pages[i][:used])
            page_indptr.append(len(page_indices))
            last.append(seq_len - (used - 1) * self.page_size)
            seq_lens.append(seq_len)
            positions.extend(range(prefix, seq_len))
            self.lens[i] = seq_len
        as32 = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
        return (
            as32(qo),
            as32(seq_lens),
            as32(page_indptr),
            as32(page_indices),
            as32(last),
            as32(positions),
        )


def open_paged(registry, model, capacities, rng, fill=0.0):
    """A cpu_ref instance for `model` (an attnplug.Model) and a Layer over a numpy f16 paged
    cache (filled with `fill`) with room for sequences of `capacities` tokens.
    Returns (instance, sequences, layer, k_pages, v_pages)."""
    import attnplug

    instance = registry.open("cpu_ref", model.as_dict(), device="cpu")
    seqs = PagedSequences(capacities, model.page_size, rng)
    shape = (seqs.num_pages, model.page_size, model.num_kv_heads, model.head_dim)
    k_pages, v_pages = np.full(shape, fill, np.float16), np.full(shape, fill, np.float16)
    return instance, seqs, attnplug.Layer(k_pages, v_pages), k_pages, v_pages
