"""The project's local tokenizer: byte-level BPE trained offline with `tokenizers` (no hub access).

It ships in hymem_train/assets/tokenizer (built by scripts/build_tokenizer.py from the corpus next to it)
and loads with `AutoTokenizer.from_pretrained(path)`. Byte-level BPE can encode any text, so the
small corpus only affects compression, never coverage.

Chat format (ChatML-style): `<|im_start|>{role}\n{content}<|im_end|>\n`; generation prompt
`<|im_start|>assistant\n`; the assistant turn ends with `<|im_end|>`, which is the EOS the engines
stop on. `<|pad|>` pads; `<|endoftext|>` separates documents in SFT packing.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
CORPUS_PATH = Path(__file__).resolve().parent.parent / "assets" / "tokenizer_corpus.txt"
REPO_HINT = Path(__file__).resolve().parents[2]  # repo root (scripts/ lives there)
VOCAB_SIZE = 896  # BPE target = the tiny presets' vocab (TINY_VOCAB): every id has an embedding row
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_corpus(path: Path = CORPUS_PATH, seed: int = 0, num_lines: int = 6000) -> None:
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
    from data_pipeline.synthetic import CHITCHAT, FRIENDS, GREETINGS, PEOPLE, REPLIES, SLOTS

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


def train_tokenizer(corpus: Path = CORPUS_PATH, out_dir: Path = ASSET_DIR) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `corpus`, attach the chat template and save as an HF tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str | Path = ASSET_DIR) -> PreTrainedTokenizerFast:
    """Load a tokenizer from a local directory (never the hub)."""
    p = Path(path)
    if not (p / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer.json under {p} (run scripts/build_tokenizer.py)")
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


@lru_cache(maxsize=1)
def default_tokenizer() -> PreTrainedTokenizerFast:
    return load_tokenizer(ASSET_DIR)
