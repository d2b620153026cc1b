"""Packing efficiency and training tokens/s: block-causal packed rows vs plain padded batching.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_packing.py        # ~1-3 min on 2 cores

Segment lengths: a memory-writer mix (one segment per harness LLM call): prompts lognormal around
1.5k tokens (bank dump + chunk, capped at the report's 28,672), responses lognormal around 200
tokens (capped at 4,096). Both layouts see the same segments in the same order.

1. Padding share at the report's scale (pure layout arithmetic): packed rows of 32,768 tokens vs
   batches of `--batch-size` segments padded to the longest one.
2. Tokens/s (real tokens only) of forward + backward of the tiny HYV3 model (sdpa), same run, on
   the same mix scaled down by `--scale` so it fits 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import time

from hymem_train.trainer.config import LossConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hymem_train.segments import Segment  # noqa: E402
from hymem_train.trainer.config import PackingConfig  # noqa: E402
from hymem_train.trainer.packing import TrainItem, padding_share, plan_step  # noqa: E402


def segment_lengths(n: int, seed: int, scale: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    P = np.clip(rng.lognormal(np.log(1500), 0.8, n), 64, 28_672) // scale
    R = np.clip(rng.lognormal(np.log(200), 0.9, n), 8, 4_096) // scale
    return [(max(int(p), 2), max(int(r), 1)) for p, r in zip(P, R, strict=True)]


def make_items(lengths: list[tuple[int, int]], vocab: int) -> list[TrainItem]:
    rng = np.random.default_rng(0)
    return [
        TrainItem(
            Segment(
                f"t{i}",
                0,
                0,
                rng.integers(1, vocab, P).tolist(),
                rng.integers(1, vocab, R).tolist(),
                [0.0] * R,
                "stop",
            )
        )
        for i, (P, R) in enumerate(lengths)
    ]


def padded_batches(lengths: list[tuple[int, int]], batch_size: int) -> list[list[int]]:
    return [list(range(i, min(i + batch_size, len(lengths)))) for i in range(0, len(lengths), batch_size)]


def padded_share(lengths: list[tuple[int, int]], batch_size: int) -> float:
    real = slot = 0
    for b in padded_batches(lengths, batch_size):
        n = [sum(lengths[i]) for i in b]
        real += sum(n)
        slot += max(n) * len(b)
    return 1 - real / slot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-segments", type=int, default=512)
    ap.add_argument("--capacity", type=int, default=32_768)
    ap.add_argument("--batch-size", type=int, default=8, help="segments per padded batch (baseline)")
    ap.add_argument("--scale", type=int, default=16, help="length divisor for the timed tiny-model run")
    ap.add_argument("--timed-segments", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mask", default="segments", help="packed attention: segments | block_causal")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    lengths = segment_lengths(args.num_segments, 0, 1)
    items = make_items([(p, r) for p, r in lengths], vocab=1000)
    plan = plan_step(
        items, PackingConfig(num_tokens_per_micro_batch=args.capacity, pad_to_multiple=64), "sft"
    )[0]
    print(f"{args.num_segments} segments, mean {np.mean([p + r for p, r in lengths]):.0f} tokens")
    print(
        f"padding share @ report scale: packed {padding_share(plan):.4f} "
        f"(vs reserved capacity {padding_share(plan, args.capacity):.4f}) over {len(plan)} rows | "
        f"padded batching (bs {args.batch_size}) {padded_share(lengths, args.batch_size):.4f}"
    )

    from hymem_train.models.presets import build_model, make_config
    from hymem_train.trainer.policy import PolicyLoss

    model = build_model(make_config("tiny", attn_implementation="sdpa"), seed=0)
    baseline = build_model(make_config("tiny", attn_implementation="sdpa"), seed=0)  # plain HF attention
    small = segment_lengths(args.timed_segments, 1, args.scale)
    s_items = make_items(small, model.config.vocab_size)
    cap = args.capacity // args.scale
    s_plan = plan_step(
        s_items, PackingConfig(num_tokens_per_micro_batch=cap, pad_to_multiple=8, mask=args.mask), "sft"
    )[0]
    real = sum(p + r for p, r in small)
    pol = PolicyLoss(model, LossConfig(kind="sft", block_rows=1024, block_vocab=1024), mask_mode=args.mask)

    def run_packed() -> None:
        for mb in s_plan:
            loss, _ = pol(mb)
            loss.backward()

    def run_padded() -> None:
        for b in padded_batches(small, args.batch_size):
            L = max(sum(small[i]) for i in b)
            ids = torch.zeros(len(b), L, dtype=torch.long)
            att = torch.zeros(len(b), L, dtype=torch.long)
            for j, i in enumerate(b):
                seg = s_items[i].segment
                ids[j, : seg.num_tokens] = torch.tensor(seg.input_ids)
                att[j, : seg.num_tokens] = 1
            out = baseline(input_ids=ids, attention_mask=att)
            (out.logits.float().logsumexp(-1) * att).sum().backward()  # comparable head + backward work

    run_packed()  # warm-up both paths once
    run_padded()
    times = {}
    for name, fn in (
        ("packed", run_packed),
        ("padded", run_padded),
        ("packed2", run_packed),
        ("padded2", run_padded),
    ):
        model.zero_grad(set_to_none=True)
        baseline.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        fn()
        times[name] = time.perf_counter() - t0
    tp = real / min(times["packed"], times["packed2"])
    td = real / min(times["padded"], times["padded2"])
    print(
        f"tiny HYV3 fwd+bwd ({args.mask}), {args.timed_segments} segments scaled 1/{args.scale} ({real} real tokens): "
        f"packed {tp:.0f} tok/s ({len(s_plan)} rows of <= {cap}, padding {padding_share(s_plan):.4f}) | "
        f"padded {td:.0f} tok/s (padding {padded_share(small, args.batch_size):.4f}) | ratio {tp / td:.2f}x"
    )


if __name__ == "__main__":
    main()
