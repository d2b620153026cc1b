"""The demo pipeline's own pieces (scripts/demo_lib/pipeline.py): the oracle demonstrations through the
real native harness lose no gold fact and update the right memory; the OPD/RL prompt split shares no
sequence with the SFT split; the report reads first/last values from the runs' metrics."""

import json

from data_pipeline.store import BuiltDataset
from harnesses.registry import HarnessConfig
from hymem_train.models.tokenizer import default_tokenizer
from scripts.demo_lib.pipeline import build_data, first_last, growth_overrides, oracle_sft_data, write_report


def _hcfg():
    h = HarnessConfig(framework="native", in_process=True)
    h.native.max_tokens, h.native.num_context_memories = 80, 4
    return h


def test_oracle_demonstrations_cover_every_fact_and_update_by_id(tmp_path):
    ds_path = build_data(
        tmp_path / "train", num_sequences=4, num_chunks=6, window=3, seed=0, unique_names=False
    )
    ds = BuiltDataset(ds_path)
    counts = oracle_sft_data(ds_path, tmp_path / "sft" / "data.jsonl", _hcfg(), search_k=5)
    tok = default_tokenizer()
    rows = [json.loads(x) for x in (tmp_path / "sft" / "data.jsonl").read_text().splitlines()]
    assert len(rows) == counts["writer_segments"] + counts["reader_examples"]
    assert counts["writer_segments"] == len(ds.tables["chunks"])  # one write per chunk
    assert counts["reader_examples"] == len(ds.tables["probes"])
    ops = []
    for r in rows:
        if "New conversation" in tok.decode(r["prompt_ids"]):
            ops += json.loads(tok.decode(r["response_ids"], skip_special_tokens=True))["ops"]
    written = [o["text"] for o in ops if o["op"] in ("ADD", "UPDATE")]
    facts = ds.tables["facts"]
    assert sorted(written) == sorted(f.text for f in facts)  # every gold fact once, nothing invented
    n_updates = sum(bool(f.supersedes) for f in facts)
    assert n_updates > 0 and sum(o["op"] == "UPDATE" for o in ops) == n_updates
    assert all(isinstance(o["id"], int) for o in ops if o["op"] == "UPDATE")
    # the reader examples answer from the oracle bank; traps answer "no such record"
    reader = [r for r in rows if "New conversation" not in tok.decode(r["prompt_ids"])]
    refs = [tok.decode(r["response_ids"], skip_special_tokens=True).strip() for r in reader]
    assert len(reader) == counts["reader_examples"] and "no such record" in refs


def test_prompt_split_is_disjoint_from_the_sft_split(tmp_path):
    sft = BuiltDataset(
        build_data(tmp_path / "a", num_sequences=6, num_chunks=6, window=3, seed=0, unique_names=False)
    )
    prompts = BuiltDataset(
        build_data(tmp_path / "b", num_sequences=6, num_chunks=6, window=3, seed=2000, unique_names=False)
    )

    def convs(ds):
        return {tuple(t.text for t in c.turns) for c in ds.tables["chunks"]}

    def facts(ds):
        return {(f.sequence_id, f.text) for f in ds.tables["facts"]}

    assert not convs(sft) & convs(prompts)
    assert len(facts(sft)) > 10 and facts(sft) != facts(prompts)


def test_report_reads_first_and_last_values(tmp_path):
    for name, rows in {
        "opd": [{"step": 0, "eval/reverse_kl": 0.8}, {"step": 1, "distill/reverse_kl_topk": 0.6},
                {"step": 2, "eval/reverse_kl": 0.5, "distill/reverse_kl_topk": 0.4}],
        "rl": [{"step": 0, "eval/s": 0.30, "eval/prm": 0.30, "eval/pen": 0.02},
               {"step": 1, "reward/s": 0.2, "reward/zero_advantage_share": 0.5},
               {"step": 2, "reward/s": 0.4, "reward/zero_advantage_share": 0.3, "eval/s": 0.36, "eval/prm": 0.35,
                "eval/pen": 0.01}],
    }.items():  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert first_last([{"a": 1}, {"b": 2}, {"a": 3}], "a") == (1, 3) and first_last([], "a") is None
    counts = {"train_sequences": 4, "prompt_sequences": 4, "eval_sequences": 2, "writer_segments": 24,
              "reader_examples": 30}  # fmt: skip
    out = write_report(tmp_path, counts, {"total": 1.0})
    assert out["kl"] == (0.8, 0.5) and out["reward"] == (0.30, 0.36) and out["prm"] == (0.30, 0.35)
    text = (tmp_path / "report.md").read_text()
    assert "0.800 (step 0) -> 0.500" in text and "0.300 (step 0) -> 0.360" in text
    assert "mean over steps: 0.40" in text and (tmp_path / "report.png").stat().st_size > 0
    assert out["pen"] == (0.02, 0.01) and "pen[t]: 0.020 -> 0.010" in text


def test_growth_bounds_for_rl_come_from_the_opd_writes(tmp_path):
    """The demo's RL gets bounds calibrated from the OPD run's bank sizes; without enough recorded
    writes it keeps the config's and the report says why."""
    import random

    from reward.bank_sizes import BANK_SIZES_FILE

    args, line = growth_overrides(tmp_path)
    assert args == [] and "not calibrated" in line and "no bank sizes recorded" in line
    rnd, rows = random.Random(0), []
    for i in range(30):  # 30 rollouts x 3 chunks, first writes of 8-24 tokens, then steady growth
        sizes, b = [], 0
        for _ in range(3):
            b += rnd.randint(8, 24)
            sizes.append(b)
        rows.append({"trajectory_id": f"t{i}", "harness": "native", "status": "ok", "parent_size_tokens": 0,
                     "size_tokens": sizes, "chunk_status": ["ok"] * 3, "step": 1})  # fmt: skip
    (tmp_path / BANK_SIZES_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    args, line = growth_overrides(tmp_path)
    kv = {k.rsplit(".", 1)[1]: v for k, v in (a.split("=") for a in args)}
    assert set(kv) == {"lower", "upper", "floor_tokens"} and 8 <= int(kv["floor_tokens"]) <= 24
    assert 1.0 <= float(kv["lower"]) < float(kv["upper"]) and "from 90 OPD writes" in line
    assert (tmp_path / "growth_bounds.yaml").read_text().count("native:") == 1
