"""Reader self-checks (reward/reader_checks.py) on a real ledger-world dataset: the extractive reader
behind the frozen gateway passes all four, a reader that ignores the bank fails them by name, and the
RL stage and the evaluation serve the extractive reader and run the preflight before any work."""

import json
import types
from collections import Counter

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.ledger import ATTR_BY_NAME, NUM_TRAIN_VALUES
from data_pipeline.schema import NO_SUCH_RECORD
from data_pipeline.store import BuiltDataset, HarnessDatasets
from hymem_train.config import compose, to_typed
from hymem_train.engines.scripted import ScriptedEngine
from hymem_train.frozen_models import reader_preflight, start_frozen_models
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.gateway.local_reader import start_instrument_server
from hymem_train.models.tokenizer import default_tokenizer
from hymem_train.run_config import EvaluateConfig, RlConfig
from reward.config import LlmClientConfig
from reward.judge import Reader
from reward.llm import ChatClient
from reward.reader_checks import (
    EMPTY_MAX,
    GOLD_MIN,
    PERMUTED_MIN,
    POLLUTED_MIN,
    ReaderPreflightError,
    permute_records,
    permuted_value,
    preflight,
    preflight_to,
    reader_checks,
)

SEARCH_K = 5  # the demo's


def _build(out, world: str, num_sequences: int):
    outs, _ = build(
        load_config(
            [
                f"out_dir={out}",
                "data.name=reader_checks",
                f"data.synthetic.num_sequences={num_sequences}",
                f"data.synthetic.world={world}",
                "data.synthetic.num_chunks_per_sequence=6",
                "data.synthetic.num_chunks_per_window=3",
                "data.synthetic.seed=3",
                "~data.profiles.hy_memory",
                "+data.profiles={native: {mode: session, max_tokens: 0, num_chunks_per_window: 3, tokenizer_path: ''}}",
            ]
        )
    )
    return outs["native"]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    return BuiltDataset(_build(tmp_path_factory.mktemp("ledger"), "ledger", 16))


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


def _reader(base_url: str) -> Reader:
    return Reader(
        ChatClient(LlmClientConfig(base_url=base_url, model="reader", max_tokens=64, num_retries=0))
    )


@pytest.fixture(scope="module")
def extractive(tok):
    srv = start_instrument_server(tok, served_model_name="reader", max_model_len=2048)
    yield srv
    srv.stop()


def test_extractive_reader_passes_all_four_checks_on_a_ledger_dataset(ledger, extractive):
    res = preflight(ledger, _reader(extractive.base_url), search_k=SEARCH_K)
    print("\n" + res.summary())
    c = res.checks
    assert res.num_sequences == 16 and res.num_probes >= 100 and res.num_traps >= 20
    assert c["gold"].num_items == c["empty"].num_items == c["permuted"].num_items == res.num_probes
    assert c["polluted"].num_items == res.num_traps
    # the instrument holds by construction: every figure at its bound, not only past the threshold
    assert c["gold"].value == 1.0 >= GOLD_MIN
    assert c["empty"].value == 0.0 <= EMPTY_MAX
    assert c["permuted"].value == 1.0 >= PERMUTED_MIN
    assert c["polluted"].value == 1.0 >= POLLUTED_MIN
    assert res.passed and all(x.num_faults == 0 for x in c.values())


def test_permuted_bank_changes_every_current_value_and_keeps_the_history():
    got = permute_records(["city: Lisbon, then Oslo (2023-01-16)", "dog: Olive"])
    assert got == ["city: Lisbon, then Denver (2023-01-16)", "dog: Rex"]  # cyclic: Olive -> Rex
    assert permuted_value("Alice's city", "Oslo") == "Denver"  # a probe's key names the person


def _most_frequent_training_value(ds) -> dict[str, str]:
    """What a reader that learnt the training data without reading would say, per attribute."""
    counts: dict[str, Counter] = {}
    for p in ds.tables["probes"]:
        if not p.is_trap:
            attr = p.question.rstrip("?").rsplit("'s ", 1)[1]
            counts.setdefault(attr, Counter())[p.reference] += 1
    return {a: c.most_common(1)[0][0] for a, c in counts.items()}


@pytest.fixture
def scripted_reader(tok):
    """A frozen gateway whose reader answers by a function of the prompt (a ScriptedEngine)."""
    servers = []

    def start(reply):
        gw = Gateway(
            ScriptedEngine(tok, reply),
            tok,
            GatewayConfig(frozen=True, embeddings=False, served_model_name="reader"),
        )
        servers.append(GatewayServer(gw).start())
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def test_a_reader_that_ignores_the_bank_fails_the_preflight(ledger, scripted_reader):
    usual = _most_frequent_training_value(ledger)

    def prior(prompt: str) -> str:  # the records are there; it answers from what it "learnt" instead
        attr = prompt.rsplit("Question: ", 1)[1].split("?")[0].rsplit("'s ", 1)[1]
        return usual.get(attr) or ATTR_BY_NAME[attr].values[:NUM_TRAIN_VALUES][0]

    srv = scripted_reader(prior)
    with pytest.raises(ReaderPreflightError) as err:
        preflight(ledger, _reader(srv.base_url), search_k=SEARCH_K)
    msg = str(err.value)
    print("\n" + msg)
    assert "permuted: " in msg and "gold: " in msg and "empty: " in msg  # each failing check by name
    assert "polluted" not in msg  # it does name something for every trap
    res = reader_checks(ledger, _reader(srv.base_url), search_k=SEARCH_K)
    assert res.checks["permuted"].value < 0.5 and res.checks["gold"].value < 0.6
    assert not res.checks["permuted"].passed and not res.checks["gold"].passed


def test_a_reader_that_always_says_no_record_fails_gold_and_polluted(ledger, scripted_reader):
    srv = scripted_reader(lambda _: NO_SUCH_RECORD)
    res = reader_checks(ledger, _reader(srv.base_url), search_k=SEARCH_K, max_sequences=4)
    assert res.num_sequences == 4
    assert [n for n, c in res.checks.items() if not c.passed] == ["gold", "permuted", "polluted"]
    assert res.checks["empty"].value == 0.0 and res.checks["polluted"].value == 0.0


def test_reader_faults_fail_the_check(ledger, scripted_reader):
    def broken(prompt: str) -> str:
        raise RuntimeError("down")  # the gateway answers 500: every call faults

    srv = scripted_reader(broken)
    res = reader_checks(ledger, _reader(srv.base_url), search_k=SEARCH_K, max_sequences=1)
    assert not any(c.passed for c in res.checks.values())
    assert all(c.num_faults == c.num_items > 0 for c in res.checks.values())


def test_preflight_to_writes_the_figures_and_skips_other_worlds(
    ledger, extractive, scripted_reader, tmp_path
):
    path = tmp_path / "run" / "reader_preflight.json"
    shown = []
    preflight_to(
        path,
        {"native": ledger, "mem0": ledger},
        _reader(extractive.base_url),
        search_k=SEARCH_K,
        echo=shown.append,
        max_sequences=2,
    )
    doc = json.loads(path.read_text())
    assert doc["passed"] and len(doc["datasets"]) == 1 and len(shown) == 1  # one dataset, two harnesses
    d = doc["datasets"][0]
    assert d["harnesses"] == ["native", "mem0"] and d["search_k"] == SEARCH_K
    assert d["checks"]["permuted"] == {
        "name": "permuted",
        "value": 1.0,
        "rule": f">= {PERMUTED_MIN}",
        "op": ">=",
        "threshold": PERMUTED_MIN,
        "num_items": d["num_probes"],
        "num_faults": 0,
        "passed": True,
    }
    assert doc["checks"] == d["checks"]  # one dataset: the run's figures are its figures
    # a failing reader: the file is written first (the demo report reads it), then the error
    srv = scripted_reader(lambda _: NO_SUCH_RECORD)
    with pytest.raises(ReaderPreflightError, match="gold: 0.000"):
        preflight_to(path, {"native": ledger}, _reader(srv.base_url), search_k=SEARCH_K, max_sequences=2)
    assert json.loads(path.read_text())["passed"] is False
    templated = BuiltDataset(_build(tmp_path / "templated", "templated", 2))
    other = tmp_path / "other.json"
    assert preflight_to(other, {"native": templated}, _reader(srv.base_url), search_k=SEARCH_K) == []
    assert not other.exists()


# ---------------------------------------------------------------------- the stages' wiring
def test_rl_stage_serves_the_extractive_reader_and_runs_the_preflight(ledger, tok, tmp_path):
    cfg = to_typed(
        compose(
            "rl",
            [
                "+exp=demo_rl",
                "local_reader=true",
                "reader_kind=extractive",
                f"data.path={ledger.root}",
                "reader_model.path=/nonexistent",
            ],
        ),
        RlConfig,
    )
    stage = types.SimpleNamespace(
        tokenizer=tok, run_dir=tmp_path, dataset=HarnessDatasets({"native": ledger.root})
    )
    given = cfg.reward.reader.base_url
    servers, reward = start_frozen_models(stage, cfg)  # no checkpoint loaded: reader_model is unused
    try:
        assert len(servers) == 1 and reward.reader.base_url == servers[0].base_url
        assert cfg.reward.reader.base_url == given  # the stage's config is not rewritten
        reader_preflight(stage, cfg, reward)
    finally:
        for s in servers:
            s.stop()
    doc = json.loads((tmp_path / "reader_preflight.json").read_text())
    assert doc["passed"] and doc["datasets"][0]["search_k"] == cfg.reward.search_k


def test_evaluate_serves_the_extractive_reader_and_runs_the_preflight(ledger, tmp_path):
    from hymem_train.evaluate import fixed_services, reader_preflight

    cfg = to_typed(
        compose(
            "evaluate",
            [
                "+exp=evaluate_demo",
                "local_reader=true",
                "reader_kind=extractive",
                f"data.path={ledger.root}",
                "reader_model.path=/nonexistent",
                f"run.output_dir={tmp_path}",
            ],
        ),
        EvaluateConfig,
    )
    with fixed_services(cfg):
        assert cfg.protocol.reader.base_url
        reader_preflight(cfg, tmp_path, {"native": ledger})
    doc = json.loads((tmp_path / "reader_preflight.json").read_text())
    assert doc["passed"] and doc["datasets"][0]["search_k"] == cfg.protocol.search_k


def test_reader_kind_is_validated_by_name():
    with pytest.raises(ValueError, match="reader_kind='bogus'"):
        to_typed(compose("rl", ["+exp=demo_rl", "reader_kind=bogus"]), RlConfig)
    with pytest.raises(ValueError, match="reader_kind=extractive .* local_reader=true"):
        to_typed(compose("rl", ["+exp=demo_rl", "reader_kind=extractive", "local_reader=false"]), RlConfig)
    with pytest.raises(ValueError, match="cluster.placement.reader.replicas=0"):
        to_typed(
            compose(
                "rl",
                [
                    "+exp=demo_rl",
                    "reader_kind=extractive",
                    "local_reader=true",
                    "cluster.placement.reader.replicas=1",
                ],
            ),
            RlConfig,
        )
    with pytest.raises(ValueError, match="reader_kind=extractive"):
        to_typed(
            compose(
                "evaluate",
                [
                    "+exp=evaluate_demo",
                    "reader_kind=extractive",
                    "local_reader=false",
                    "protocol.reader.base_url=http://x/v1",
                ],
            ),
            EvaluateConfig,
        )
