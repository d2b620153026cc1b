"""Peak memory and time of the chunked OPD / PPO loss paths against the naive full-logits path.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_losses.py            # 5 child runs, each ~1 min on 2 cores when the box is quiet
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_losses.py --long-kinds opd ppo   # + PPO at T=32k
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_losses.py --tokens 1024 --skip-long   # quick look

Shapes follow the report: hidden 2048, vocab 120,832, fp32 on CPU. Each case runs forward + backward
of `loss(hidden_TH, lm_head_VH)` once, in its own child process (wall time and process CPU time
are both printed: on a shared box the CPU-time ratio is the steadier one), so its peak resident memory
(`ru_maxrss` minus the resident size after the inputs were built) belongs to that case alone.

- T=4,096 with every position a loss position: ours vs naive, printed as ratios (aim: memory
  <= 5% of naive, time <= 1.5x naive).
- T=32,768 (28,672 prompt + 4,096 response) with loss positions = the response: ours only (OPD by
  default, the heavier path: it also needs the top-50 logits and the entropy); the
  naive path would hold 32,768 x 120,832 fp32 logits (15.8 GB) before selecting positions.

Both paths must produce the lm_head weight gradient (one V x H fp32 buffer, 0.99 GB here; under
ZeRO-3 it is partitioned). It is inside both peaks; the table also prints the peak without it,
which is the memory the loss path itself adds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(
    kind: str, path: str, T: int, N: int, H: int, V: int, K: int, threads: int, blocks: tuple[int, int]
) -> None:
    import torch

    from hymem_train.trainer.chunked_head import chunked_head
    from hymem_train.trainer.losses import opd_token_loss, ppo_token_loss

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    hidden_TH = (torch.randn(T, H, generator=g) * 0.02).requires_grad_()
    weight_VH = (torch.randn(V, H, generator=g) * 0.02).requires_grad_()
    pos_N = torch.arange(T - N, T)  # loss positions: the response at the end of the row
    if kind == "opd":
        ids_NK = torch.randint(0, V, (N, K), generator=g)
        teacher_lp_NK = torch.log_softmax(torch.randn(N, K + 1, generator=g), -1)[:, :K].contiguous()
    else:
        ids_NK = torch.randint(0, V, (N, 1), generator=g)
        old_N = torch.full((N,), -11.7)
        adv_N = torch.randn(N, generator=g)
    base = _rss_bytes()
    t0 = time.perf_counter()
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    if path == "naive":
        # what a plain HF forward does: logits for every position, then select the loss positions
        z_TV = hidden_TH @ weight_VH.T
        logp_NV = torch.log_softmax(z_TV[pos_N].float(), -1)
        if kind == "opd":
            ent_N = -(logp_NV.exp() * logp_NV).sum(-1)
            # logp is already normalised: pass lse = 0 and the gathered log-probs
            loss = opd_token_loss(torch.zeros(N), logp_NV.gather(1, ids_NK), teacher_lp_NK, ent_N).mean()
        else:
            loss = ppo_token_loss(logp_NV.gather(1, ids_NK)[:, 0], old_N, adv_N)[0].mean()
    else:
        h_NH = hidden_TH[pos_N]
        if kind == "opd":
            lse_N, zk_NK, ent_N = chunked_head(
                h_NH, weight_VH, ids_NK, block_rows=blocks[0], block_vocab=blocks[1]
            )
            loss = opd_token_loss(lse_N, zk_NK, teacher_lp_NK, ent_N).mean()
        else:
            lse_N, zt_N1, _ = chunked_head(
                h_NH, weight_VH, ids_NK, block_rows=blocks[0], block_vocab=blocks[1], with_entropy=False
            )
            loss = ppo_token_loss(zt_N1[:, 0] - lse_N, old_N, adv_N)[0].mean()
    loss.backward()
    seconds = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    peak = c1.ru_maxrss * 1024
    print(
        json.dumps(
            {"peak_extra_bytes": peak - base, "seconds": seconds, "cpu_seconds": cpu, "loss": float(loss)}
        )
    )


def _run_case(args: argparse.Namespace, kind: str, path: str, T: int, N: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, path, str(T), str(N)]
    cmd += ["--hidden", str(args.hidden), "--vocab", str(args.vocab), "--topk", str(args.topk)]
    cmd += ["--threads", str(args.threads), "--block-rows", str(args.block_rows)]
    cmd += ["--block-vocab", str(args.block_vocab)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=4, metavar=("KIND", "PATH", "T", "N"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--tokens", type=int, default=4096, help="T of the ours-vs-naive cases (all loss positions)"
    )
    ap.add_argument("--long-tokens", type=int, default=32768, help="T of the ours-only case")
    ap.add_argument("--long-loss", type=int, default=4096, help="loss positions of the ours-only case")
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--kinds", nargs="+", default=["opd", "ppo"], choices=["opd", "ppo"])
    ap.add_argument(
        "--long-kinds", nargs="+", default=["opd"], choices=["opd", "ppo"], help="ours-only T=32k"
    )
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=120832)
    ap.add_argument("--topk", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=4096)
    ap.add_argument("--block-vocab", type=int, default=2048)
    args = ap.parse_args()
    if args.child:
        kind, path, T, N = args.child
        _child(
            kind,
            path,
            int(T),
            int(N),
            args.hidden,
            args.vocab,
            args.topk,
            args.threads,
            (args.block_rows, args.block_vocab),
        )
        return
    gib = 1024**3
    grad_w = args.vocab * args.hidden * 4
    t_start = time.perf_counter()
    print(
        f"vocab {args.vocab}, hidden {args.hidden}, fp32, {args.threads} threads, tiles {args.block_rows} x {args.block_vocab}"
    )
    print(f"lm_head weight gradient (inside every peak): {grad_w / gib:.2f} GiB")
    for kind in args.kinds:
        naive = _run_case(args, kind, "naive", args.tokens, args.tokens)
        ours = _run_case(args, kind, "ours", args.tokens, args.tokens)
        n_mem, o_mem = naive["peak_extra_bytes"], ours["peak_extra_bytes"]
        print(
            f"{kind} T={args.tokens}: naive {n_mem / gib:.2f} GiB {naive['seconds']:.1f} s "
            f"(cpu {naive['cpu_seconds']:.0f} s) | ours {o_mem / gib:.2f} GiB {ours['seconds']:.1f} s "
            f"(cpu {ours['cpu_seconds']:.0f} s) | "
            f"memory ratio {o_mem / n_mem:.3f} (without weight grad {(o_mem - grad_w) / (n_mem - grad_w):.3f}) | "
            f"time ratio {ours['seconds'] / naive['seconds']:.2f} "
            f"(cpu time {ours['cpu_seconds'] / naive['cpu_seconds']:.2f}) | "
            f"loss diff {abs(ours['loss'] - naive['loss']):.2e}"
        )
    if not args.skip_long:
        naive_logits = args.long_tokens * args.vocab * 4
        for kind in args.long_kinds:
            ours = _run_case(args, kind, "ours", args.long_tokens, args.long_loss)
            print(
                f"{kind} T={args.long_tokens} ({args.long_loss} loss positions), ours only: "
                f"{ours['peak_extra_bytes'] / gib:.2f} GiB {ours['seconds']:.1f} s "
                f"(naive fp32 logits alone would be {naive_logits / gib:.1f} GiB)"
            )
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
