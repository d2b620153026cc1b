"""Is there a value-copying signal in OPD's teacher top-k? A diagnostic on the ledger testbed.

    .venv/bin/python scripts/opd_signal.py --dumps RUN/dumps --student CKPT [--student CKPT2 ...]

Reads OPD step dumps (`rollout.dump=true`: each segment the student sampled, with the teacher's top-k
at every response position), finds every position where the student begins a record's value for an
attribute the chunk states ("city: " then the value), and reports, over those positions: how often the
student's sampled value was the one the chunk states, the teacher's probability of that value there
(the mass of its top-k tokens that begin the value), and each given student checkpoint's own
probability of it at the same prefix (one forward pass per segment). If the teacher puts most of its
mass on the stated value where the student wrote another, the distillation target carries the copy
skill and the student fails to learn it; if not, OPD has no value signal to follow.
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_VALUE_RE = re.compile(r'"text": "(?P<key>[a-z]+): ')


def stated_values(prompt: str) -> dict[str, tuple[str, str]]:
    """attribute -> (kind, value) the chunk's new conversation states (the last statement wins)."""
    from data_pipeline.ledger import parse_statement
    from data_pipeline.ledger_oracle import _LINE_RE

    out = {}
    for raw in prompt.rpartition("New conversation:")[2].splitlines():
        m = _LINE_RE.match(raw.strip())
        st = parse_statement(m.group("text")) if m else None
        if st is not None:
            kind, attr, value = st
            out[attr] = (kind, value)
    return out


def char_spans(tok, ids: list[int]) -> list[tuple[int, int]]:
    """Each token's (start, end) in the decoded text (decoding prefixes: exact for byte-level BPE)."""
    spans, prev = [], 0
    for j in range(len(ids)):
        end = len(tok.decode(ids[: j + 1]))
        spans.append((prev, end))
        prev = end
    return spans


def value_positions(tok, seg) -> list[dict]:
    """Every response position where the student starts the value of an attribute the chunk states."""
    prompt = tok.decode(seg.prompt_ids)
    stated = stated_values(prompt)
    text = tok.decode(seg.response_ids)
    spans = char_spans(tok, seg.response_ids)
    out = []
    for m in _VALUE_RE.finditer(text):
        if m.group("key") not in stated:
            continue
        kind, value = stated[m.group("key")]
        at = m.end()
        j = next((j for j, (a, b) in enumerate(spans) if a <= at < b), None)
        if j is None:
            continue
        lead = text[spans[j][0] : at]  # what token j carries before the value (e.g. a space)
        out.append({"j": j, "lead": lead, "target": lead + value, "kind": kind, "value": value})
    return out


def consistent(piece: str, lead: str, target: str) -> bool:
    """A token that begins the stated value at this position (covers at least one of its characters)."""
    return len(piece) > len(lead) and (target.startswith(piece) or piece.startswith(target))


def main() -> None:
    import torch

    from hymem_train.callbacks.dumps import StepDumps
    from hymem_train.models.tokenizer import default_tokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--dumps", required=True, help="an OPD run's dumps/ directory")
    ap.add_argument(
        "--student", action="append", default=[], help="HF checkpoint(s) to score the same prefixes"
    )
    ap.add_argument("--out", default="", help="write the summary JSON here too")
    args = ap.parse_args()
    tok = default_tokenizer()
    steps = sorted(int(p.stem.split("_")[1]) for p in Path(args.dumps).glob("step_*.pt"))
    dumps = StepDumps(Path(args.dumps).parent)
    items = [it for s in steps for it in dumps.load(s)]
    vocab = {}
    rows = []
    for it in items:
        seg = it.segment
        for pos in value_positions(tok, seg):
            j = pos["j"]
            ids, lps = it.teacher_topk_ids_RK[j], it.teacher_topk_logprobs_RK[j]
            pieces = [vocab.setdefault(int(t), tok.decode([int(t)])) for t in ids]
            ok = [consistent(p, pos["lead"], pos["target"]) for p in pieces]
            sampled = tok.decode([seg.response_ids[j]])
            rows.append(
                {
                    "kind": pos["kind"],
                    "student_right": consistent(sampled, pos["lead"], pos["target"]),
                    "teacher_p": float(sum(math.exp(lp) for lp, c in zip(lps, ok, strict=True) if c)),
                    "teacher_top1_right": bool(ok[int(max(range(len(lps)), key=lambda k: lps[k]))]),
                    "item": it,
                    "pos": pos,
                }
            )
    for ckpt in args.student:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        by_item: dict[int, list[dict]] = {}
        for r in rows:
            by_item.setdefault(id(r["item"]), []).append(r)
        with torch.no_grad():
            for group in by_item.values():
                seg = group[0]["item"].segment
                P = len(seg.prompt_ids)
                ids = torch.tensor([list(seg.prompt_ids) + list(seg.response_ids)])
                logp = torch.log_softmax(model(ids).logits[0].float(), -1)
                for r in group:
                    pos = r["pos"]
                    row = logp[P - 1 + pos["j"]]
                    top = torch.topk(row, 200)
                    mass = sum(
                        math.exp(float(lp))
                        for lp, t in zip(top.values, top.indices, strict=True)
                        if consistent(
                            vocab.setdefault(int(t), tok.decode([int(t)])), pos["lead"], pos["target"]
                        )
                    )
                    r[f"p:{ckpt}"] = mass
    summary = {"dumps": args.dumps, "segments": len(items), "value_positions": len(rows)}
    for name, sel in (
        ("all", rows),
        ("student wrong", [r for r in rows if not r["student_right"]]),
        ("student right", [r for r in rows if r["student_right"]]),
    ):
        if not sel:
            continue
        s = {
            "n": len(sel),
            "student_right_share": sum(r["student_right"] for r in sel) / len(sel),
            "teacher_p_mean": sum(r["teacher_p"] for r in sel) / len(sel),
            "teacher_top1_right_share": sum(r["teacher_top1_right"] for r in sel) / len(sel),
            "kinds": {k: sum(r["kind"] == k for r in sel) for k in sorted({r["kind"] for r in sel})},
        }
        for ckpt in args.student:
            s[f"student_p_mean:{ckpt}"] = sum(r[f"p:{ckpt}"] for r in sel) / len(sel)
        summary[name] = s
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
