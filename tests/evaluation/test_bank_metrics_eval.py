"""The bound writers (`kind: empty`, `kind: gold`) and the bank metrics of `python -m hymem_train.evaluate`
on a tiny ledger-world dataset in the native harness: the gold bank recalls every gold fact, the empty
bank none, and a writer that stores small talk loses false-memory resistance (bank_metrics.json / .md).
The reader is the extractive instrument served as a stand-in endpoint (no model)."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.ledger_oracle import Flaws, LedgerOracle
from data_pipeline.store import BuiltDataset
from harnesses.registry import HarnessConfig
from hymem_train.config import compose, to_typed
from hymem_train.evaluate import evaluate
from hymem_train.evaluation.config import MatrixConfig, WriterConfig
from hymem_train.evaluation.matrix import HarnessPlan, check_bound_writers, plan_matrix
from hymem_train.run_config import EvaluateConfig
from reward.instrument import extractive_answer, parse_reader_prompt
from tests.doubles.openai_server import StandInServer


def build_data(out: Path, world: str) -> Path:
    outs, _ = build(
        load_config(
            [
                f"data.synthetic.world={world}",
                f"out_dir={out}",
                "data.name=bank_metrics",
                "data.synthetic.num_sequences=3",
                "data.synthetic.num_chunks_per_sequence=5",
                "data.synthetic.num_chunks_per_window=5",
                "data.synthetic.seed=11",
                "~data.profiles.hy_memory",
                "+data.profiles={native: {mode: session, max_tokens: 0, num_chunks_per_window: 5, tokenizer_path: ''}}",
            ]
        )
    )
    return outs["native"]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    return build_data(tmp_path_factory.mktemp("ledger"), "ledger")


def user_text(body):
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")


def ledger_reader(body):
    """The extractive instrument over the records the reader prompt shows (served as a plain endpoint here)."""
    return extractive_answer(*parse_reader_prompt(user_text(body)))


def talker(body):
    return LedgerOracle(Flaws(store_small_talk=1.0))(user_text(body))


def overrides(data, out, rd, tk):
    return [
        "+exp=evaluate_locomo_sample",
        "~harnesses.mem0",
        "~harnesses.hy_memory",
        "harnesses.native.in_process=true",
        "harnesses.native.native.max_tokens=512",
        f"data.per_harness.native={data}",
        f"writers=[{{name: empty, kind: empty}}, {{name: gold, kind: gold}}, {{name: talker, base_url: '{tk.base_url}', model: talker}}]",
        f"protocol.reader.base_url={rd.base_url}",
        "local_reader=false",
        "protocol.judge_mode=protocol",
        "subsample=all",
        "bootstrap_resamples=200",
        "parallel_builds=1",
        f"run.output_dir={out}",
    ]


@pytest.mark.slow
def test_bound_writers_and_bank_metrics_end_to_end(ledger, tmp_path):
    with StandInServer(ledger_reader) as rd, StandInServer(talker) as tk:
        cfg = to_typed(compose("evaluate", overrides(ledger, tmp_path, rd, tk)), EvaluateConfig)
        res = evaluate(cfg, progress=False)
        talker_calls = len(tk.chat_requests())
    out = Path(res["out"])
    md = (out / "bank_metrics.md").read_text()
    assert res["bank_metrics_md"] == str(out / "bank_metrics.md")
    doc = json.loads((out / "bank_metrics.json").read_text())["harnesses"]["native"]
    assert len(doc["sequences"]) == 3 and not doc["excluded_sequences"]
    gold, empty, talk = (doc["writers"][w] for w in ("gold", "empty", "talker"))
    assert gold["memory_recall"]["value"] == 1.0 and empty["memory_recall"]["value"] == 0.0
    assert gold["target_precision"]["value"] == 1.0 and empty["target_precision"]["value"] is None
    assert gold["false_memory_resistance"]["value"] == 1.0 and gold["update_correct"]["value"] == 1.0
    assert gold["restated_once"]["value"] == 1.0 and gold["history_kept"]["value"] == 1.0
    assert empty["bank_records"]["value"] == 0.0 and empty["false_memory_resistance"]["value"] == 1.0
    assert talk["memory_recall"]["value"] == 1.0 and talk["false_memory_resistance"]["value"] < 1.0
    assert talk["target_precision"]["value"] < 1.0
    # the op mix from the builds (the empty writer applied no op: no share)
    assert (
        gold["op_add"]["value"] > 0
        and gold["op_invalid"]["value"] == 0.0
        and empty["op_add"]["value"] is None
    )
    # pairs: consecutive writers (later - earlier), then each writer vs the first
    pairs = {(d["a"], d["b"]) for d in doc["differences"]}
    assert pairs == {("gold", "empty"), ("talker", "gold"), ("talker", "empty")}
    d = next(
        d for d in doc["differences"] if (d["a"], d["b"], d["metric"]) == ("gold", "empty", "memory_recall")
    )
    assert d["value"] == 1.0 and d["lo"] > 0
    assert "| gold |" in md and "| empty |" in md and "| gold - empty |" in md and "Memory recall" in md
    # the bound rows appear in the swap table like any writer; the gold bank answers what the empty one cannot
    table = res["table"]
    assert "| gold |" in res["table_md"] and "| empty |" in res["table_md"]
    assert "gold bank (bound" in res["table_md"] and "store nothing (bound" in res["table_md"]
    assert table.average["gold"].mean > table.average["empty"].mean
    builds = sorted((out / "cache" / "empty" / "native").glob("*/build.json"))
    assert len(builds) == 3 and all(json.loads(b.read_text())["llm_calls"] == 0 for b in builds)
    assert talker_calls == 3 * 5  # one write call per chunk, none at read time
    ep = json.loads((out / "endpoints.json").read_text())["write"]
    assert ep["empty"] is None and ep["gold"]["served_requests"] == 3 * 5


def test_bound_writer_validation(ledger, tmp_path):
    with pytest.raises(ValueError, match="kind='oracle'"):
        WriterConfig(name="x", kind="oracle").validate()
    with pytest.raises(ValueError, match="kind=empty takes neither"):
        WriterConfig(name="x", kind="empty", checkpoint="ckpt").validate()
    WriterConfig(name="x", kind="gold").validate()
    gold = [WriterConfig(name="g", kind="gold")]
    native, mem0 = HarnessConfig(framework="native", in_process=True), HarnessConfig(framework="mem0")
    # the gold writer knows the write prompts of native, mem0 and hy-memory's chat scene only
    for other in (
        HarnessConfig(framework="memoryos", scene="general_text"),
        HarnessConfig(framework="hy_memory", scene="working"),
    ):
        bad = MatrixConfig(writers=gold, harnesses={"native": native, "x": other})
        bad.data.path = str(ledger)
        with pytest.raises(ValueError, match="are not among them"):
            bad.validate()
    # known write paths validate; the data is checked with the plan: ledger data is written by native only
    cfg = MatrixConfig(writers=gold, harnesses={"native": native, "mem0": mem0}, subsample="all")
    cfg.data.path = str(ledger)
    cfg.validate()
    with pytest.raises(ValueError, match="native harness only, not mem0"):
        plan_matrix(cfg)
    cfg = MatrixConfig(writers=gold, harnesses={"native": native}, subsample="all")
    cfg.data.path = str(ledger)
    assert plan_matrix(cfg)


def test_gold_writer_refuses_data_without_gold_and_two_datasets_in_one_framework(ledger, tmp_path):
    """The gold writer finds a chunk by prompt alone: real data with nothing to write is refused, and so is
    a framework whose harnesses write two datasets (their prompts could not be told apart)."""
    gold = [WriterConfig(name="g", kind="gold")]
    native = HarnessConfig(framework="native", in_process=True)
    cfg = MatrixConfig(writers=gold, harnesses={"a": native, "b": native})
    empty = SimpleNamespace(root=tmp_path / "empty", tables={"sequences": [], "chunks": [], "facts": []})
    with pytest.raises(ValueError, match=r"a: .*empty has no gold memories"):
        check_bound_writers(cfg, [HarnessPlan("a", empty, {}, [])])
    ds = BuiltDataset(ledger)
    check_bound_writers(cfg, [HarnessPlan("a", ds, {}, []), HarnessPlan("b", ds, {}, [])])
    other = BuiltDataset(shutil.copytree(ledger, tmp_path / "copy"))
    with pytest.raises(ValueError, match=r"harnesses of one framework write different datasets \{'native'"):
        check_bound_writers(cfg, [HarnessPlan("a", ds, {}, []), HarnessPlan("b", other, {}, [])])


def test_gold_engine_never_cuts_a_reply(ledger):
    """A gold reply cut at the token budget would not write the gold bank: the request fails instead."""
    from hymem_train.engines.base import SamplingParams
    from hymem_train.evaluation.bound import gold_engine

    eng, tok = gold_engine({"native": BuiltDataset(ledger)}, 4096)
    prompt = tok.encode(
        "Session session_1, date 2023-01-02.\nExisting memories:\n(none)\n\nNew conversation:\n"
        "user: Alice: My dog is Rex.\nuser: Sam: Nice!"
    )
    (out,) = eng.generate([prompt], [SamplingParams(max_tokens=512)])
    assert out.response_ids[-1] == tok.eos_token_id
    assert json.loads(tok.decode(out.response_ids[:-1])) == {"ops": [{"op": "ADD", "text": "dog: Rex"}]}
    with pytest.raises(ValueError, match="over the request's max_tokens 8"):
        eng.generate([prompt], [SamplingParams(max_tokens=8)])
