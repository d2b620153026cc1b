"""The EverOS venv can get tiktoken's o200k_base with no network (byte-identical, hash-checked)."""

import base64
import os
import struct
import subprocess

import pytest

from harnesses.registry import REPO_ROOT
from harnesses.tiktoken_seed import quicktok_to_tiktoken

EVEROS_PY = REPO_ROOT / ".venvs" / "everos" / "bin" / "python"


def test_quicktok_layout_converts_by_hand():
    vocab = struct.pack("<I", 2) + struct.pack("<H", 1) + b"a" + struct.pack("<I", 0)
    vocab += struct.pack("<H", 2) + b"\xff\x00" + struct.pack("<I", 7)
    assert quicktok_to_tiktoken(vocab) == b"YQ== 0\n" + base64.b64encode(b"\xff\x00") + b" 7\n"
    with pytest.raises(ValueError, match="trailing bytes"):
        quicktok_to_tiktoken(vocab + b"x")


@pytest.mark.skipif(
    not EVEROS_PY.exists(), reason=f"{EVEROS_PY} missing: run `scripts/make_harness_venvs.sh everos`"
)
def test_seeded_cache_serves_o200k_offline(tmp_path):
    code = (
        "import sys, tiktoken; from harnesses.tiktoken_seed import seed_o200k; seed_o200k(sys.argv[1]);"
        "enc = tiktoken.get_encoding('o200k_base'); print(enc.n_vocab, len(enc.encode('hello world')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TIKTOKEN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [str(EVEROS_PY), "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["200019", "2"]
