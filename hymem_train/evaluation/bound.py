"""The bound rows of the swap table: "store nothing" (`kind: empty`, matrix.EmptyWriter: the bank is
created and nothing is written) and "gold bank" (`kind: gold`): the ledger world's gold operations
(data_pipeline/ledger_oracle.py `LedgerOracle`, no flaws) as the replies of a scripted engine, which
evaluate.serve_writer puts behind a frozen gateway exactly as it serves a checkpoint writer, so the
gold memories reach the bank through the native harness's own write path."""

from __future__ import annotations

from data_pipeline.ledger_oracle import LedgerOracle
from hymem_train.engines.base import GenerationOutput, SamplingParams, check_lengths
from hymem_train.engines.scripted import ScriptedEngine


class GoldEngine(ScriptedEngine):
    """LedgerOracle's reply to each write prompt. Unlike ScriptedEngine it never cuts a reply at the
    request's max_tokens (a cut gold reply would not write the gold bank): such a request fails, and
    the bank build with it, naming the budget to raise. Prompts are not kept (a whole evaluation)."""

    def __init__(self, tokenizer, max_model_len: int = 8192):
        super().__init__(tokenizer, LedgerOracle(), max_model_len)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        check_lengths(prompts, params, self.max_model_len)
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            ids = self.tok.encode(self.reply(self.tok.decode(p))) + [self.tok.eos_token_id]
            if len(ids) > sp.max_tokens:
                raise ValueError(
                    f"the gold reply is {len(ids)} tokens, over the request's max_tokens {sp.max_tokens}: raise "
                    "the harness's native.max_tokens (or the gateway's response budget) for the gold writer"
                )
            outs.append(GenerationOutput(ids, [-1.0] * len(ids), "stop", None))
        return outs


def gold_engine(max_model_len: int):
    """(engine, tokenizer) of the gold writer; the shipped tokenizer (no model weights are involved)."""
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    return GoldEngine(tok, max_model_len), tok
