"""Gateway + HF engine throughput: 8 concurrent OpenAI clients vs one-at-a-time, same run.

    .venv/bin/python benchmarks/bench_gateway.py [--requests 16] [--clients 8] [--max-tokens 32]

The gateway (uvicorn + batcher + HF engine on a tiny HYV3) runs in this process; the OpenAI clients
run in a child process, as harness sandboxes do, so client threads do not compete for this
process's GIL. Prints completion tokens/s for both modes and their ratio (aim: >= 3x on 2 cores).
"""

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_clients(args) -> None:
    import openai

    creds = args.creds.split(",")
    clients = [openai.OpenAI(base_url=args.url, api_key=c, max_retries=0) for c in creds]

    def call(i: int) -> int:
        msgs = [{"role": "user", "content": f"Chunk {i}: Alice said her dog Rex likes the park on Sundays."}]
        r = clients[i].chat.completions.create(
            model="policy", messages=msgs, max_tokens=args.max_tokens, seed=i
        )
        return r.usage.completion_tokens

    call(0)  # warm-up
    t = time.perf_counter()
    seq_tokens = sum(call(i) for i in range(len(clients)))
    seq_s = time.perf_counter() - t
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(args.clients) as ex:
        conc_tokens = sum(ex.map(call, range(len(clients))))
    conc_s = time.perf_counter() - t
    print(
        json.dumps({"seq_tokens": seq_tokens, "seq_s": seq_s, "conc_tokens": conc_tokens, "conc_s": conc_s})
    )


def measure(gw, args) -> dict:
    """Serve `gw`, run the client child process against it: its JSON line, plus the engine batch sizes
    of the concurrent phase (`sizes`)."""
    from hymem_train.gateway import GatewayServer

    with GatewayServer(gw) as srv:
        creds = []
        for i in range(args.requests):
            creds.append(gw.register(f"t{i}", f"b{i}"))
            gw.set_chunk(f"t{i}", 0)
        n0 = len(gw.batcher.batch_sizes)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--url",
                srv.base_url,
                "--creds",
                ",".join(creds),
                "--clients",
                str(args.clients),
                "--max-tokens",
                str(args.max_tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        sizes = gw.batcher.batch_sizes[n0 + 1 + args.requests :]  # the concurrent phase
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "sizes": sizes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--preset", default="tiny_student")
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--creds", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.url:
        return run_clients(args)

    import torch

    from hymem_train.engines.hf import HFEngine
    from hymem_train.gateway import Gateway, GatewayConfig
    from hymem_train.models import build_model
    from hymem_train.models.tokenizer import default_tokenizer

    torch.set_num_threads(1)  # one core for the engine, one for the clients
    tok = default_tokenizer()
    engine = HFEngine(
        build_model(args.preset, seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=1024
    )
    gw = Gateway(engine, tok, GatewayConfig(embeddings=False, batch_wait_ms=5))
    r = measure(gw, args)
    sizes = r.pop("sizes")
    seq_tps, conc_tps = r["seq_tokens"] / r["seq_s"], r["conc_tokens"] / r["conc_s"]
    print(f"model={args.preset} requests={args.requests} max_tokens={args.max_tokens}")
    print(f"one-at-a-time : {r['seq_tokens']} tokens in {r['seq_s']:.2f}s = {seq_tps:.1f} tok/s")
    print(
        f"{args.clients} concurrent  : {r['conc_tokens']} tokens in {r['conc_s']:.2f}s = {conc_tps:.1f} tok/s "
        f"(mean batch {sum(sizes) / max(len(sizes), 1):.1f})"
    )
    print(f"throughput ratio (concurrent / one-at-a-time): {conc_tps / seq_tps:.2f}x  (aim >= 3x)")


if __name__ == "__main__":
    main()
