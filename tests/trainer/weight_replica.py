"""An engine replica process for the weight-group tests (not collected: no test_ prefix).

    python tests/trainer/weight_replica.py --group 127.0.0.1:PORT --rank 1 --world 3 --out /tmp/r1

Builds the real HF engine on the tiny model with other weights (seed 1), joins the weight-update group,
receives one sync and writes the engine's parameters and buffers (`<out>.pt`) and the counters (`<out>.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from hymem_train.engines.hf import HFEngine  # noqa: E402
from hymem_train.models.presets import build_model, make_config  # noqa: E402
from hymem_train.trainer.weight_group import open_weight_group, receive_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", required=True, help="HOST:PORT of the weight-update group's store")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = HFEngine(
        build_model(make_config("tiny", attn_implementation="eager"), seed=1), [2], pad_token_id=0
    )
    host, port = args.group.rsplit(":", 1)
    group = open_weight_group(host, int(port), args.rank, args.world, timeout_s=300)
    stats = receive_weights(group, engine)
    state = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    state.update({n: b.detach().clone() for n, b in engine.model.named_buffers()})
    torch.save(state, args.out + ".pt")
    Path(args.out + ".json").write_text(json.dumps({**stats, "policy_version": engine.policy_version}))


if __name__ == "__main__":
    main()
