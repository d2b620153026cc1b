"""Context budgets at the gateway: the response budget clamps max_tokens, and a
prompt over the cap is a counted, logged event handled by config (drop_chunk or truncate_left)."""

import logging

import httpx
import pytest

from hymem_train.engines.scripted import ScriptedEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.gateway.client import GatewayAdmin
from hymem_train.models.tokenizer import default_tokenizer

MSG = [
    {"role": "system", "content": "You store memories."},
    {"role": "user", "content": "My dog is Rex. " * 8},
]
LONG_REPLY = "one two three four five six seven eight nine ten " * 4


def _serve(**kw):
    tok = default_tokenizer()
    return GatewayServer(
        Gateway(ScriptedEngine(tok, lambda _: LONG_REPLY), tok, GatewayConfig(embeddings=False, **kw))
    )


def _call(srv, tid, chunk=3, max_tokens=64):
    gw = srv.gateway
    cred = gw.register(tid, f"bank-{tid}")
    gw.set_chunk(tid, chunk)
    body = {"model": "policy", "messages": MSG, "max_tokens": max_tokens}
    return httpx.post(
        f"{srv.base_url}/chat/completions", json=body, headers={"authorization": f"Bearer {cred}"}
    )


def _full_prompt(gw):
    return gw.tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_response_budget_clamps_max_tokens_and_counts_it():
    with _serve(max_response_tokens=5) as srv:
        r = _call(srv, "t-budget", max_tokens=64)
        assert r.status_code == 200
        (seg,) = srv.gateway.store.get("t-budget")
        assert len(seg.response_ids) == 5  # 4 reply tokens + EOS: the scripted engine obeys max_tokens
        assert srv.gateway.metrics()["gateway/max_tokens_clamped"] == 1.0
        _call(srv, "t-small", max_tokens=3)  # under the budget: untouched, not counted
        assert len(srv.gateway.store.get("t-small")[0].response_ids) == 3
        assert srv.gateway.metrics()["gateway/max_tokens_clamped"] == 1.0


def test_prompt_over_cap_drop_chunk_is_refused_counted_named_and_collected(caplog):
    with _serve(max_prompt_tokens=20) as srv:
        gw = srv.gateway
        n = len(_full_prompt(gw))
        assert n > 20
        with caplog.at_level(logging.WARNING, logger="hymem_train.gateway.server"):
            r = _call(srv, "t-drop", chunk=3)
        assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_over_cap"
        assert f"prompt is {n} tokens, over gateway.max_prompt_tokens 20" in r.json()["error"]["message"]
        assert gw.metrics()["gateway/prompt_over_cap"] == 1.0
        assert gw.store.get("t-drop") == []  # nothing recorded, nothing to train on
        assert any("trajectory t-drop chunk 3" in m and "drop_chunk" in m for m in caplog.messages)
        # the rollout worker collects the event (admin HTTP), once
        admin = GatewayAdmin(srv.url, gw.admin_token)
        assert admin.drain_dropped("t-drop") == [{"chunk_index": 3, "prompt_tokens": n}]
        assert admin.drain_dropped("t-drop") == []


def test_prompt_over_cap_truncate_left_keeps_the_last_tokens_and_says_so(caplog):
    with _serve(max_prompt_tokens=20, prompt_over_cap="truncate_left") as srv:
        gw = srv.gateway
        full = _full_prompt(gw)
        with caplog.at_level(logging.WARNING, logger="hymem_train.gateway.server"):
            r = _call(srv, "t-cut", chunk=1)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 20
        (seg,) = gw.store.get("t-cut")
        assert seg.prompt_ids == full[-20:]  # the engine saw exactly the kept tail; the segment records it
        assert seg.meta == {"prompt_truncated_tokens": len(full) - 20}
        m = gw.metrics()
        assert m["gateway/prompt_over_cap"] == 1.0 and m["gateway/prompt_truncated_tokens"] == len(full) - 20
        assert any("trajectory t-cut chunk 1" in msg and "truncate_left" in msg for msg in caplog.messages)
        assert gw.drain_dropped("t-cut") == []  # a truncated call is not a dropped chunk


def test_budget_config_is_validated_by_name():
    with pytest.raises(ValueError, match="gateway.prompt_over_cap='cut'"):
        GatewayConfig(prompt_over_cap="cut").validate()
    with pytest.raises(ValueError, match="gateway.max_prompt_tokens"):
        GatewayConfig(max_prompt_tokens=-1).validate()
    with pytest.raises(ValueError, match="exceed engine.max_model_len 32768"):
        GatewayConfig(max_prompt_tokens=30_000, max_response_tokens=4096).check_fits(32_768)
    GatewayConfig(max_prompt_tokens=28_672, max_response_tokens=4096).check_fits(32_768)
