"""The prepared GPU check: four measurements on one GPU, one JSON of results.

    scripts/device_check.sh [OUT.json]                                  # on the lent H200 (< 8 min)
    .venv/bin/python benchmarks/device_check.py --cpu-smoke --out x.json  # here: every section, tiny sizes

Runs with only what the device image has (torch, transformers, numpy; no DeepSpeed, Ray, Hydra or
OmegaConf: nothing here imports them, and the smoke test blocks them to prove it). Sections, each
timed and fenced (a failure is recorded in the JSON and the next section still runs):

1. `train_step`: one optimizer step of `bench_1b_active` in bf16 on packed memory-writer PPO segments
   with routing replay and the chunked loss, per experts implementation x gradient checkpointing:
   tokens/s, model FLOP/s, peak memory, MFU against a bf16 8192^3 matmul peak measured in the same
   run. Without DeepSpeed this is `train_step_lib.PlainStep`: the trainer's `PolicyLoss`
   forward/backward inside `RoutingController.replay`, grad clip, torch AdamW on bf16 parameters
   (DeepSpeed's bf16 mode keeps fp32 master weights instead; the forward/backward FLOPs are equal).
2. `chunked_loss`: OPD and PPO losses, ours (chunked head) vs naive full logits, at T=32,768 with
   4,096 loss positions (the report's response), hidden 2048, vocab 120,832, bf16: peak memory
   above the inputs and the median time of forward + backward (bench_losses.py on GPU).
3. `routing_parity`: bf16. (a) capture a packed forward's routes and replay them in the same
   forward: routes and logits must be exact; (b) capture per segment (what the engine records) and
   replay in the packed training forward: the free-routing flip rate (slots where the packed
   forward's own router picks a different expert set) and the logit difference with and without replay.
4. `segment_attention`: the packed row through `hymem_segments` attention vs each segment in its own
   plain sdpa forward (same replayed routes, so only attention and batch shape differ): max / mean
   absolute hidden-state difference in bf16, and in fp32 on tiny_teacher against the CPU test's
   tolerance (1e-5, tests/trainer/test_packing.py); packed vs separate forward time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

from hymem_train.trainer.chunked_head import chunked_head
from hymem_train.trainer.config import PackingConfig
from hymem_train.trainer.losses import opd_token_loss, ppo_token_loss

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import train_step_lib as lib  # noqa: E402

GIB = 2**30


def _sizes(smoke: bool) -> dict:
    if smoke:
        return dict(
            preset="tiny",
            fp32_preset="tiny",
            tokens=192,
            capacity=128,
            scale=64,
            matmul_n=256,
            warmup=0,
            experts=["grouped_mm", "sonicmoe"],  # one timed, one that cannot run here (the error path)
            steps=1,
            loss_T=256,
            loss_N=64,
            loss_H=64,
            loss_V=1024,
            loss_iters=1,
            parity_tokens=128,
            parity_capacity=128,
            parity_scale=64,
        )
    return dict(
        preset="bench_1b_active",
        fp32_preset="tiny_teacher",
        tokens=65_536,
        capacity=16_384,
        scale=1,
        matmul_n=8192,
        warmup=1,
        steps=2,
        loss_T=32_768,
        loss_N=4096,
        loss_H=2048,
        loss_V=120_832,
        loss_iters=3,
        parity_tokens=8192,
        parity_capacity=8192,
        parity_scale=2,
    )


def _build(preset: str, device, dtype):
    """The preset's model on `device` in `dtype`, initialised there (no 4B-parameter CPU init)."""
    from transformers import HYV3ForCausalLM

    from hymem_train.models.presets import make_config

    config = make_config(preset)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = HYV3ForCausalLM(config)
    return model.to(dtype=dtype)


def _mem_peak_reset(device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


def _mem_peak(device) -> int | None:
    return torch.cuda.max_memory_allocated() if device.type == "cuda" else None


# ---- 1. training step -------------------------------------------------------------------------------
def train_step(device, dtype, S: dict, state: dict) -> dict:
    from hymem_train.models.presets import count_params
    from hymem_train.trainer.packing import plan_step

    peak0 = lib.matmul_peak(device, dtype, S["matmul_n"])
    model = _build(S["preset"], device, dtype)
    config = model.config
    packing = PackingConfig(num_tokens_per_micro_batch=S["capacity"], pad_to_multiple=64)
    items = lib.make_step_items(config, S["tokens"], S["capacity"], "ppo", scale=S["scale"])
    [mbs] = plan_step(items, packing, "ppo", world_size=1)
    fl = lib.step_flops(config, mbs)
    step = lib.PlainStep(model, "ppo")
    row = max(int(mb.input_ids_1T.shape[1]) for mb in mbs)
    limit = torch.cuda.mem_get_info()[0] / 2 if device.type == "cuda" else 2 * GIB
    skip = {"batched_mm": why} if (why := lib.batched_mm_skip_reason(config, row, dtype, limit)) else {}
    results = lib.measure_configs(
        model,
        step,
        mbs,
        S.get("experts") or lib.available_experts_implementations(),
        [False, True],
        S["warmup"],
        S["steps"],
        device,
        log=lambda m: print(m, flush=True),
        skip=skip,
    )
    peak = max(peak0, lib.matmul_peak(device, dtype, S["matmul_n"]))
    pc = count_params(config)
    rows = []
    for r in results:
        d = {"experts": r.experts, "grad_ckpt": r.grad_ckpt, "error": r.error, "seconds": r.seconds}
        if r.seconds:
            s = r.median
            d.update(
                step_seconds=s,
                tokens_per_s=fl.real_tokens / s,
                flops_per_s=fl.total / s,
                mfu=fl.total / s / peak,
                peak_memory_gib=(r.peak_memory_bytes or 0) / GIB or None,
            )
        rows.append(d)
    ok = [d for d in rows if "mfu" in d]
    state["model"] = model  # sections 3 and 4 reuse it (trained a few steps: any weights will do)
    state["routing"] = step.routing
    return {
        "preset": S["preset"],
        "params": {"total": pc.total, "active": pc.active, "active_non_embedding": pc.active_non_embedding},
        "path": "plain torch AdamW on PolicyLoss (no DeepSpeed), PPO + routing replay, chunked head, hymem_segments",
        "segments": fl.segments,
        "real_tokens": fl.real_tokens,
        "row_tokens": fl.row_tokens,
        "rows": len(mbs),
        "loss_positions": fl.loss_positions,
        "model_flops": {"total": fl.total, "dense": fl.dense, "head": fl.head, "attention": fl.attention},
        "matmul_peak_flops_per_s": peak,
        "matmul_n": S["matmul_n"],
        "configs": rows,
        "best_mfu": max((d["mfu"] for d in ok), default=None),
    }


# ---- 2. chunked loss vs naive -------------------------------------------------------------------------
def _loss_case(kind: str, path: str, T: int, N: int, H: int, V: int, device, dtype, K: int = 50):
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(T, H, generator=g) * 0.02).to(device, dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.02).to(device, dtype).requires_grad_()
    pos = torch.arange(T - N, T, device=device)
    if kind == "opd":
        ids = torch.randint(0, V, (N, K), generator=g).to(device)
        tlp = torch.log_softmax(torch.randn(N, K + 1, generator=g), -1)[:, :K].contiguous().to(device)
    else:
        ids = torch.randint(0, V, (N, 1), generator=g).to(device)
        old = torch.full((N,), -11.7, device=device)
        adv = torch.randn(N, generator=g).to(device)
    base = _mem_peak_reset(device)
    lib.sync(device)
    t = time.perf_counter()
    if path == "naive":
        z = hidden @ weight.T
        logp = torch.log_softmax(z[pos].float(), -1)
        if kind == "opd":
            ent = -(logp.exp() * logp).sum(-1)
            loss = opd_token_loss(torch.zeros(N, device=device), logp.gather(1, ids), tlp, ent).mean()
        else:
            loss = ppo_token_loss(logp.gather(1, ids)[:, 0], old, adv)[0].mean()
    else:
        h = hidden[pos]
        if kind == "opd":
            lse, zk, ent = chunked_head(h, weight, ids)
            loss = opd_token_loss(lse, zk, tlp, ent).mean()
        else:
            lse, zt, _ = chunked_head(h, weight, ids, with_entropy=False)
            loss = ppo_token_loss(zt[:, 0] - lse, old, adv)[0].mean()
    loss.backward()
    lib.sync(device)
    seconds = time.perf_counter() - t
    peak = _mem_peak(device)
    out = {
        "seconds": seconds,
        "loss": float(loss.detach()),
        "peak_extra_bytes": None if peak is None else peak - base,
    }
    del hidden, weight, loss
    return out


def chunked_loss(device, dtype, S: dict, state: dict) -> dict:
    T, N, H, V = S["loss_T"], S["loss_N"], S["loss_H"], S["loss_V"]
    res = {"T": T, "loss_positions": N, "hidden": H, "vocab": V, "dtype": str(dtype).removeprefix("torch.")}
    res["lm_head_grad_gib"] = V * H * torch.empty(0, dtype=dtype).element_size() / GIB
    for kind in ("opd", "ppo"):
        cases = {}
        for path in ("naive", "ours"):
            try:
                runs = [_loss_case(kind, path, T, N, H, V, device, dtype) for _ in range(1 + S["loss_iters"])]
                cases[path] = {
                    "seconds_median": statistics.median(r["seconds"] for r in runs[1:]),
                    "peak_extra_gib": None
                    if runs[-1]["peak_extra_bytes"] is None
                    else runs[-1]["peak_extra_bytes"] / GIB,
                    "loss": runs[-1]["loss"],
                }
            except torch.OutOfMemoryError as e:
                cases[path] = {"error": f"OutOfMemoryError: {str(e).splitlines()[0][:100]}"}
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        n, o = cases["naive"], cases["ours"]
        if "error" not in n and "error" not in o:
            cases["time_ratio"] = o["seconds_median"] / n["seconds_median"]
            if n["peak_extra_gib"]:
                cases["memory_ratio"] = o["peak_extra_gib"] / n["peak_extra_gib"]
            cases["loss_abs_diff"] = abs(o["loss"] - n["loss"])
        res[kind] = cases
    return res


# ---- 3. routing replay parity -------------------------------------------------------------------------
def _parity_batch(model, S: dict):
    from hymem_train.trainer.packing import plan_step

    items = lib.make_step_items(
        model.config, S["parity_tokens"], S["parity_capacity"], "ppo", scale=S["parity_scale"], seed=1
    )
    [[mb, *_]] = plan_step(items, PackingConfig(num_tokens_per_micro_batch=S["parity_capacity"]), "ppo")
    keys = set(mb.item_keys)
    return [it for it in items if it.key in keys], mb


def _packed_hidden(model, mb, device):
    from hymem_train.trainer.segment_attention import KWARG

    out = model.model(
        input_ids=mb.input_ids_1T.to(device),
        position_ids=mb.position_ids_1T.to(device),
        **{KWARG: mb.cu_seqlens},
    )
    return out.last_hidden_state[0]


def _separate_hidden(model, items, device, attn: str = "hymem_segments"):
    """Each segment alone; `attn` 'sdpa' runs transformers' own sdpa path instead of ours."""
    from hymem_train.trainer.segment_attention import KWARG

    outs = []
    old = model.config._attn_implementation
    try:
        model.config._attn_implementation = attn
        for it in items:
            ids = torch.tensor([it.segment.input_ids], device=device)
            kw = {KWARG: (0, ids.shape[1])} if attn == "hymem_segments" else {}
            outs.append(model.model(input_ids=ids, **kw).last_hidden_state[0])
    finally:
        model.config._attn_implementation = old
    return torch.cat(outs)


def _flip_rate(a, b) -> float:
    """Share of (token, layer) slots whose expert sets differ (order within top-k ignored)."""
    import numpy as np

    a, b = np.sort(np.asarray(a), -1), np.sort(np.asarray(b), -1)
    return float((a != b).any(-1).mean())


def routing_parity(device, dtype, S: dict, state: dict) -> dict:
    from hymem_train.models.routing import RoutingController
    from hymem_train.trainer.segment_attention import use_segment_attention

    model = state.get("model") or _build(S["preset"], device, dtype)
    use_segment_attention(model)
    model.eval()
    lib.set_experts(model, "grouped_mm")
    ctl = RoutingController.attach(model)
    items, mb = _parity_batch(model, S)
    n = mb.num_real_tokens
    W = model.lm_head.weight
    res = {
        "preset": model.config.name_or_path or S["preset"],
        "dtype": str(dtype).removeprefix("torch."),
        "tokens": n,
        "segments": len(items),
    }
    with torch.no_grad():
        # (a) same forward twice: capture, then replay what was captured
        with ctl.capture() as rec:
            free = _packed_hidden(model, mb, device)
        with ctl.replay(rec.routes_TLK):
            again = _packed_hidden(model, mb, device)
        st = ctl.stats()
        sel = torch.arange(0, n, max(n // 512, 1), device=device)  # logits at <= 512 positions (V is large)
        lf, la = (h[sel].float() @ W.float().T for h in (free, again))
        res["same_forward"] = {
            "routes_exact": st["moe/replay_mismatch_rate"] == 0.0,
            "replay_mismatch_rate": st["moe/replay_mismatch_rate"],
            "hidden_equal": bool(torch.equal(free, again)),
            "logits_max_abs_diff": float((lf - la).abs().max()),
        }
        # (b) engine-style capture per segment, replay in the packed training forward
        routes = []
        for it in items:
            with ctl.capture() as r1:
                _separate_hidden(model, [it], device)
            routes.append(r1.routes_TLK)
        import numpy as np

        seg_routes = np.concatenate(routes)
        with ctl.capture() as rec_packed:
            packed_free = _packed_hidden(model, mb, device)
        pad = np.full((mb.input_ids_1T.shape[1] - n, *seg_routes.shape[1:]), -1, seg_routes.dtype)
        with ctl.replay(np.concatenate([seg_routes, pad])):
            packed_rep = _packed_hidden(model, mb, device)
        st = ctl.stats()
        sep = torch.cat([_separate_hidden(model, [it], device) for it in items])
        ls, lfree, lrep = (h[sel].float() @ W.float().T for h in (sep, packed_free[:n], packed_rep[:n]))
        res["engine_capture_packed_replay"] = {
            "free_routing_flip_rate": _flip_rate(seg_routes, rec_packed.routes_TLK[:n]),
            "replay_mismatch_rate": st["moe/replay_mismatch_rate"],
            "logits_max_abs_diff_free_vs_separate": float((lfree - ls).abs().max()),
            "logits_max_abs_diff_replay_vs_separate": float((lrep - ls).abs().max()),
            "logits_mean_abs_diff_replay_vs_separate": float((lrep - ls).abs().mean()),
        }
    state["parity_items"], state["parity_mb"], state["parity_routes"] = items, mb, seg_routes
    return res


# ---- 4. packed segment attention vs separate forwards -------------------------------------------------
def _attention_case(model, items, mb, routes, device) -> dict:
    import numpy as np

    from hymem_train.models.routing import RoutingController

    ctl = RoutingController.attach(model)
    n = mb.num_real_tokens
    pad = np.full((mb.input_ids_1T.shape[1] - n, *routes.shape[1:]), -1, routes.dtype)
    with torch.no_grad():
        lib.sync(device)
        t = time.perf_counter()
        with ctl.replay(np.concatenate([routes, pad])):
            packed = _packed_hidden(model, mb, device)[:n]
        lib.sync(device)
        t_packed = time.perf_counter() - t
        seps, off = [], 0
        t = time.perf_counter()
        for it in items:
            k = it.segment.num_tokens
            with ctl.replay(routes[off : off + k]):
                seps.append(_separate_hidden(model, [it], device, attn="sdpa"))
            off += k
        lib.sync(device)
        t_sep = time.perf_counter() - t
    sep = torch.cat(seps)
    d = (packed.float() - sep.float()).abs()
    return {
        "tokens": n,
        "segments": len(items),
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "hidden_abs_mean": float(sep.float().abs().mean()),
        "packed_seconds": t_packed,
        "separate_seconds": t_sep,
    }


def segment_attention(device, dtype, S: dict, state: dict) -> dict:
    from hymem_train.models.routing import RoutingController
    from hymem_train.trainer.segment_attention import use_segment_attention

    res = {}
    if "parity_mb" in state:
        model = state["model"]
        model.eval()
        res["bf16_" + S["preset"]] = _attention_case(
            model, state["parity_items"], state["parity_mb"], state["parity_routes"], device
        )
    small = _build(S["fp32_preset"], device, torch.float32).eval()
    use_segment_attention(small)
    ctl = RoutingController.attach(small)
    items, mb = _parity_batch(small, {**S, "parity_tokens": min(S["parity_tokens"], 4096)})
    with torch.no_grad(), ctl.capture() as rec:
        _packed_hidden(small, mb, device)
    case = _attention_case(small, items, mb, rec.routes_TLK[: mb.num_real_tokens], device)
    case["within_test_tolerance_1e-5"] = case["max_abs_diff"] <= 1e-5 + 1e-5 * case["hidden_abs_mean"] * 10
    res["fp32_" + S["fp32_preset"]] = case
    return res


SECTIONS = {
    "train_step": train_step,
    "chunked_loss": chunked_loss,
    "routing_parity": routing_parity,
    "segment_attention": segment_attention,
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/device_check.json, else ./)")
    ap.add_argument("--cpu-smoke", action="store_true", help="every section on CPU at tiny sizes")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=450, help="sections not started after this are skipped")
    args = ap.parse_args(argv)
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "device_check.json")
    if args.cpu_smoke:
        device, dtype = torch.device("cpu"), torch.bfloat16
        torch.set_num_threads(2)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device (use --cpu-smoke to try the sections on CPU)")
        device, dtype = torch.device("cuda"), torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = True
    S = _sizes(args.cpu_smoke)
    import transformers

    report: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_smoke": args.cpu_smoke,
        "dtype": "bfloat16",
        "sizes": S,
        "sections": {},
    }
    t0 = time.perf_counter()
    state: dict = {}
    for name in args.sections:
        if time.perf_counter() - t0 > args.budget_s:
            report["sections"][name] = {"skipped": f"time budget {args.budget_s:.0f} s spent"}
            continue
        print(f"== {name}", flush=True)
        ts = time.perf_counter()
        try:
            res = SECTIONS[name](device, dtype, S, state)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001 - record it, run the next section
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
            print(res["traceback"], flush=True)
        res["section_seconds"] = time.perf_counter() - ts
        report["sections"][name] = res
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))  # partial results survive a kill
        print(json.dumps({k: v for k, v in res.items() if k != "traceback"}, default=str)[:2000], flush=True)
    report["total_seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out} ({report['total_seconds']:.0f} s)")
    with contextlib.suppress(Exception):
        state.clear()
    return report


if __name__ == "__main__":
    main()
