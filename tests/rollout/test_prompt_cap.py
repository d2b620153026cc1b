"""A call over the gateway's prompt cap in a real rollout (native harness, real gateway): with
`drop_chunk` the rollout is a platform_error (excluded from scores and training, docs/glossary.md),
with `truncate_left` it goes on and its segments say how much was cut."""

from hymem_train.engines.scripted import ScriptedEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.models.tokenizer import default_tokenizer
from hymem_train.rollout.worker import M_OVER_CAP, RolloutTask, RolloutWorker
from tests.rollout.conftest import store_first_fact


def _run(synth_ds, native_cfgs, tmp_path, **gw_kw):
    tok = default_tokenizer()
    gw = Gateway(ScriptedEngine(tok, store_first_fact), tok, GatewayConfig(embeddings=False, **gw_kw))
    w = synth_ds.windows[0]
    with GatewayServer(gw) as srv:
        res = RolloutWorker(native_cfgs, srv.url, gw.admin_token).run(
            RolloutTask(w, synth_ds.chunks_of(w), 0, "native", None, str(tmp_path / "r0"))
        )
    return res, gw


def test_drop_chunk_ends_the_rollout_as_platform_error(synth_ds, native_cfgs, tmp_path):
    res, gw = _run(synth_ds, native_cfgs, tmp_path, max_prompt_tokens=32)
    assert res.record.status == "platform_error"
    assert [c.status for c in res.record.chunks] == ["platform_error", "platform_error"]
    assert res.metrics[M_OVER_CAP] == 1.0 and res.metrics["rollout/platform_error_rollouts"] == 1.0
    # every refusal is counted (the harness may retry the refused write), none is left undrained
    assert gw.metrics()["gateway/prompt_over_cap"] >= 1.0 and gw.dropped == {}


def test_truncate_left_rollout_goes_on_and_segments_carry_the_cut(synth_ds, native_cfgs, tmp_path):
    res, gw = _run(synth_ds, native_cfgs, tmp_path, max_prompt_tokens=200, prompt_over_cap="truncate_left")
    assert res.record.status == "ok" and res.metrics[M_OVER_CAP] == 0.0
    assert all(len(s.prompt_ids) <= 200 for s in res.segments)
    cut = [s.meta.get("prompt_truncated_tokens", 0) for s in res.segments]
    assert sum(cut) == gw.metrics()["gateway/prompt_truncated_tokens"] > 0
