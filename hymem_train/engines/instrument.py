"""An instrument reader as an Engine: the extractive reader (reward.instrument, the ledger world's
grammar) or the lexical reader (reward.lexical, real-data banks). The frozen gateway hands it the
chat-templated prompt ids, it decodes them, extracts the answer from the prompt's records and returns its
token ids. No model, no distribution: log-probs are 0.0 and there is nothing to score or to update.

Served by `hymem_train.gateway.local_reader.start_instrument_server` (`reader_kind=extractive|lexical`), so the
reward service and the evaluation reach it through the same ChatClient path as an LLM reader. The
gateway hands it each request on its own (`submit`, as it does vLLM's continuous engine): a prompt
that is not a reader prompt fails alone, not the batch it would have shared."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterable
from typing import Any

from hymem_train.engines.base import GenerationOutput, SamplingParams, TopKLogprobs, check_lengths
from reward.instrument import extractive_answer, parse_reader_entries
from reward.lexical import lexical_answer


def _extractive(question: str, entries: list[tuple[str, str]]) -> str:
    return extractive_answer(question, [t for _, t in entries])


# reader_kind -> (question, [(date, record text)]) -> answer; run_config.READER_KINDS names the same kinds
INSTRUMENTS = {"extractive": _extractive, "lexical": lexical_answer}


class InstrumentReaderEngine:
    continuous_batching = True  # the gateway calls `submit` per request (no batch wait: nothing to batch)

    def __init__(self, tokenizer, max_model_len: int = 8192, kind: str = "extractive"):
        if kind not in INSTRUMENTS:
            raise ValueError(f"instrument reader {kind!r}: want one of {sorted(INSTRUMENTS)}")
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.kind = kind
        self._answer = INSTRUMENTS[kind]
        self.policy_version = 0

    def answer(self, prompt_ids: list[int]) -> str:
        """The extracted answer of one prompt; ValueError when it is not a reader prompt."""
        # special tokens skipped: the chat template's end-of-turn marker would end the Question line
        text = self.tok.decode(prompt_ids, skip_special_tokens=True)
        return self._answer(*parse_reader_entries(text))

    def _output(self, prompt_ids: list[int], sp: SamplingParams) -> GenerationOutput:
        ids = self.tok.encode(self.answer(prompt_ids), add_special_tokens=False)
        if len(ids) + 1 <= sp.max_tokens:
            ids.append(self.tok.eos_token_id)
            return GenerationOutput(ids, [0.0] * len(ids), "stop", None, self.policy_version)
        ids = ids[: sp.max_tokens]  # no room for the answer and its stop token: cut, as a model's would be
        return GenerationOutput(ids, [0.0] * len(ids), "length", None, self.policy_version)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        check_lengths(prompts, params, self.max_model_len)
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            try:
                outs.append(self._output(p, sp))
            except ValueError as e:
                raise ValueError(f"{self.kind} reader, prompt {i} of {len(prompts)}: {e}") from None
        return outs

    def submit(self, prompt: list[int], params: SamplingParams) -> cf.Future:
        """One request, answered at once (the gateway's continuous path)."""
        fut: cf.Future = cf.Future()
        try:
            check_lengths([prompt], [params], self.max_model_len)
            fut.set_result(self._output(prompt, params))
        except Exception as e:  # the gateway turns it into the request's error response
            fut.set_exception(e)
        return fut

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        raise NotImplementedError(f"the {self.kind} reader has no distribution to score (it is not a model)")

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> int:
        """Nothing to load (no weights): the version moves, 0 tensors loaded."""
        self.policy_version = version
        return 0
