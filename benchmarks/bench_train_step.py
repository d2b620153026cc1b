"""One DeepSpeed training step of a HYV3 model on packed memory-writer segments: tokens/s, FLOP/s and
MFU against the dense-matmul peak measured in the same run, per MoE experts implementation and with
gradient checkpointing on and off.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_train_step.py                 # CPU, tiny_teacher, ~3-6 min on 2 busy cores
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_train_step.py --profile       # + torch.profiler of one step
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_train_step.py --micro         # CI size: tiny, 1 step, 1 config
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_train_step.py --gpu           # bench_1b_active, bf16, CUDA
    ... --loss opd                                                                    # OPD items instead of PPO

The step is the RL hot path: PPO items (rollout logprobs, advantages) with **routing replay** (routes
ride along in the packed rows; forward and backward run inside `RoutingController.replay`, as
engine.py does), the chunked loss head, `hymem_segments` attention, the real `Trainer` (DeepSpeed
engine, torch AdamW, grad clip). `--loss opd` trains OPD items (teacher top-50, no routes) instead.
ZeRO stage 0 by default (what the CPU demo runs; on one rank ZeRO-3 partitions nothing and only adds
its hooks, see bench_zero_stage_cpu.py); `--zero-stage 3` for the report's setting.

Segments: the memory-writer mix of bench_packing.py (prompts ~1.5k, responses ~200 tokens; divided by
`--scale` on CPU), packed first-fit into rows of `--capacity` tokens, `--tokens` real tokens a step.

FLOPs (model FLOPs, see train_step_lib.py): 6 * (A - V*H) * T + 6 * V*H * N + 6 * layers * heads *
head_dim * sum_i L_i^2, with A the active non-embedding parameters, T real tokens, N loss positions,
L_i segment lengths; padding and checkpoint recomputation are not counted. MFU = achieved FLOP/s /
the best [n, n] @ [n, n] matmul FLOP/s of the step's dtype on the same device, measured at the start
and at the end of this run (the peak printed is the higher). Every config runs on the same live
model, round-robin after `--warmup` untimed rounds; the step time is the median of `--steps`.
Experts implementations HYV3 supports (transformers' `@use_experts_implementation`): eager (a Python
loop over hit experts), grouped_mm (sort by expert, torch grouped GEMM), batched_mm (per-token bmm on
gathered expert weights), plus any other registered one (deepgemm, sonicmoe): one that fails a probe
forward+backward on this device prints why instead of a number.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from hymem_train.trainer.config import LossConfig, PackingConfig, TrainerConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _fmt(x: float) -> str:
    for unit, s in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= s:
            return f"{x / s:.2f} {unit}"
    return f"{x:.2f} "


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="CUDA, bench_1b_active, bf16, report-scale rows")
    ap.add_argument("--micro", action="store_true", help="CI size: tiny preset, 1 step, grouped_mm, ckpt off")
    ap.add_argument("--preset", default=None, help="default: tiny_teacher (CPU), bench_1b_active (--gpu)")
    ap.add_argument("--loss", default="ppo", choices=["ppo", "opd"])
    ap.add_argument("--tokens", type=int, default=None, help="real tokens per step (CPU 4096, GPU 65536)")
    ap.add_argument("--capacity", type=int, default=None, help="packed row length (CPU 4096, GPU 16384)")
    ap.add_argument("--scale", type=int, default=None, help="segment length divisor (CPU 16, GPU 1)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--experts", nargs="+", default=None, help="default: every registered option")
    ap.add_argument("--grad-ckpt", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--matmul-n", type=int, default=None, help="peak matmul size (CPU 1024, GPU 8192)")
    ap.add_argument(
        "--profile", action="store_true", help="torch.profiler over one more step of the fastest config"
    )
    ap.add_argument("--profile-rows", type=int, default=15)
    args = ap.parse_args(argv)
    if args.micro:
        args.preset = args.preset or "tiny"
        args.tokens, args.capacity = args.tokens or 256, args.capacity or 256
        args.steps, args.warmup = 1, 0
        args.experts = args.experts or ["grouped_mm"]
        args.grad_ckpt = ["off"]
        args.matmul_n = args.matmul_n or 256
    gpu = args.gpu
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: no CUDA device visible")
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    preset = args.preset or ("bench_1b_active" if gpu else "tiny_teacher")
    tokens = args.tokens or (65_536 if gpu else 4096)
    capacity = args.capacity or (16_384 if gpu else 4096)
    scale = args.scale or (1 if gpu else 16)
    matmul_n = args.matmul_n or (8192 if gpu else 1024)

    import train_step_lib as lib

    from hymem_train.models.presets import build_model, count_params, make_config
    from hymem_train.trainer.engine import Trainer
    from hymem_train.trainer.packing import plan_step

    t_start = time.perf_counter()
    peak0 = lib.matmul_peak(device, dtype, matmul_n)
    config = make_config(preset)
    pc = count_params(config)
    packing = PackingConfig(num_tokens_per_micro_batch=capacity, pad_to_multiple=64)
    items = lib.make_step_items(config, tokens, capacity, kind=args.loss, scale=scale, seed=0)
    [micro_batches] = plan_step(items, packing, args.loss, world_size=1)
    fl = lib.step_flops(config, micro_batches)
    cfg = TrainerConfig(
        lr=5e-6,
        zero_stage=args.zero_stage,
        precision="bf16" if gpu else "fp32",
        gradient_checkpointing="on" in args.grad_ckpt,
        routing_replay=args.loss == "ppo",
        loss=LossConfig(kind=args.loss),
        packing=packing,
    )
    model = build_model(config, seed=0)  # fp32 master weights; DeepSpeed casts for bf16
    trainer = Trainer(cfg, model)

    def step(mbs):
        return trainer.train_step(mbs)

    experts = args.experts or lib.available_experts_implementations()
    gcs = [g == "on" for g in args.grad_ckpt]
    row = max(int(mb.input_ids_1T.shape[1]) for mb in micro_batches)
    limit = torch.cuda.mem_get_info()[0] / 2 if gpu else 8 * 2**30
    skip = {"batched_mm": why} if (why := lib.batched_mm_skip_reason(config, row, dtype, limit)) else {}
    results = lib.measure_configs(
        model,
        step,
        micro_batches,
        experts,
        gcs,
        args.warmup,
        args.steps,
        device,
        log=lambda *_: None,
        skip=skip,
    )
    peak1 = lib.matmul_peak(device, dtype, matmul_n)
    peak = max(peak0, peak1)

    dt = str(dtype).removeprefix("torch.")
    print(
        f"device {device.type}{f' ({torch.cuda.get_device_name()})' if gpu else f', {torch.get_num_threads()} threads'}, "
        f"{dt}, DeepSpeed ZeRO-{args.zero_stage}, loss {args.loss}"
        f"{' + routing replay' if args.loss == 'ppo' else ''}, chunked head, hymem_segments attention"
    )
    print(
        f"model {preset}: active {pc.active / 1e6:.2f}M (non-embedding {pc.active_non_embedding / 1e6:.2f}M), "
        f"total {pc.total / 1e6:.2f}M; {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_experts} experts top-{config.num_experts_per_tok}, vocab {config.vocab_size}"
    )
    print(
        f"step: {fl.segments} segments, {fl.real_tokens} real tokens in {len(micro_batches)} row(s) of "
        f"<= {capacity} (padding {1 - fl.real_tokens / fl.row_tokens:.1%}), {fl.loss_positions} loss positions"
    )
    print(
        f"model FLOPs per step: {_fmt(fl.total)}FLOP (6*(A-VH)*T {_fmt(fl.dense)}, "
        f"6*VH*N {_fmt(fl.head)}, attention {_fmt(fl.attention)})"
    )
    print(
        f"dense matmul peak ({dt}, {matmul_n}^3, best of 3x5): {_fmt(peak)}FLOP/s "
        f"(start {_fmt(peak0)}, end {_fmt(peak1)})"
    )
    base = {r.grad_ckpt: r.median for r in results if r.experts == "eager" and not r.error}
    head = f"| experts | grad ckpt | step s (median of {args.steps}) | tokens/s | FLOP/s | MFU | vs eager |"
    if gpu:
        head += " peak mem GiB |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    best = None
    for r in results:
        gc = "on" if r.grad_ckpt else "off"
        if r.error:
            what = r.error if r.error.startswith("skipped") else f"unavailable on {device.type}: {r.error}"
            print(f"| {r.experts} | {gc} | {what} |")
            continue
        s = r.median
        mfu = fl.total / s / peak
        vs = f"{base[r.grad_ckpt] / s:.2f}x" if r.grad_ckpt in base else "-"
        row = f"| {r.experts} | {gc} | {s:.3f} | {fl.real_tokens / s:,.0f} | {_fmt(fl.total / s)}| {mfu:.3f} | {vs} |"
        if gpu:
            row += f" {(r.peak_memory_bytes or 0) / 2**30:.1f} |"
        print(row)
        if best is None or s < best.median:
            best = r
    if best is not None:
        print(
            f"MFU {fl.total / best.median / peak:.3f} (best: {best.experts}, grad ckpt "
            f"{'on' if best.grad_ckpt else 'off'}; {_fmt(fl.total / best.median)}FLOP/s of a measured "
            f"{_fmt(peak)}FLOP/s {dt} matmul peak)"
        )
    else:
        print("MFU n/a: no configuration ran")
    if args.profile and best is not None:
        from torch.profiler import ProfilerActivity, profile

        lib.set_experts(model, best.experts)  # the fastest config: what is left to gain there
        lib.set_gradient_checkpointing(model, best.grad_ckpt)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=acts, record_shapes=True) as prof:
            step(micro_batches)
            lib.sync(device)
        sort = "self_cuda_time_total" if gpu else "self_cpu_time_total"
        what = f"{best.experts}, grad ckpt {'on' if best.grad_ckpt else 'off'}"
        print(f"\nprofile of one step ({what}), top ops by {sort}:")
        print(prof.key_averages().table(sort_by=sort, row_limit=args.profile_rows, max_name_column_width=40))
        print(f"the same, by op and input shapes (top {args.profile_rows}):")
        print(
            prof.key_averages(group_by_input_shape=True).table(
                sort_by=sort,
                row_limit=args.profile_rows,
                max_name_column_width=32,
                max_shapes_column_width=70,
            )
        )
    trainer.close()
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
