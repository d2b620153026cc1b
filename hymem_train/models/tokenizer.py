"""The project's local tokenizer: byte-level BPE trained offline with `tokenizers` (no hub access).

It ships in hymem_train/assets/tokenizer (built by scripts/build_tokenizer.py from the corpus next to it,
which data_pipeline/tokenizer_corpus.py writes) and loads with `AutoTokenizer.from_pretrained(path)`.
Byte-level BPE can encode any text, so the small corpus only affects compression, never coverage.

Chat format (ChatML-style): `<|im_start|>{role}\n{content}<|im_end|>\n`; generation prompt
`<|im_start|>assistant\n`; the assistant turn ends with `<|im_end|>`, which is the EOS the engines
stop on. `<|pad|>` pads; `<|endoftext|>` separates documents in SFT packing.
"""

from __future__ import annotations

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


def load_tokenizer(path: str | Path = ASSET_DIR, key: str = "") -> PreTrainedTokenizerFast:
    """Load a tokenizer from a local directory (never the hub). `key`: the config key the path came
    from, named in the error."""
    p = Path(path)
    if not (p / "tokenizer.json").exists():
        if p.resolve() == Path(ASSET_DIR).resolve():  # the shipped tokenizer is built, not downloaded
            raise FileNotFoundError(f"no tokenizer.json under {p} (run scripts/build_tokenizer.py)")
        where = f"{key}={str(path)!r}" if key else str(p)
        what = "no such directory" if not p.is_dir() else "no tokenizer.json in it"
        raise FileNotFoundError(
            f"{where}: {what}. Point it at a local checkpoint directory that holds the tokenizer files "
            "(tokenizer.json, tokenizer_config.json), or set model.tokenizer_path to one."
        )
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)


@lru_cache(maxsize=1)
def default_tokenizer() -> PreTrainedTokenizerFast:
    return load_tokenizer(ASSET_DIR)
