"""A scripted engine: replies chosen by a function of the prompt text. A test double for unit tests
of the rollout and reward paths (the real paths run the HF engine), and a stand-in policy for
debugging a harness integration without a model."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from hymem_train.engines.base import GenerationOutput, SamplingParams, TopKLogprobs, check_lengths


class ScriptedEngine:
    def __init__(self, tokenizer, reply: Callable[[str], str], max_model_len: int = 8192):
        self.tok = tokenizer
        self.reply = reply
        self.max_model_len = max_model_len
        self.policy_version = 0
        self.prompts: list[str] = []

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        check_lengths(prompts, params, self.max_model_len)
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            text = self.tok.decode(p)
            self.prompts.append(text)
            ids = self.tok.encode(self.reply(text))[: sp.max_tokens - 1] + [self.tok.eos_token_id]
            outs.append(GenerationOutput(ids, [-1.0] * len(ids), "stop", None))
        return outs

    def topk_logprobs(self, sequences: list[list[int]], k: int) -> list[TopKLogprobs]:
        raise NotImplementedError("ScriptedEngine has no distribution to score (use HFEngine as teacher)")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        self.policy_version = version
        return 0
