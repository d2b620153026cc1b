"""`make demo`: the main job on the embedded default (tiny models, 2 CPU cores).

    .venv/bin/python scripts/demo.py [hydra overrides...]

The logic lives in hymem_train/demo.py.
"""

import logging
import sys

from hymem_train.demo import run_gateway_demo

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_gateway_demo(sys.argv[1:])
