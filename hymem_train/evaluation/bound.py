"""The bound rows of the swap table: "store nothing" (`kind: empty`, matrix.EmptyWriter: the bank is
created and nothing is written) and "gold bank" (`kind: gold`): the data's gold memories as the replies
of a scripted engine, which evaluate.serve_writer puts behind a frozen gateway exactly as it serves a
checkpoint writer, so the gold memories reach the bank through each harness's own write path. The gold
replies are, per write prompt:
- the ledger world in the native harness: its gold operations (data_pipeline/ledger_oracle.py
  `LedgerOracle`, no flaws);
- real data (LoCoMo observations, LongMemEval evidence turns) in the native harness, mem0 or hy-memory:
  the written chunk's gold memories in that framework's reply format (data_pipeline/source_gold.py)."""

from __future__ import annotations

from data_pipeline.ledger_oracle import LedgerOracle
from data_pipeline.source_gold import SourceGold, prompt_kind
from hymem_train.engines.base import GenerationOutput, SamplingParams, check_lengths
from hymem_train.engines.scripted import ScriptedEngine
from hymem_train.evaluation.matrix import LEDGER_SOURCE


class GoldReply:
    """Callable: write prompt -> gold reply. `datasets`: framework -> the dataset its harnesses write."""

    def __init__(self, datasets: dict):
        ledger = {fw for fw, d in datasets.items() if _is_ledger(d)}
        self.ledger = LedgerOracle() if ledger else None
        self.source = SourceGold({fw: d for fw, d in datasets.items() if fw not in ledger})
        self._ledger_frameworks = ledger

    def record(self) -> dict:
        """Real-data replies by prompt kind, memories written, and write prompts in which no chunk was
        whole ("unmatched": those chunks' memories are missing from the gold bank, the first few such
        prompts' tails beside them)."""
        return {"counts": dict(self.source.counts), "unmatched_prompts": list(self.source.unmatched)}

    def __call__(self, prompt: str) -> str:
        if self.ledger is not None and prompt_kind(prompt) in self._ledger_frameworks:
            return self.ledger(prompt)
        return self.source(prompt)


def _is_ledger(dataset) -> bool:
    seqs = dataset.tables["sequences"]
    return bool(seqs) and all(s.source == LEDGER_SOURCE for s in seqs)


class GoldEngine(ScriptedEngine):
    """The gold reply to each write prompt. Unlike ScriptedEngine it never cuts a reply at the
    request's max_tokens (a cut gold reply would not write the gold bank): such a request fails, and
    the bank build with it, naming the budget to raise. Prompts are not kept (a whole evaluation)."""

    def __init__(self, tokenizer, datasets: dict, max_model_len: int = 8192):
        super().__init__(tokenizer, GoldReply(datasets), max_model_len)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        check_lengths(prompts, params, self.max_model_len)
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            ids = self.tok.encode(self.reply(self.tok.decode(p))) + [self.tok.eos_token_id]
            if len(ids) > sp.max_tokens:
                raise ValueError(
                    f"the gold reply is {len(ids)} tokens, over the request's max_tokens {sp.max_tokens}: raise "
                    "the harness's max_tokens (native.max_tokens, options.max_tokens / agent_max_tokens) for "
                    "the gold writer"
                )
            outs.append(GenerationOutput(ids, [-1.0] * len(ids), "stop", None))
        return outs


def gold_engine(datasets: dict, max_model_len: int):
    """(engine, tokenizer) of the gold writer; the shipped tokenizer (no model weights are involved)."""
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    return GoldEngine(tok, datasets, max_model_len), tok
