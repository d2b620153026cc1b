"""PersonaMem-v2 protocol: multiple-choice accuracy, scored locally (no judge).

Source (docs/evaluation_benchmarks.md): bowen-upenn/PersonaMem-v2 `inference.py` (`create_mcq_options`,
`extract_final_answer`, `check_mcq_correctness`): the model sees the options as "A. <text>" with the
instruction to end with "Final Answer: [Letter]"; the first letter matched by the published patterns is
the prediction; accuracy = share of rows whose predicted letter maps to `correct_answer`. A reply with
no letter counts as wrong, as upstream counts it. The loader (data_pipeline/personamem.py) renders the
options and instruction into `question` and stores the correct option as "B. <text>" in `answer`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from reward.eval_protocol import Messages, Metric, Verdict, register
from reward.judge import format_memories

# upstream's patterns, tried in this order, first match wins (re.IGNORECASE | re.MULTILINE)
_FINAL_ANSWER = (
    r"Final Answer:\s*([A-Z])",
    r"final answer:\s*([A-Z])",
    r"Answer:\s*([A-Z])",
    r"answer:\s*([A-Z])",
    r"\b([A-Z])\.\s*$",
)
# the paper's memory-agent prompt (MemAgent/data/data_preprocess.py), with the memory records in place of
# the raw history
READER_SYSTEM = (
    "You are a helpful assistant that provides personalized responses based on the user's preferences "
    "recorded in the memory records below."
)


def extract_final_answer(reply: str) -> str:
    for pattern in _FINAL_ANSWER:
        m = re.search(pattern, reply or "", re.IGNORECASE | re.MULTILINE)
        if m:
            return m.group(1).upper()
    return ""


def correct_letter(item: Any) -> str:
    letter = item.answer.split(".", 1)[0].strip()
    if len(letter) != 1 or not letter.isalpha():
        raise ValueError(f"{item.item_id}: answer {item.answer[:40]!r} is not '<letter>. <option>'")
    return letter.upper()


def score(item: Any, reply: str) -> Verdict:
    predicted = extract_final_answer(reply)
    right = correct_letter(item)
    if not predicted:
        return Verdict(0.0, "no option letter in the reply (upstream counts it wrong)")
    return Verdict(1.0 if predicted == right else 0.0, f"predicted {predicted}, correct {right}")


def reader_messages(item: Any, entries: Sequence[Any]) -> Messages:
    user = f"Memory records:\n{format_memories(entries)}\n\nUser query: {item.question}"
    return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}]


register(
    Metric(
        "personamem_v2",
        "PersonaMem-v2",
        local=score,
        reader_messages=reader_messages,
        reader_max_tokens=4096,
        reader_budget_source="PersonaMem-v2 config.yaml max_tokens 4096 (its OpenAI call sets none, its "
        "Claude call 4096); the answer reasons before its 'Final Answer: X' line",
    )
)
