"""A scripted annotator for the data-pipeline tests: answers for `tests.doubles.openai_server.StandInServer`.

    with StandInServer(annotator_responder()) as srv:
        annotate(chunks, windows, cfg_with(base_url=srv.base_url), out_dir)

`annotator_responder(override)` gives well-formed PRM / ORM answers derived from each request's
payload; `override(pass, payload, attempt)` injects malformed answers (str / dict) or HTTP errors
(int / HttpFailure) for the calls a test picks; `failing_override(mode)` fails every call the way a
misconfigured server does. Facts carry "CANARY-" markers so leak tests can look for them in
everything the bank, retrieval query and answer model see.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.doubles.openai_server import HttpFailure


def user_payload(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON task payload of an annotation request (the first user message)."""
    first_user = next(m for m in body["messages"] if m["role"] == "user")
    return json.loads(first_user["content"])


def num_attempts(body: dict[str, Any]) -> int:
    """0 for a first ask, k for the k-th re-ask after an invalid answer."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def good_prm(p: dict[str, Any]) -> dict[str, Any]:
    t = p["chunk_index"]
    prev = p["previous_facts"]
    return {
        "facts": [
            {
                "text": f"CANARY-F{t} fact of chunk {t}",
                "turn_ids": p["turn_ids"][:1],
                "supersedes": prev[-1]["fact_id"] if (t % 3 == 2 and prev) else "",
            }
        ],
        "probes": [
            {
                "kind": "transition" if (t % 3 == 2 and prev) else "plain_recall",
                "question": f"What happened in chunk {t}?",
                "reference": f"CANARY-R{t}",
                "rubric": "full credit for the reference",
                "fact_indices": [0],
            }
        ],
        "traps": [
            {"question": f"What snack did they eat in chunk {t}?", "rubric": "credit only 'no such record'"}
        ],
    }


def good_orm(p: dict[str, Any]) -> dict[str, Any]:
    wf, ef = p["window_facts"], p["earlier_facts"]
    gold = [wf[-1]["fact_id"], (ef[-1] if ef else wf[0])["fact_id"]]
    return {
        "questions": [
            {
                "question": f"What links window {p['window_index']}?",
                "answer": "CANARY-A",
                "gold_fact_ids": list(dict.fromkeys(gold)),
                "rubric": "credit per fact",
            }
        ]
    }


def pass_of(body: dict[str, Any]) -> str:
    return "prm" if "(PRM pass" in body["messages"][0]["content"] else "orm"


def annotator_responder(
    override: Callable[[str, dict[str, Any], int], Any] | None = None,
) -> Callable[[dict[str, Any]], str | int]:
    """Good answers, unless `override(pass, payload, attempt)` returns something (str / int / dict)."""

    def respond(body: dict[str, Any]) -> str | int:
        which, payload, attempt = pass_of(body), user_payload(body), num_attempts(body)
        if override is not None:
            out = override(which, payload, attempt)
            if out is not None:
                return json.dumps(out) if isinstance(out, dict | list) else out  # str, int or HttpFailure
        return json.dumps(good_prm(payload) if which == "prm" else good_orm(payload))

    return respond


# vLLM's answer to a prompt longer than --max-model-len (HTTP 400, not retried by the openai client)
CONTEXT_TOO_LONG = (
    '{"object": "error", "message": "This model\'s maximum context length is 2048 tokens. However, you '
    'requested 4301 tokens (205 in the messages, 4096 in the completion).", "type": "BadRequestError", '
    '"code": 400}'
)


def failing_override(mode: str) -> Callable[[str, dict[str, Any], int], Any]:
    """An `annotator_responder` override that fails every call the way a misconfigured server does.

    "context": HTTP 400 context-length error (a server started with too small a --max-model-len);
    "json": prose instead of JSON (a server without structured output, use_json_schema ignored).
    """
    if mode == "context":
        return lambda which, payload, attempt: HttpFailure(400, body=CONTEXT_TOO_LONG)
    if mode == "json":
        return lambda which, payload, attempt: "Sure! Here are the facts you asked for: ..."
    raise ValueError(f"unknown failure mode {mode!r} (context | json)")
