"""tp_attention.py: one attention layer of the Llama-3-8B shape at tensor parallelism N.

One process per GPU (torch.distributed over NCCL): each rank opens its own attnplug instance for
its share of the heads (32/N query heads, 8/N KV heads: whole GQA groups) on its own device, holds
its share of the paged KV cache, runs a prefill and decode steps on its heads, and the outputs are
gathered along the head dimension. Rank 0 then runs the same inputs at TP 1 (every head, one
instance) and compares: the relative L2 difference per step is printed, and the run fails above
1e-3 (the heads are computed independently, so TP N should match TP 1 to rounding).

    torchrun --nproc-per-node 2 python/examples/tp_attention.py            # 2 GPUs, flashinfer_like
    torchrun --nproc-per-node 2 python/examples/tp_attention.py --device cpu --backend cpu_ref
                                                                         # the same logic on the CPU (gloo)
"""

import argparse
import os
import sys

# NVLink multicast stays off on shared machines (it can take the host's GPUs down).
for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import attnplug  # noqa: E402

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16


class Shard:
    """One attnplug instance over heads [q0, q1) / [k0, k1), with its paged KV cache."""

    def __init__(self, registry, backend, device, lengths, steps, q_range, kv_range):
        self.q_range, self.kv_range, self.device = q_range, kv_range, device
        heads_q, heads_kv = q_range[1] - q_range[0], kv_range[1] - kv_range[0]
        longest = max(lengths) + steps
        model = attnplug.Model("meta-llama/Llama-3-8B", num_qo_heads=heads_q,
                               num_kv_heads=heads_kv, head_dim=HEAD_DIM, dtype="bf16",
                               page_size=PAGE, max_batch=len(lengths),
                               max_tokens=sum(lengths), max_kv_len=longest)
        ordinal = "cpu" if device.type == "cpu" else device.index
        self.instance = registry.open(backend, model.as_dict(), device=ordinal)
        self.pages_per_seq = -(-longest // PAGE)
        shape = (len(lengths) * self.pages_per_seq, PAGE, heads_kv, HEAD_DIM)
        self.k_pages = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.v_pages = torch.zeros_like(self.k_pages)
        self.layer = attnplug.Layer(self.k_pages, self.v_pages)
        self.lens = [0] * len(lengths)

    def forward(self, q_lens, q, k, v):
        """q/k/v hold every head, [tokens][heads][dim] on this shard's device; returns out of
        this shard's heads."""
        qo, indptr, indices, last, seq_lens, positions = [0], [0], [], [], [], []
        for i, count in enumerate(q_lens):
            prefix, seq = self.lens[i], self.lens[i] + count
            used = -(-seq // PAGE)
            qo.append(qo[-1] + count)
            indices += range(i * self.pages_per_seq, i * self.pages_per_seq + used)
            indptr.append(len(indices))
            last.append(seq - (used - 1) * PAGE)
            seq_lens.append(seq)
            positions += range(prefix, seq)
            self.lens[i] = seq
        host = {name: torch.tensor(values, dtype=torch.int32) for name, values in
                zip(("qo_indptr", "seq_lens", "kv_page_indptr", "kv_page_indices",
                     "kv_last_page_len", "positions"),
                    (qo, seq_lens, indptr, indices, last, positions))}
        if self.device.type == "cpu":
            self.instance.init_metadata("extend" if max(q_lens) > 1 else "decode", **host)
        else:
            arrays = {name: values.to(self.device) for name, values in host.items()}
            self.instance.init_metadata("extend" if max(q_lens) > 1 else "decode", **arrays,
                                        host=host)
        q = q[:, self.q_range[0]:self.q_range[1]].contiguous()
        k = k[:, self.kv_range[0]:self.kv_range[1]].contiguous()
        v = v[:, self.kv_range[0]:self.kv_range[1]].contiguous()
        out = torch.empty_like(q)
        run = self.instance.forward_extend if max(q_lens) > 1 else self.instance.forward_decode
        run(self.layer, q, k, v, out, save_kv=True)
        return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backend", default="flashinfer_like")
    parser.add_argument("--steps", type=int, default=8, help="decode steps after the prefill")
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if QO_HEADS % world or KV_HEADS % world:
        sys.exit(f"TP {world} does not divide {QO_HEADS} query and {KV_HEADS} KV heads")
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    registry = attnplug.open_registry()
    lengths = [100, 37, 512, 250]
    q_share, kv_share = QO_HEADS // world, KV_HEADS // world
    shard = Shard(registry, args.backend, device, lengths, args.steps,
                  (rank * q_share, (rank + 1) * q_share), (rank * kv_share, (rank + 1) * kv_share))
    whole = Shard(registry, args.backend, device, lengths, args.steps, (0, QO_HEADS),
                  (0, KV_HEADS)) if rank == 0 else None
    generator = torch.Generator().manual_seed(1234)  # every rank draws the same activations
    worst = 0.0
    for step in range(args.steps + 1):
        q_lens = lengths if step == 0 else [1] * len(lengths)
        tokens = sum(q_lens)
        q, k, v = (torch.randn((tokens, heads, HEAD_DIM), generator=generator)
                   .to(torch.bfloat16).to(device) for heads in (QO_HEADS, KV_HEADS, KV_HEADS))
        mine = shard.forward(q_lens, q, k, v)
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        gathered = torch.cat(parts, dim=1)  # heads in rank order: the TP 1 head order
        if rank == 0:
            reference = whole.forward(q_lens, q, k, v).float()
            error = ((gathered.float() - reference).norm() / reference.norm()).item()
            worst = max(worst, error)
            print(f"step {step} ({'prefill' if step == 0 else 'decode'}, {tokens} tokens): "
                  f"TP {world} vs TP 1 rel L2 {error:.2e}", flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    if rank == 0:
        print(f"{args.backend} on {world} x {args.device}: worst rel L2 {worst:.2e} "
              f"({'ok' if worst <= 1e-3 else 'FAILED'})")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if rank != 0 or worst <= 1e-3 else 1)


if __name__ == "__main__":
    main()
