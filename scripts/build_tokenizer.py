"""Train the project's small byte-level BPE tokenizer offline and write it to hymem_train/assets/tokenizer.

    .venv/bin/python scripts/build_tokenizer.py            # rebuild corpus + tokenizer (deterministic)
    .venv/bin/python scripts/build_tokenizer.py --check    # exit 1 if the shipped files differ

The corpus (hymem_train/assets/tokenizer_corpus.txt) is written by data_pipeline/tokenizer_corpus.py; the
tokenizer is trained by hymem_train/models/tokenizer.py.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from data_pipeline.tokenizer_corpus import write_corpus
from hymem_train.models.tokenizer import ASSET_DIR, CORPUS_PATH, train_tokenizer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="verify the shipped tokenizer is reproducible")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            train_tokenizer(CORPUS_PATH, Path(d))
            same = (Path(d) / "tokenizer.json").read_text() == (ASSET_DIR / "tokenizer.json").read_text()
        print("tokenizer reproducible" if same else "tokenizer differs from shipped copy")
        return 0 if same else 1
    write_corpus(CORPUS_PATH)
    tok = train_tokenizer(CORPUS_PATH, ASSET_DIR)
    print(f"wrote {ASSET_DIR} (vocab {len(tok)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
