import subprocess
import sys

from transformers import AutoTokenizer

from hymem_train.models.tokenizer import ASSET_DIR, REPO_HINT, load_tokenizer


def test_loads_from_local_path_with_autotokenizer():
    tok = AutoTokenizer.from_pretrained(str(ASSET_DIR), local_files_only=True)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id


def test_roundtrip_any_text():
    tok = load_tokenizer()
    for text in ["Alice's dog is Rex.", '{"op": "ADD", "text": "x"}', "naïve café 東京 😀\n\ttabs"]:
        assert tok.decode(tok.encode(text)) == text


def test_chat_template_and_special_tokens():
    tok = load_tokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert (
        text
        == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(im_start) == 3  # special tokens are single ids, never split into bytes


def test_shipped_tokenizer_is_reproducible():
    r = subprocess.run(
        [sys.executable, "scripts/build_tokenizer.py", "--check"], cwd=REPO_HINT, capture_output=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_missing_tokenizer_dir_is_clear(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
