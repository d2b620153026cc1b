"""The bound rows on real data, as shipped (configs/exp/evaluate_locomo_bounds.yaml): the store-nothing
and gold-bank writers on the LoCoMo + LongMemEval-S slices in the native harness, mem0 and hy-memory,
read by the lexical instrument. The gold memories reach each bank through the framework's own write
path, so the two rows must differ in every harness; if they do not, the reader or the write path is
broken. The frameworks run in their venv sandboxes (skipped, with the command, where a venv is absent)."""

import json

import pytest

from harnesses.registry import REPO_ROOT
from hymem_train.config import compose, to_typed
from hymem_train.evaluate import evaluate
from hymem_train.run_config import EvaluateConfig

HARNESSES = ("native", "mem0", "hy_memory")


@pytest.mark.slow
def test_gold_bank_and_store_nothing_differ_in_every_harness(locomo_sample, tmp_path):
    for fw in HARNESSES[1:]:
        if not (REPO_ROOT / ".venvs" / fw / "bin" / "python").exists():
            pytest.skip(f".venvs/{fw} missing: run `scripts/make_harness_venvs.sh {fw}`")
    args = [
        "+exp=evaluate_locomo_bounds",
        f"data.per_harness.native={locomo_sample / 'mem0'}",
        f"data.per_harness.mem0={locomo_sample / 'mem0'}",
        f"data.per_harness.hy_memory={locomo_sample / 'hy_memory'}",
        "max_items_per_benchmark=4",  # one LoCoMo conversation and four LongMemEval haystacks
        "bootstrap_resamples=200",
        f"run.output_dir={tmp_path}",
    ]
    res = evaluate(to_typed(compose("evaluate", args), EvaluateConfig), progress=False)
    t = res["table"]
    for h in HARNESSES:
        gold, nothing = t.harness_scores[("gold", h)], t.harness_scores[("nothing", h)]
        assert gold.mean > nothing.mean + 10, (h, gold, nothing)
        assert (gold.writer_failures, gold.excluded) == (0, 0), (h, gold)
    assert t.diffs[("nothing", "gold", "Average")].hi < 0
    # every write prompt found the chunk it writes, so the gold bank holds every gold memory
    gold = json.loads((tmp_path / "eval" / "endpoints.json").read_text())["gold_replies"]["gold"]
    counts = gold["counts"]
    assert counts.get("unmatched", 0) == 0, gold["unmatched_prompts"]
    assert counts["memories"] > 0 and counts["mem0"] and counts["hy_memory"]
    assert "0 write prompt(s) matched no chunk" in res["table_md"]
