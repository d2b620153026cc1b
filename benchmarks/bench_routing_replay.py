"""Routing replay overhead on a forward(+backward) pass: replayed routes vs free routing, same run.

    .venv/bin/python benchmarks/bench_routing_replay.py [--preset tiny_teacher] [--tokens 1024] [--iters 10]

Prints median times and the ratio replay / free (aim: <= 1.10x).
"""

import argparse
import statistics
import time

import torch

from hymem_train.models import RoutingController, build_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny_teacher")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--backward", action="store_true", help="time forward+backward (training path)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = build_model(args.preset, seed=0)
    ids = torch.randint(0, 800, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    ctl = RoutingController.attach(model)
    with torch.no_grad(), ctl.capture() as rec:
        model(ids)
    routes = rec.routes_TLK

    def step(replay: bool) -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        ctx = ctl.replay(routes) if replay else torch.enable_grad()
        with ctx, torch.enable_grad() if args.backward else torch.no_grad():
            out = model(ids).logits
            if args.backward:
                out.float().logsumexp(-1).mean().backward()
        return time.perf_counter() - t

    for _ in range(2):
        step(False), step(True)
    free, rep = [], []
    for _ in range(args.iters):  # interleaved, so machine noise hits both alike
        free.append(step(False))
        rep.append(step(True))
    f, r = statistics.median(free), statistics.median(rep)
    mode = "forward+backward" if args.backward else "forward"
    print(f"model={args.preset} tokens={args.tokens} {mode} iters={args.iters}")
    print(f"free routing : {f * 1e3:.1f} ms (median)")
    print(f"replay       : {r * 1e3:.1f} ms (median)")
    print(f"overhead ratio (replay / free): {r / f:.3f}x  (aim <= 1.10x)")


if __name__ == "__main__":
    main()
