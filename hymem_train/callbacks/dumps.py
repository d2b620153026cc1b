"""Step dumps: `rollout.dump=true` writes each step's train items to
`<run>/dumps/step_<k>.pt` (written to a temp file, then renamed), and `rollout.mode=train_only`
replays them into the trainer, so rollout and training can be debugged apart."""

from __future__ import annotations

from pathlib import Path


class StepDumps:
    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir) / "dumps"

    def save(self, step: int, items: list) -> None:
        import torch

        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".step_{step}.pt.tmp"
        torch.save({"items": items}, tmp)
        tmp.rename(self.dir / f"step_{step}.pt")

    def load(self, step: int) -> list:
        import torch

        p = self.dir / f"step_{step}.pt"
        if not p.exists():
            raise FileNotFoundError(
                f"rollout.mode=train_only: no dump {p} (run with rollout.dump=true first)"
            )
        return torch.load(p, weights_only=False)["items"]
