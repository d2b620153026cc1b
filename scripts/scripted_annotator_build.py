"""The data build with the tests' scripted annotator standing in for the annotator LLM (no GPU, no model).

    .venv/bin/python scripts/scripted_annotator_build.py data=hy_memory_rl_sample out_dir=runs/data/rl_sample
    .venv/bin/python scripts/scripted_annotator_build.py --fail context data=locomo_sample ...  # every call fails

Starts `tests.doubles.openai_server.StandInServer` with `tests.doubles.annotator.annotator_responder`
(well-formed PRM / ORM answers derived from each request: one fact, one recall probe and one trap per
chunk, one ORM question per window) on 127.0.0.1, then runs `python -m data_pipeline.build` with
`data.annotate=true` and the server as `annotator.base_url`. The counts it prints show the shape of an
annotated build (what the layout and stats hold), not the yield of a real annotator.
`--fail context|json` makes every call fail like a server with too small a context / without JSON output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_pipeline.build import main as build_main  # noqa: E402
from tests.doubles.annotator import annotator_responder, failing_override  # noqa: E402
from tests.doubles.openai_server import StandInServer  # noqa: E402


def main(argv: list[str]) -> int:
    override = None
    if argv[:1] == ["--fail"]:
        override, argv = failing_override(argv[1]), argv[2:]
    with StandInServer(annotator_responder(override)) as srv:
        return build_main(
            [
                *argv,
                "data.annotate=true",
                f"annotator.base_url={srv.base_url}",
                "annotator.model=scripted",
                "annotator.progress=false",
                "annotator.num_transport_retries=0",
            ]
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
