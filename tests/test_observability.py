"""What a cluster user sees: wandb run identity and config, start-up errors that
name the key to fix, and no dependency that nothing imports."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from hymem_train.checkpointing import StageCheckpoints
from hymem_train.config import LoggingConfig, compose, to_typed
from hymem_train.logger import WANDB_ID_FILE, MetricsLogger
from hymem_train.models.config import ModelConfig
from hymem_train.run_config import RlConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def fake_wandb(monkeypatch):
    calls: list[dict] = []

    class Run:
        def log(self, *a, **k):
            pass

        def finish(self):
            pass

    mod = types.SimpleNamespace(init=lambda **kw: calls.append(kw) or Run())
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


def test_rerun_gets_a_fresh_wandb_id_and_only_a_resume_reuses_it(tmp_path, fake_wandb):
    cfg = LoggingConfig(wandb_mode="offline")
    MetricsLogger(cfg, tmp_path, "exp/a", config={"trainer": {"lr": 5e-6}})
    first = fake_wandb[-1]
    assert first["id"].startswith("exp_a-") and first["resume"] is None
    assert first["config"] == {"trainer": {"lr": 5e-6}}  # the resolved config reaches wandb
    assert (tmp_path / WANDB_ID_FILE).read_text().strip() == first["id"]
    MetricsLogger(cfg, tmp_path, "exp/a")  # a re-run under the same name, not resuming
    second = fake_wandb[-1]
    assert second["id"] != first["id"] and second["resume"] is None
    lg = MetricsLogger(cfg, tmp_path, "exp/a", resume=True)  # resumed from a checkpoint
    assert fake_wandb[-1]["id"] == second["id"] == lg.wandb_id and fake_wandb[-1]["resume"] == "allow"


def test_a_checkpointed_step_whose_line_was_lost_is_restored_once(tmp_path):
    # the checkpoint carries its step's row (StageCheckpoints.maybe_save); a resume writes it back only
    # where a kill between the checkpoint and the log line lost it (the e2e kill is tests/stages/
    # test_stages_cli.py)
    class Disk:  # keeps the client state as the trainer's checkpoint does
        def broadcast(self, obj):
            return obj

        def save(self, d, state):
            Path(d).mkdir(parents=True, exist_ok=True)
            (Path(d) / "latest").write_text("x")
            self.state = {"step": state["stage_step"], **state}

        def load(self, d):
            return self.state

    class Sched:
        def state(self):
            return {"cursor": 3}

    disk, cfg = Disk(), LoggingConfig(wandb_mode="disabled")
    lg = MetricsLogger(cfg, tmp_path, "exp/a")
    lg.log(1, {"train/loss": 2.0})
    StageCheckpoints(disk, tmp_path, save_every=2, num_steps=4).maybe_save(
        2, Sched(), metrics={"train/loss": 1.5, "eval/score": 0.25}
    )  # killed here: step 2 is checkpointed, its line never written
    step, state = StageCheckpoints(disk, tmp_path, save_every=2, num_steps=4).resume()
    assert step == 2 and state["scheduler"] == {"cursor": 3}
    lg = MetricsLogger(cfg, tmp_path, "exp/a", resume=True)
    assert lg.restore(step, state["step_metrics"])
    assert lg.history()[-1] == {"step": 2, "train/loss": 1.5, "eval/score": 0.25, "run/restored": 1.0}
    assert not lg.restore(step, state["step_metrics"])  # the line exists now: nothing doubled
    assert not lg.restore(0, {"train/loss": 9.0})  # a new run restores nothing
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_stage_passes_the_resolved_config_and_resume_to_the_logger():
    # build_stage is the one place a stage builds its MetricsLogger (the e2e run is tests/stages/
    # test_observability_cli.py); read the call rather than start Ray and DeepSpeed here
    tree = ast.parse((ROOT / "hymem_train" / "stage.py").read_text())
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "MetricsLogger"
    ]
    kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert kw == {"config": "dataclasses.asdict(cfg)", "resume": "start_step > 0"}


def test_missing_init_checkpoint_names_the_key():
    from hymem_train.models.loading import require_local_dir

    with pytest.raises(FileNotFoundError, match=r"init_checkpoint='runs/nope/final': no such directory"):
        require_local_dir("runs/nope/final", "init_checkpoint")
    require_local_dir("org/model", "model.path")  # could be a cached hub id: from_pretrained decides


def test_missing_model_path_names_the_key_not_a_repo_id(tmp_path):
    from hymem_train.models.loading import load_model

    with pytest.raises(FileNotFoundError, match=r"model.path='.*/absent': no such directory"):
        load_model(ModelConfig(path=str(tmp_path / "absent")))


def test_missing_30b_path_names_the_key_not_the_tokenizer_build():
    from hymem_train.models.loading import load_tokenizer_for

    model = to_typed(compose("rl", ["+exp=hy_memory_rl"]), RlConfig).model
    with pytest.raises(FileNotFoundError) as e:
        load_tokenizer_for(model)
    msg = str(e.value)
    assert msg.startswith("model.path='/checkpoints/hy-memory-30b-a3b/init': no such directory")
    assert "build_tokenizer" not in msg


def test_accelerate_is_never_imported_and_pinned_only_for_transformers_zero3_loader():
    """The project's code never imports accelerate. transformers' ZeRO-3 loader (HfDeepSpeedConfig, which
    trainer.zero_init uses) refuses to start without it, so it is pinned with the other dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("accelerate")] == ["accelerate==1.15.0"]
    assert "accelerate==1.15.0" in (ROOT / "requirements" / "lock-cpu.txt").read_text().splitlines()
    for pkg in ("hymem_train", "harnesses", "reward", "data_pipeline"):
        for f in (ROOT / pkg).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text())):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
                names += [n.module or ""] if isinstance(n, ast.ImportFrom) else []
                assert not any(x.split(".")[0] == "accelerate" for x in names), f


@pytest.mark.slow
def test_model_save_load_and_meta_count_run_without_accelerate(tmp_path):
    """With `accelerate` made unimportable: a checkpoint saves and loads through load_model, and the
    30B preset is counted on the meta device (what accelerate's init_empty_weights would do)."""
    code = f"""
import sys
sys.modules["accelerate"] = None  # any import of it now raises ImportError
from hymem_train.models.config import ModelConfig
from hymem_train.models.loading import load_model
from hymem_train.models.presets import build_model, count_params, count_params_meta, make_config
build_model("tiny", seed=0).save_pretrained({str(tmp_path)!r})
m = load_model(ModelConfig(path={str(tmp_path)!r}))
c = make_config("hy_memory_30b_a3b")
assert count_params_meta(c) == count_params(c).total
print("ok", sum(p.numel() for p in m.parameters()), count_params(c).total)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok ")
