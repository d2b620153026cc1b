"""On-paper projection of the report's RL step and OPD stage at 16 x 8 (docs/performance.md, "RL step
profile and the 16x8 cost model"): per phase, the work (from this codebase's measured per-chunk counts
scaled to the report's lengths) over the throughput (published GPU specs and framework numbers, cited
in the doc). Prints the markdown tables the doc shows.

    .venv/bin/python scripts/cost_model.py                      # measured counts from runs/demo/{rl,opd}
    .venv/bin/python scripts/cost_model.py --rl RUN --opd RUN

Every input is one of: MEASURED (a run's metrics.jsonl / bank_sizes.jsonl / config.yaml), MODEL (the
hy_memory_30b_a3b preset, hymem_train/models/presets.py), PLAN (configs/exp/hy_memory_*.yaml and the
preflight in docs/cluster.md), CITED (a published number; the doc gives the URL) or ASSUMED (named
ASSUMED_*, an assumption stated in the doc).
"""

import argparse
import json
import math
import sys
from pathlib import Path

from hymem_train.callbacks.step_profile import breakdown, mean_row, read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: hymem_train

# CITED: dense BF16 peak and HBM bandwidth per GPU
GPUS = {
    "H20": dict(peak=148e12, bw=4.0e12, seqs_reader=117),  # seqs_reader: PLAN (preflight, 8,192-token seqs)
    "H200": dict(peak=989e12, bw=4.8e12, seqs_reader=212),
}
# PLAN: the report's batch and budgets (configs/exp/hy_memory_rl.yaml, hy_memory_opd.yaml)
RL_WINDOWS, RL_ROLLOUTS, OPD_ROWS, OPD_ROLLOUTS, CHUNKS = 64, 8, 64, 2, 5
PROMPT, RESPONSE = 28_672, 4_096
# PLAN: split placement (docs/cluster.md): 64 trainer GPUs, policy 8 x TP4, teacher 8 x TP4, reader and
# judge 8 x TP2 each; the reader's prompt budget is its max_model_len, replies reward.*.max_tokens
TRAIN_GPUS, POLICY_REPLICAS, POLICY_TP, TEACHER_GPUS, RJ_REPLICAS, RJ_TP = 64, 8, 4, 32, 8, 2
RJ_MAX_PROMPT, READER_REPLY, JUDGE_REPLY = 8_192, 128, 256
# ASSUMED: reader / judge prompts (a question with search_k retrieved memories; a rubric, reference and
# answer) are not measured yet (reward/*_prompt_tokens is logged from now on): 2,048 tokens, up to the cap
ASSUMED_RJ_PROMPT = 2_048
GATEWAY_MAX_BATCH = 16  # PLAN: configs/gateway/default.yaml, not overridden by hy_memory_*
# CITED: verl's measured weight sync of Qwen3-30B-A3B on H20 (checkpoint-engine on / off)
SYNC_S = (4.38, 15.76)
# CITED: Qwen3-30B-A3B (the same shape as hy_memory_30b_a3b) on one H20, SGLang BF16, batch 1, 1 prompt
# token + 2,048 generated at 137.18 tokens/s: the small-batch decode step
SMALL_BATCH_STEP_H20 = 2049 / 137.18 / 2048
ASSUMED_DECODE_BW_FRACTION = 0.6  # of peak HBM bandwidth reached by batched decode
ASSUMED_PREFILL_MFU = 0.5  # vLLM prefill of long prompts, compute-bound
ASSUMED_TRAIN_MFU = (0.31, 0.40)  # verl's range on H20 (CITED), taken for our trainer on both GPUs


def model_shape() -> dict:
    """MODEL: parameter groups of hy_memory_30b_a3b."""
    from hymem_train.models.presets import count_params, make_config

    c = make_config("hy_memory_30b_a3b")
    n = count_params(c)
    expert = 3 * c.hidden_size * c.moe_intermediate_size
    experts = expert * c.num_experts * c.num_hidden_layers
    return dict(
        total=n.total,
        flop_params=n.active_non_embedding,
        embed=c.vocab_size * c.hidden_size,
        experts=experts,
        E=c.num_experts,
        k=c.num_experts_per_tok,
        L=c.num_hidden_layers,
        qdim=c.num_attention_heads * c.head_dim,
        kv_bytes=2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2,
    )


def measured(rl_dir: Path, opd_dir: Path) -> dict:
    """MEASURED: per-chunk counts of the CPU runs (steps without a held-out evaluation)."""

    def one(d: Path, rollouts_key: tuple[str, str]) -> dict:
        cfg = _config_numbers(d / "config.yaml")
        steps = [s for s in breakdown(read_metrics(d / "metrics.jsonl")) if not s.has_eval]
        m = mean_row(steps, "mean").moved
        sizes = [json.loads(ln) for ln in (d / "bank_sizes.jsonl").read_text().splitlines() if ln.strip()]
        chunks = sum(len(s["size_tokens"]) for s in sizes) / len(sizes)
        rollouts = cfg[rollouts_key[0]] * cfg[rollouts_key[1]]
        out = dict(steps=len(steps), rollouts=rollouts, chunks=chunks)
        out["in_flight"] = min(cfg["num_workers"], rollouts)
        out["calls_per_chunk"] = m["llm_calls"] / (rollouts * chunks)
        out["prompt_per_call"] = m["prompt_tokens"] / m["llm_calls"]
        out["completion_per_call"] = m["completion_tokens"] / m["llm_calls"]
        out["occupancy"] = m.get("batch_occupancy", float("nan"))
        if "reader_calls" in m:
            out["reader_per_chunk"] = m["reader_calls"] / (rollouts * chunks)
            out["judge_per_chunk"] = m["judge_calls"] / (rollouts * chunks)
        return out

    return dict(
        rl=one(rl_dir, ("num_windows_per_step", "num_rollouts_per_window")),
        opd=one(opd_dir, ("num_rows_per_step", "num_rollouts_per_row")),
    )


def _config_numbers(path: Path) -> dict:
    import yaml

    cfg = yaml.safe_load(path.read_text())
    flat = {}
    for sec in ("rl", "opd", "rollout"):
        flat.update({k: v for k, v in (cfg.get(sec) or {}).items() if isinstance(v, int | float)})
    return flat


def fwd_flops_per_token(m: dict, ctx: float) -> float:
    """2 x FLOP-bearing params + causal attention (QK^T and AV) over `ctx` previous tokens on average."""
    return 2 * m["flop_params"] + 4 * m["L"] * m["qdim"] * ctx


def decode_bytes(m: dict, batch: float, ctx: float, tp: int, kv_scale: float = 1.0) -> tuple[float, float]:
    """Bytes one GPU of a replica reads per decode step: the weights `batch` tokens touch, and their KV
    (`kv_scale` 0.5: an FP8 KV cache)."""
    touched = 1 - (1 - m["k"] / m["E"]) ** batch  # share of a layer's experts some token routes to
    weights = (m["total"] - m["embed"] - m["experts"] + m["experts"] * touched) * 2 / tp
    return weights, batch * ctx * m["kv_bytes"] * kv_scale / tp


def decode_step_s(m: dict, gpu: dict, batch: float, ctx: float, tp: int, kv_scale: float = 1.0) -> float:
    """Memory-bound decode step of one replica."""
    return sum(decode_bytes(m, batch, ctx, tp, kv_scale)) / (gpu["bw"] * ASSUMED_DECODE_BW_FRACTION)


def _gb(m: dict, batch: float) -> str:
    w, kv = decode_bytes(m, batch, PROMPT + RESPONSE / 2, POLICY_TP)
    return f"weights {w / 1e9:.1f} GB + KV {kv / 1e9:.1f} GB"


def _rollout(m: dict, gpu: dict, meas: dict, rollouts: int) -> tuple:
    """The policy's side of a step (both stages): calls, sequences per replica, policy GPUs, prefill FLOP
    and seconds, one decode step's seconds, and the decode seconds of the step."""
    calls = rollouts * CHUNKS * meas["calls_per_chunk"]
    per_replica = rollouts / POLICY_REPLICAS
    pol_gpus = POLICY_REPLICAS * POLICY_TP
    pf = calls * PROMPT * fwd_flops_per_token(m, PROMPT / 2)
    t_pf = pf / (pol_gpus * gpu["peak"] * ASSUMED_PREFILL_MFU)
    step = decode_step_s(m, gpu, per_replica, PROMPT + RESPONSE / 2, POLICY_TP)
    return calls, per_replica, pol_gpus, pf, t_pf, step, CHUNKS * meas["calls_per_chunk"] * RESPONSE * step


def rl_step(m: dict, gpu: dict, meas: dict) -> list[tuple[str, str, float, float]]:
    """(phase, arithmetic, low s, high s) for one RL step."""
    rollouts = RL_WINDOWS * RL_ROLLOUTS
    calls, per_replica, pol_gpus, pf, t_pf, step, t_dec = _rollout(m, gpu, meas, rollouts)
    rows = [
        (
            "rollout prefill",
            f"{calls:,.0f} calls x {PROMPT:,} tok x {fwd_flops_per_token(m, PROMPT / 2) / 1e9:.1f} GFLOP "
            f"= {pf:.3g} FLOP / ({pol_gpus} GPUs x {gpu['peak'] / 1e12:.0f} TFLOP/s x {ASSUMED_PREFILL_MFU})",
            t_pf,
            t_pf,
        ),
        (
            "rollout decode",
            f"{CHUNKS} waves x {RESPONSE:,} steps x {1e3 * step:.1f} ms ({per_replica:.0f} seqs per replica, "
            f"{_gb(m, per_replica)} per GPU per step: {per_replica / step:,.0f} tok/s per replica)",
            t_dec,
            t_dec,
        ),
    ]
    for who, r in (("reader", READER_REPLY), ("judge", JUDGE_REPLY)):
        n = rollouts * CHUNKS * meas[f"{who}_per_chunk"]
        b = min(n / RJ_REPLICAS, gpu["seqs_reader"])
        ts = []
        for p in (ASSUMED_RJ_PROMPT, RJ_MAX_PROMPT):
            f = n * p * fwd_flops_per_token(m, p / 2)
            t_p = f / (RJ_REPLICAS * RJ_TP * gpu["peak"] * ASSUMED_PREFILL_MFU)
            ts.append(t_p + math.ceil(n / RJ_REPLICAS / b) * r * decode_step_s(m, gpu, b, p + r / 2, RJ_TP))
        rows.append(
            (
                f"reward: {who}",
                f"{n:,.0f} calls x {ASSUMED_RJ_PROMPT:,}-{RJ_MAX_PROMPT:,} tok prefill on "
                f"{RJ_REPLICAS * RJ_TP} GPUs + <= {r} decode steps per wave of {b:.0f}",
                *ts,
            )
        )
    tok = calls * (PROMPT + RESPONSE)
    tf = tok * 3 * fwd_flops_per_token(m, (PROMPT + RESPONSE) / 2)
    lo, hi = (tf / (TRAIN_GPUS * gpu["peak"] * mfu) for mfu in reversed(ASSUMED_TRAIN_MFU))
    rows.append(
        (
            "train",
            f"{tok / 1e6:.1f}M tok x {tf / tok / 1e9:.1f} GFLOP = {tf:.3g} FLOP / ({TRAIN_GPUS} GPUs x "
            f"{gpu['peak'] / 1e12:.0f} TFLOP/s x MFU {ASSUMED_TRAIN_MFU[1]}-{ASSUMED_TRAIN_MFU[0]})",
            lo,
            hi,
        )
    )
    rows.append(("sync", f"{m['total'] * 2 / 1e9:.1f} GB bf16; verl's measured 30B-A3B sync", *SYNC_S))
    return rows


def opd_step(m: dict, gpu: dict, meas: dict) -> list[tuple[str, str, float, float]]:
    rollouts = OPD_ROWS * OPD_ROLLOUTS
    calls, per_replica, pol_gpus, pf, t_pf, step, t_dec = _rollout(m, gpu, meas, rollouts)
    tok = calls * (PROMPT + RESPONSE)
    tt = tok * fwd_flops_per_token(m, (PROMPT + RESPONSE) / 2)
    t_teacher = tt / (TEACHER_GPUS * gpu["peak"] * ASSUMED_PREFILL_MFU)
    tf = 3 * tt
    lo, hi = (tf / (TRAIN_GPUS * gpu["peak"] * mfu) for mfu in reversed(ASSUMED_TRAIN_MFU))
    return [
        (
            "rollout prefill",
            f"{calls:,.0f} calls x {PROMPT:,} tok = {pf:.3g} FLOP / ({pol_gpus} GPUs x MFU {ASSUMED_PREFILL_MFU})",
            t_pf,
            t_pf,
        ),
        (
            "rollout decode",
            f"{CHUNKS} waves x {RESPONSE:,} steps x {1e3 * step:.1f} ms ({per_replica:.0f} seqs per replica, "
            f"{_gb(m, per_replica)} per GPU per step)",
            t_dec,
            t_dec,
        ),
        (
            "teacher top-50",
            f"{tok / 1e6:.1f}M tok prefill = {tt:.3g} FLOP / ({TEACHER_GPUS} GPUs x MFU {ASSUMED_PREFILL_MFU})",
            t_teacher,
            t_teacher,
        ),
        (
            "train",
            f"{tok / 1e6:.1f}M tok = {tf:.3g} FLOP / ({TRAIN_GPUS} GPUs x MFU {ASSUMED_TRAIN_MFU[1]}-{ASSUMED_TRAIN_MFU[0]})",
            lo,
            hi,
        ),
        ("sync", "verl's measured 30B-A3B sync", *SYNC_S),
    ]


def as_shipped_decode(m: dict, gpu: dict, meas: dict, rollouts: int) -> tuple[float, str]:
    """Decode with the gateway's blocking batcher at max_batch_size 16: ceil(in flight / 16) batches per
    wave, each until its longest call ends, 16 / replicas sequences per replica."""
    batches = math.ceil(rollouts / GATEWAY_MAX_BATCH)
    per_replica = GATEWAY_MAX_BATCH / POLICY_REPLICAS
    # ASSUMED: the small-batch floor scales with HBM bandwidth
    floor = SMALL_BATCH_STEP_H20 * GPUS["H20"]["bw"] / gpu["bw"]
    step = max(decode_step_s(m, gpu, per_replica, PROMPT + RESPONSE / 2, POLICY_TP), floor)
    t = CHUNKS * meas["calls_per_chunk"] * batches * RESPONSE * step
    return t, f"{CHUNKS} waves x {batches} batches x {RESPONSE:,} steps x {1e3 * step:.2f} ms"


def levers(m: dict, gpu: dict, meas: dict, rows: list) -> str:
    """What the step would take with each lever, from the same arithmetic (optimistic-pessimistic)."""
    lo, hi = sum(r[2] for r in rows), sum(r[3] for r in rows)
    by = {r[0]: r for r in rows}
    shipped, _ = as_shipped_decode(m, gpu, meas, RL_WINDOWS * RL_ROLLOUTS)
    dec = by["rollout decode"][2]
    ctx, b = PROMPT + RESPONSE / 2, RL_WINDOWS * RL_ROLLOUTS / POLICY_REPLICAS
    fp8 = dec * decode_step_s(m, gpu, b, ctx, POLICY_TP, 0.5) / decode_step_s(m, gpu, b, ctx, POLICY_TP)
    gen = [sum(by[k][i] for k in by if k.startswith(("rollout", "reward"))) for i in (2, 3)]
    upd = [by["train"][i] + by["sync"][i] for i in (2, 3)]
    return (
        "\n".join(
            [
                f"- as shipped (gateway.max_batch_size {GATEWAY_MAX_BATCH}, blocking batcher): {lo - dec + shipped:,.0f}-"
                f"{hi - dec + shipped:,.0f} s (rollout decode {shipped:,.0f} s instead of {dec:,.0f} s)",
                f"- FP8 KV cache (ASSUMED: KV bytes halved, same bandwidth fraction): decode {fp8:,.0f} s, step "
                f"{lo - dec + fp8:,.0f}-{hi - dec + fp8:,.0f} s",
                f"- one-step off-policy overlap (rollout + reward of step k+1 during train + sync of step k): "
                f"{max(gen[0], upd[0]):,.0f}-{max(gen[1], upd[1]):,.0f} s",
            ]
        )
        + "\n"
    )


def table(title: str, rows: list, total_extra: str = "") -> str:
    lo, hi = sum(r[2] for r in rows), sum(r[3] for r in rows)
    out = [f"{title}", "", "| phase | arithmetic | seconds | share of step |", "|---|---|---|---|"]
    for name, how, a, b in rows:
        s = f"{a:,.0f}" if abs(a - b) < 0.5 else f"{a:,.0f}-{b:,.0f}"
        share = f"{100 * a / lo:.0f}-{100 * b / hi:.0f}%"  # in the optimistic and the pessimistic total
        out.append(f"| {name} | {how} | {s} | {share} |")
    out.append(f"| **step** | {total_extra} | **{lo:,.0f}-{hi:,.0f}** ({lo / 60:.1f}-{hi / 60:.1f} min) | |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rl", default="runs/demo/rl", type=Path)
    ap.add_argument("--opd", default="runs/demo/opd", type=Path)
    args = ap.parse_args()
    m = model_shape()
    meas = measured(args.rl, args.opd)
    print("MEASURED:", json.dumps(meas, indent=1))
    print(
        f"MODEL: total {m['total'] / 1e9:.2f}B, FLOP-bearing active {m['flop_params'] / 1e9:.2f}B, "
        f"experts {m['experts'] / 1e9:.2f}B, KV {m['kv_bytes']} B/token (all GPUs)\n"
    )
    for name, gpu in GPUS.items():
        rl = rl_step(m, gpu, meas["rl"])
        print(table(f"RL step, {name}", rl))
        tok = RL_WINDOWS * RL_ROLLOUTS * CHUNKS * meas["rl"]["calls_per_chunk"] * (PROMPT + RESPONSE)
        lo, hi = sum(r[2] for r in rl), sum(r[3] for r in rl)
        print(f"end to end: {tok / hi / 128:,.0f}-{tok / lo / 128:,.0f} trained tokens/s/GPU over 128 GPUs")
        t, how = as_shipped_decode(m, gpu, meas["rl"], RL_WINDOWS * RL_ROLLOUTS)
        print(f"as shipped (gateway.max_batch_size {GATEWAY_MAX_BATCH}): rollout decode {how} = {t:,.0f} s")
        print(levers(m, gpu, meas["rl"], rl))
        opd = opd_step(m, gpu, meas["opd"])
        lo, hi = sum(r[2] for r in opd), sum(r[3] for r in opd)
        print(table(f"OPD step, {name}", opd))
        print(f"375 OPD steps: {375 * lo / 3600:.1f}-{375 * hi / 3600:.1f} h")
        t, how = as_shipped_decode(m, gpu, meas["opd"], OPD_ROWS * OPD_ROLLOUTS)
        dec = opd[1][2]
        print(
            f"as shipped: OPD rollout decode {how} = {t:,.0f} s; 375 steps "
            f"{375 * (lo - dec + t) / 3600:.1f}-{375 * (hi - dec + t) / 3600:.1f} h\n"
        )
