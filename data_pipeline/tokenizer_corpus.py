"""The text corpus the project's tokenizer is trained on (hymem_train/assets/tokenizer_corpus.txt).

Data, not model code: generic chat turns, facts and JSON memory operations, plus the synthetic
generator's own domain (its people, slots and small talk, from data_pipeline.synthetic), so the demo's
words are single tokens. scripts/build_tokenizer.py writes it and trains
hymem_train.models.tokenizer on it; deterministic (same seed -> byte-identical file).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from data_pipeline.synthetic import CHITCHAT, FRIENDS, GREETINGS, PEOPLE, REPLIES, SLOTS


def write_corpus(path: Path, seed: int = 0, num_lines: int = 6000) -> None:
    """A deterministic English corpus of chat turns, facts and JSON memory operations.

    It covers the text the demo model reads and writes (conversations, memory prompts, JSON ops),
    so the tiny vocab compresses it well.
    """
    rng = random.Random(seed)
    names = "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Kate Leo Maria Nina Oscar Paul".split()
    things = (
        "dog cat sister brother job car city hobby book movie song team school friend garden bike "
        "phone laptop coffee tea breakfast dinner trip flight hotel museum concert doctor gym"
    ).split()
    values = (
        "Rex Luna Paris Tokyo Berlin Lisbon Boston Seattle blue green red piano guitar chess tennis "
        "soccer yoga painting Monday Tuesday Friday Sunday January March July October pizza sushi "
        "pasta tacos nurse teacher engineer designer lawyer chef Toyota Honda Tesla Python Rust"
    ).split()
    chit = [
        "Haha that's so funny!",
        "How are you doing today?",
        "Thanks, talk to you later.",
        "The weather is nice, isn't it?",
        "Good morning! Did you sleep well?",
        "Oh wow, I didn't know that.",
        "Sounds great, have fun!",
        "I'm just tired, nothing special.",
    ]
    ops = ["ADD", "UPDATE", "DELETE", "NONE"]
    lines: list[str] = []
    for i in range(num_lines):
        n, t, v = rng.choice(names), rng.choice(things), rng.choice(values)
        kind = i % 7
        if kind == 0:
            lines.append(f"{n}: My {t} is {v}. I told you about it on {rng.choice(values)}.")
        elif kind == 1:
            lines.append(f"{n}: {rng.choice(chit)}")
        elif kind == 2:
            lines.append(f"Q: What is {n}'s {t}? A: {v}.")
        elif kind == 3:
            op = rng.choice(ops)
            mem = {"op": op, "id": rng.randint(0, 99), "text": f"{n}'s {t} is {v}"}
            lines.append(json.dumps({"memories": [mem]}))
        elif kind == 4:
            lines.append(f"{n} moved from {rng.choice(values)} to {v} and changed the {t}.")
        elif kind == 5:
            lines.append(
                f"Existing memories: [{rng.randint(0, 9)}] {n}'s {t} is {v}. "
                "Return JSON operations ADD, UPDATE, DELETE or NONE for the new conversation chunk."
            )
        else:
            lines.append(
                f"On {rng.choice(values)} {rng.randint(1, 28)}, 20{rng.randint(10, 26)}, {n} said: {v}!"
            )
    lines += _synthetic_domain_lines(rng, num_lines // 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _synthetic_domain_lines(rng: random.Random, n: int) -> list[str]:
    """Turns, facts, probes and JSON ops of the synthetic generator's own domain (data_pipeline.synthetic).

    Why: the demo's tiny models learn from scratch in minutes on CPU. When a name or value ("plumber",
    "Milo") is split into 4-5 byte pieces, the writer must learn to copy multi-token spans before it can
    store a single fact, and it did not within the demo's budget (0/12 held-out values written). With
    the domain's words as single tokens, storing a fact is copying one token per slot.
    """
    out = []
    for _ in range(n):
        p, f, slot = rng.choice(PEOPLE), rng.choice(FRIENDS), rng.choice(SLOTS)
        v = rng.choice(slot.values)
        say = slot.update_say if slot.update_say and rng.random() < 0.3 else slot.say
        fact = (slot.update_fact if say == slot.update_say else slot.fact).format(p=p, v=v)
        chit, vals, trap_q = rng.choice(CHITCHAT)
        out.append(
            f"user: {f}: {rng.choice(GREETINGS).format(p=p)}\nuser: {p}: {say.format(v=v)}\n"
            f"user: {p}: {chit.format(v=rng.choice(vals))}\nuser: {f}: {rng.choice(REPLIES)}"
        )
        out.append(
            json.dumps(
                {"ops": [{"op": rng.choice(["ADD", "UPDATE"]), "id": rng.randint(1, 9), "text": fact}]}
            )
        )
        out.append(f"[{rng.randint(1, 9)}] (2023-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}) {fact}")
        out.append(f"Question: {rng.choice([slot.ask.format(p=p), trap_q.format(p=p)])} {v}")
    return out
