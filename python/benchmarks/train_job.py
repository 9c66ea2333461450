"""An ordinary PyTorch training job, to run unchanged with and without libpeerlink_nccl.so: a small
decoder-only transformer on synthetic tokens (fixed seed), under DDP or FSDP (FSDP2's
`fully_shard`), one process per GPU as torchrun starts them. Nothing here knows of peerlink:

    torchrun --nproc-per-node 2 python/benchmarks/train_job.py --mode ddp --out ddp-nccl.json
    LD_PRELOAD=$(python3 -c 'import peerlink; print(peerlink.nccl_library())') \\
        PEERLINK_NCCL_SERVE=all PEERLINK_NCCL_DEBUG=INFO \\
        torchrun --nproc-per-node 2 python/benchmarks/train_job.py --mode ddp --out ddp-peerlink.json

Rank 0 writes one JSON document: the layout, the parameter count, the time of every step after the
warm-up (measured with CUDA events around each step, the GPU synchronised at its end), and the loss
of every step; the losses of two runs are compared by `--compare A B`, which says how far apart
they are (summing gradients in another order changes the last bits, and training amplifies them).
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--steps", type=int, default=30, help="steps measured, after the warm-up")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--nondeterministic",
        dest="deterministic",
        action="store_false",
        help="let PyTorch pick nondeterministic kernels (faster; then two runs differ anyway)",
    )
    p.add_argument("--out", help="where rank 0 writes its JSON document")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two documents' losses")
    return p.parse_args()


def wrapped(model: nn.Module, mode: str, device: torch.device) -> nn.Module:
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def batches(args: argparse.Namespace, rank: int, device: torch.device):
    """Synthetic tokens, the same on every run: rank r's stream is seeded by (seed, r)."""
    generator = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + rank)
    while True:
        tokens = torch.randint(
            args.vocab, (args.batch, args.context + 1), generator=generator
        ).to(device)
        yield tokens[:, :-1], tokens[:, 1:]


def train(args: argparse.Namespace) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.deterministic:
        # Run to run, the same bits but for the collectives: cuBLAS's workspace fixed, no atomics
        # in the backward passes (embedding; attention: cuDNN's, flash and the memory-efficient
        # kernels all accumulate with atomics there, so attention runs as plain matrix products).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = Model(args.vocab, args.width, args.layers, args.heads, args.context).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    model = wrapped(model, args.mode, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    data = batches(args, rank, device)
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        inputs, targets = next(data)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        # The loss averaged over ranks, as a job would log it (outside the timed step).
        logged = loss.detach().clone()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(start.elapsed_time(end) * 1000.0)
        dist.all_reduce(logged)
        losses.append(logged.item() / world)
    if rank == 0:
        times.sort()
        document = {
            # A schema and no "source": a document of this script, not of peerlink's CLI.
            "schema": "peerlink.train-job/1",
            "mode": args.mode,
            "world": world,
            "parameters": parameters,
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "preloaded": os.environ.get("LD_PRELOAD", ""),
            "args": vars(args),
            "step_us": {
                "median": times[len(times) // 2],
                "min": times[0],
                "max": times[-1],
                "all": times,
            },
            "losses": losses,
        }
        print(
            f"{args.mode} on {world} GPUs, {parameters / 1e6:.0f} M parameters: median step "
            f"{times[len(times) // 2] / 1000:.2f} ms over {len(times)} steps, final loss "
            f"{losses[-1]:.6f}"
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(document, f, indent=1)
    dist.destroy_process_group()


def compare(a: str, b: str) -> None:
    first, second = (json.load(open(path)) for path in (a, b))
    pairs = list(zip(first["losses"], second["losses"]))
    worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in pairs)
    identical = sum(x == y for x, y in pairs)
    ratio = second["step_us"]["median"] / first["step_us"]["median"]
    print(
        f"{len(pairs)} steps: {identical} losses bit-identical, largest relative difference "
        f"{worst:.3g}; final {pairs[-1][0]:.6f} vs {pairs[-1][1]:.6f}; median step "
        f"{first['step_us']['median'] / 1000:.2f} vs {second['step_us']['median'] / 1000:.2f} ms "
        f"({ratio:.3f}x the first's time)"
    )
    if not all(math.isfinite(x) and math.isfinite(y) for x, y in pairs):
        sys.exit("a loss is not finite")


if __name__ == "__main__":
    arguments = parse()
    if arguments.compare:
        compare(*arguments.compare)
    else:
        train(arguments)
