"""A few OPD and RL steps with a real memory framework in its sandbox (mem0ai 2.2.1 in .venvs/mem0):
the policy's calls and mem0's embedding calls go through the gateway, the reward actors open mem0
bank snapshots through their own sandboxes, promotion reopens mem0 banks from disk."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MEM0_VENV = Path(__file__).resolve().parents[2] / ".venvs" / "mem0" / "bin" / "python"
MEM0 = [
    "~harness@harnesses.native", "~harnesses.native", "+harness@harnesses.mem0=mem0",
    # mem0's extraction prompt is ~21k tokens in the tiny 852-token vocabulary
    "harnesses.mem0.options.max_tokens=32", "engine.max_model_len=32768",
    "trainer.packing.num_tokens_per_micro_batch=32768",
]  # fmt: skip


@pytest.mark.skipif(not MEM0_VENV.exists(), reason="mem0 venv missing: scripts/make_harness_venvs.sh mem0")
def test_opd_then_rl_steps_inside_mem0(assets, stage):
    root = assets["root"]
    opd = root / "opd_mem0"
    stage.run(stage.cmd("opd", assets, opd, "num_steps=1", "save_every=1", "data.eval_path=", *MEM0,
                        "opd.num_rows_per_step=1", "teacher_engine.max_model_len=32768"), root / "opd_mem0.log")  # fmt: skip
    m = stage.metrics(opd)[1]
    assert m["rollout/segments"] > 0 and m["gateway/requests_ok"] > 0
    assert m["gateway/embedding_requests"] > 0  # mem0 embedded through the gateway's MiniLM
    assert m["rollout/platform_error_rollouts"] == 0
    assert json.loads((opd / "schedule_manifest.json").read_text()) and set(
        json.loads((opd / "schedule_manifest.json").read_text()).values()
    ) == {"mem0"}

    rl = root / "rl_mem0"
    stage.run(stage.cmd("rl", assets, rl, "num_steps=1", "save_every=1", "data.eval_path=",
                        f"init_checkpoint={opd}/final", *MEM0, "rl.num_windows_per_step=1"),
              root / "rl_mem0.log")  # fmt: skip
    m = stage.metrics(rl)[1]
    assert m["reward/bank_faults"] == 0  # every mem0 snapshot opened and searched through its sandbox
    assert m["reward/reader_calls"] > 0 and m["rollout/platform_error_rollouts"] == 0
    lineage = json.loads((rl / "lineage.json").read_text())
    assert lineage and all(v["harness"] == "mem0" for v in lineage.values())
