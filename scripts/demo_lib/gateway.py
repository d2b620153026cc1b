"""The foundation demo (`make demo-gateway`, `scripts/demo.py --gateway-only`).

It shows the foundation end to end: a tiny HYV3 policy served behind the OpenAI-compatible
gateway, harness-like clients (one credential per trajectory) calling it concurrently across chunks,
and the token-exact Segments the gateway recorded. The full pipeline (SFT -> OPD -> RL) is
scripts/demo_lib/pipeline.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from pathlib import Path

import numpy as np
import openai

from hymem_train.config import compose, to_typed, to_yaml
from hymem_train.gateway import GatewayServer
from hymem_train.gateway.store import SegmentStore
from hymem_train.run_config import ServeConfig

log = logging.getLogger(__name__)

CHUNKS = [
    "Alice: I finally adopted a dog last week, his name is Rex.\nBob: Congrats! What breed?",
    "Alice: Rex is a beagle. Also, I moved from Boston to Seattle in March.\nBob: Big month!",
]
SYSTEM = (
    "You write memories. Return JSON operations ADD, UPDATE, DELETE or NONE for the new conversation chunk."
)


def run_gateway_demo(overrides: list[str] | None = None, num_trajectories: int = 3) -> dict:
    from hymem_train.serve import build_gateway

    cfg = to_typed(compose("serve", ["+exp=demo_cpu", *(overrides or [])]), ServeConfig)
    out_dir = Path(cfg.run.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(to_yaml(cfg))
    seg_path = out_dir / "segments.jsonl"
    seg_path.unlink(missing_ok=True)
    gateway = build_gateway(cfg)
    gateway.store = SegmentStore(seg_path)
    print(f"model preset={cfg.model.preset} engine={cfg.engine.kind} run dir={out_dir}")
    with GatewayServer(gateway) as server:
        print(f"gateway: {server.base_url}")
        trajs = {
            f"demo-traj-{i}": gateway.register(f"demo-traj-{i}", f"demo-bank-{i}")
            for i in range(num_trajectories)
        }

        def write_chunk(tid: str, chunk: int) -> str:
            client = openai.OpenAI(base_url=server.base_url, api_key=trajs[tid], max_retries=0)
            r = client.chat.completions.create(
                model=cfg.gateway.served_model_name,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": CHUNKS[chunk]}],
                max_tokens=cfg.gateway.default_max_tokens,
                temperature=1.0,
                seed=hash((tid, chunk)) % 10_000,
            )
            return r.choices[0].message.content

        for chunk in range(len(CHUNKS)):
            for tid in trajs:
                gateway.set_chunk(tid, chunk)
            with cf.ThreadPoolExecutor(len(trajs)) as ex:  # the trajectories call concurrently: one batch
                replies = dict(zip(trajs, ex.map(lambda t, c=chunk: write_chunk(t, c), trajs), strict=True))
            for tid, text in replies.items():
                print(f"[chunk {chunk}] {tid} replied ({len(text)} chars): {text[:100]!r}")

        # a sandbox presenting another trajectory's identity is refused (silent failure shared-identity)
        a, b = list(trajs)[:2]
        bad = openai.OpenAI(base_url=f"{server.url}/t/{b}/v1", api_key=trajs[a], max_retries=0)
        try:
            bad.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            print("ERROR: a mismatched identity was accepted")
        except openai.PermissionDeniedError as e:
            print(f"mismatched identity rejected: HTTP {e.status_code}")
        metrics = gateway.metrics()

    segs = gateway.store.all()
    print(f"\nrecorded segments: {len(segs)} (also in {seg_path})")
    print(
        f"{'trajectory':<12} {'chunk':>5} {'call':>4} {'prompt':>6} {'resp':>5} {'finish':>6} {'mean lp':>8} routes"
    )
    for s in sorted(segs, key=lambda s: (s.trajectory_id, s.chunk_index, s.call_index)):
        routes = "x".join(map(str, s.routed_experts_TLK.shape)) if s.routed_experts_TLK is not None else "-"
        print(
            f"{s.trajectory_id:<12} {s.chunk_index:>5} {s.call_index:>4} {len(s.prompt_ids):>6} "
            f"{len(s.response_ids):>5} {s.finish_reason:>6} {np.mean(s.logprobs):>8.3f} {routes}"
        )
    print("gateway metrics: " + ", ".join(f"{k.split('/')[1]}={v:g}" for k, v in metrics.items()))
    return {"segments": len(segs), "metrics": metrics}
