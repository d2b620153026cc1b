"""PersonaMem-v2 loader: `benchmark.csv` + per-persona chat-history JSON -> Sequences + EvalItems.

Published layout (docs/evaluation_benchmarks.md): Hugging Face dataset `bowen-upenn/PersonaMem-v2`,
`benchmark/text/benchmark.csv` (also `train.csv` / `val.csv`, and `benchmark/multimodal/`), one row per
user query, written by the repo's `data_generation/prepare_benchmark.py`. Columns this loader reads:
`persona_id`, `chat_history_32k_link` (or `_128k_`), `user_query` (a Python dict literal
`{'role': 'user', 'content': ...}`), `correct_answer`, `incorrect_answers` (JSON list), `pref_type`, and
`related_conversation_snippet` (JSON list of messages) for evidence. The link is a path relative to the
dataset root (`data/chat_history_32k/chat_history_<stamp>_persona<N>.json`), a JSON object
`{"metadata": {...}, "chat_history": [{"role", "content"}, ...]}` whose first message is the system
prompt holding the persona profile.

One persona = one Sequence (its whole chat history, one undated session); each CSV row = one EvalItem,
a multiple-choice question: the options are shuffled with a stable per-row seed and rendered into
`question`, the correct option ("B. <text>") is `answer`.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from data_pipeline.loaders import EvidenceIssue, LoadResult, _log_issues
from data_pipeline.schema import EvalItem, RecordError, Sequence, Session, Turn

SIZES = ("32k", "128k")
REQUIRED_COLUMNS = ("persona_id", "user_query", "correct_answer", "incorrect_answers", "pref_type")
HISTORY_SESSION_ID = "chat_history"  # the history has no session boundaries or dates: one session
# the published MCQ instruction (PersonaMem-v2 `inference.py`, `create_mcq_options`); the reader prompt
# of reward/eval_personamem.py sends the question with it verbatim
MCQ_INSTRUCTION = "Please choose the best answer from the following options:"
MCQ_TAIL = (
    "Think step by step about which answer best fits the user's query and conversation context. "
    "Provide your reasoning first, then give your final answer as 'Final Answer: [Letter]'"
)


def load_personamem_v2(
    path: str | Path, source: str = "personamem_v2", size: str = "32k", history_root: str | Path | None = None
) -> LoadResult:
    """`size`: which chat history the rows link to ("32k" or "128k"). `history_root`: the dataset root
    the links are relative to; None = the nearest folder above the CSV where the link exists."""
    path = Path(path)
    if size not in SIZES:
        raise ValueError(f"personamem_v2: size {size!r} not in {SIZES}")
    link_col = f"chat_history_{size}_link"
    rows = _read_rows(path, (*REQUIRED_COLUMNS, link_col))
    out = LoadResult()
    by_persona: dict[str, tuple[str, Sequence]] = {}
    for n, row in rows:
        where = f"{path} row {n} (persona {row['persona_id']!r})"
        persona = row["persona_id"].strip()
        if not persona:
            raise RecordError(f"{where}: field 'persona_id' is empty")
        link = row[link_col].strip()
        if not link:
            raise RecordError(f"{where}: field '{link_col}' is empty")
        seq_id = f"{source}/{persona}"
        if persona not in by_persona:
            seq = _load_history(path, _resolve(path, link, history_root, where), seq_id, source, where)
            by_persona[persona] = (link, seq)
            out.sequences.append(seq)
        known_link, seq = by_persona[persona]
        if link != known_link:
            raise RecordError(f"{where}: field '{link_col}' = {link!r}, but earlier rows link {known_link!r}")

        query = _parse_query(row["user_query"], where)
        correct = row["correct_answer"]
        if not correct.strip():
            raise RecordError(f"{where}: field 'correct_answer' is empty")
        wrong = _parse_str_list(row["incorrect_answers"], where, "incorrect_answers")
        letters, options = mcq_options(persona, query, correct, wrong)
        question = f"{query}\n\n{MCQ_INSTRUCTION}\n\n" + "\n".join(
            f"{a}. {o}" for a, o in zip(letters, options, strict=True)
        )
        question += f"\n\n{MCQ_TAIL}"
        right = letters[options.index(correct)]
        # k = the row's position in the CSV (0-based data row): items stay traceable to the source file
        item_id = f"{seq_id}/q{n:03d}"
        evidence, issues = _snippet_evidence(path, row, seq, item_id, query, where)
        out.eval_items.append(
            EvalItem(
                item_id=item_id,
                benchmark=source,
                sequence_id=seq_id,
                question=question,
                answer=f"{right}. {correct}",
                category=row["pref_type"],
                evidence_turn_ids=evidence,
                evidence_issues=[i.short() for i in issues],
            )
        )
        out.issues += issues
    _log_issues(path, out.issues)
    return out


def mcq_options(persona: str, query: str, correct: str, wrong: list[str]) -> tuple[list[str], list[str]]:
    """Letters and shuffled options. Upstream seeds the shuffle with Python's salted `hash()` of
    "<persona_id>_<query>", which changes per process; we seed with sha256 of the same key."""
    seed = int.from_bytes(hashlib.sha256(f"{persona}_{query}".encode()).digest()[:8], "big")
    options = [correct, *wrong]
    random.Random(seed).shuffle(options)
    return [chr(65 + i) for i in range(len(options))], options


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.exists():
        raise RecordError(f"{path}: no such file")
    if path.is_dir():
        raise RecordError(f"{path}: is a directory; pass the benchmark CSV (benchmark/text/benchmark.csv)")
    csv.field_size_limit(sys.maxsize)  # expanded_persona / snippet cells exceed csv's 128 KiB default
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise RecordError(f"{path}: not a PersonaMem-v2 CSV, missing column(s) {missing}")
        try:
            rows = list(enumerate(reader))
        except csv.Error as e:
            raise RecordError(f"{path}: malformed CSV at line {reader.line_num}: {e}") from None
    for n, row in rows:
        if None in row or any(row.get(c) is None for c in columns):
            raise RecordError(
                f"{path} row {n}: has {len(row)} cells, not the header's {len(reader.fieldnames)}"
            )
    return rows


def _resolve(csv_path: Path, link: str, root: str | Path | None, where: str) -> Path:
    if Path(link).is_absolute():
        candidates = [Path(link)]
    elif root is not None:
        candidates = [Path(root) / link]
    else:
        candidates = [p / link for p in csv_path.resolve().parents]
    for c in candidates:
        if c.is_file():
            return c
    looked = str(candidates[0]) if len(candidates) == 1 else f"any folder above {csv_path}"
    raise RecordError(f"{where}: chat history {link!r} not found (looked in {looked}); pass history_root")


def _load_history(csv_path: Path, file: Path, seq_id: str, source: str, where: str) -> Sequence:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(
            f"{where}: chat history {file}: not valid JSON at line {e.lineno}: {e.msg}"
        ) from None
    # published: {"metadata", "chat_history"}; upstream's reader also accepts a bare message list
    messages = data.get("chat_history") if isinstance(data, dict) else data
    if not isinstance(messages, list):
        raise RecordError(f"{where}: chat history {file}: no 'chat_history' message list")
    turns = []
    for i, m in enumerate(messages):
        p = f"{file} chat_history[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise RecordError(f"{where}: {p} is not a {{role, content}} message")
        if i == 0 and m["role"] == "system":
            continue  # the persona profile; the paper's memory agent drops it too (MemAgent data_preprocess)
        turns.append(Turn(turn_id=f"m{i}", speaker=m["role"], text=_text(m["content"], where, p)))
    return Sequence(
        sequence_id=seq_id,
        source=source,
        sessions=[Session(session_id=HISTORY_SESSION_ID, date="", turns=turns)],
        speakers=["user", "assistant"],
    )


def _text(content: Any, where: str, p: str) -> str:
    """Message content: a string, or (multimodal histories) a list of {"type": "text"|"image_url"} parts,
    whose text parts are kept; images are not shown to the text-only writer."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(c.get("text", "")) for c in content if isinstance(c, dict) and c.get("type") == "text"
        )
    raise RecordError(f"{where}: {p}.content must be a string or a list of parts")


def _parse_literal(raw: str, where: str, field: str) -> Any:
    # the CSV holds JSON for lists and a Python dict literal for user_query (csv wrote str(dict))
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise RecordError(
                f"{where}: field '{field}' is neither JSON nor a Python literal: {raw[:80]!r}"
            ) from None


def _parse_query(raw: str, where: str) -> str:
    obj = _parse_literal(raw, where, "user_query")
    if not (isinstance(obj, dict) and isinstance(obj.get("content"), str) and obj["content"].strip()):
        raise RecordError(f"{where}: field 'user_query' must be {{'role': 'user', 'content': <text>}}")
    return obj["content"]


def _parse_str_list(raw: str, where: str, field: str) -> list[str]:
    obj = _parse_literal(raw, where, field) if raw.strip() else []
    if not isinstance(obj, list) or not obj or not all(isinstance(x, str) for x in obj):
        raise RecordError(f"{where}: field '{field}' must be a non-empty JSON list of strings")
    return obj


def _snippet_evidence(
    path: Path, row: dict[str, str], seq: Sequence, item_id: str, query: str, where: str
) -> tuple[list[str], list[EvidenceIssue]]:
    """Turns of the history holding the `related_conversation_snippet` messages (exact text match)."""
    raw = (row.get("related_conversation_snippet") or "").strip()
    persona = row["persona_id"]
    if not raw:
        return [], [
            EvidenceIssue(str(path), persona, item_id, query, "", "empty related_conversation_snippet")
        ]
    snippet = _parse_literal(raw, where, "related_conversation_snippet")
    if not isinstance(snippet, list):
        raise RecordError(f"{where}: field 'related_conversation_snippet' must be a list of messages")
    by_text: dict[str, list[str]] = {}
    for t in seq.turns():
        by_text.setdefault(t.text.strip(), []).append(t.turn_id)
    ids: list[str] = []
    for m in snippet:
        content = m.get("content") if isinstance(m, dict) else None
        text = _text(content, where, "related_conversation_snippet").strip() if content is not None else ""
        ids += [i for i in by_text.get(text, []) if i not in ids]
    if ids:
        return ids, []
    return [], [
        EvidenceIssue(str(path), persona, item_id, query, raw[:200], "snippet matches no history turn")
    ]
