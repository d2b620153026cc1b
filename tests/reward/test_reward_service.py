"""The reward service on the native harness with a scripted reader / judge endpoint.

Three rollouts write the same window: one stores the facts, one stores chit-chat (what the trap
probe asks about), one stores nothing. Expected scores are worked by hand in `test_judge_rollout_by_hand`.
"""

import dataclasses
import functools
import json
import math

import pytest

from data_pipeline.schema import GoldFact, Manifest
from harnesses.native import NativeHarness
from reward.config import LlmClientConfig
from reward.judge import ExactMatchScorer, LlmJudge, Reader
from reward.llm import ChatClient
from reward.records import ChunkMappingError, validate_group
from reward.scoring import (
    M_EXCL_CELLS,
    M_EXCL_PROBES,
    M_EXCL_QUESTIONS,
    M_EXCL_ROLLOUTS,
    M_ORM_OFF_SOURCE,
    M_TRAP_PASS,
)
from reward.service import (
    M_BANK_FAULTS,
    M_CF_READER_CALLS,
    M_JUDGE_FAULTS,
    M_READER_CALLS,
    M_RETRIES,
    BankSearcher,
    RewardConfig,
    RewardService,
    best_rollout,
    finish_group,
    judge_rollout,
)
from tests.doubles import reward_window as H
from tests.doubles.openai_server import HttpFailure, StandInServer

E3 = math.e**3 - 1


def pen(x):
    return (math.exp(3 * x) - 1) / E3


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    return H.build_group(tmp_path_factory.mktemp("banks"), ["facts", "chitchat", "nothing"])


@pytest.fixture
def endpoints():
    with StandInServer(replies=H.reader_reply) as reader, StandInServer(replies=H.judge_reply) as judge:
        yield reader, judge


def llm_cfg(srv, **kw):
    base = dict(base_url=srv.base_url, model="frozen", timeout_s=5.0, num_retries=2, retry_backoff_s=0.0)
    base.update(kw)
    return LlmClientConfig(**base)


def run_local(group, reader_srv, judge_srv, cfg=None, judge=None, **judge_kw):
    cfg = cfg or H.scoring_config()
    judged, stats = [], []
    searcher = BankSearcher(functools.partial(NativeHarness, None))
    for i, r in enumerate(group.rollouts):
        j, s = judge_rollout(
            r,
            group,
            searcher=searcher,
            reader=Reader(ChatClient(llm_cfg(reader_srv))),
            judge=judge or LlmJudge(ChatClient(llm_cfg(judge_srv, **judge_kw))),
            search_k=5,
            use_traps=cfg.use_traps,
            rollout_index=i,
            skip_malformed=cfg.malformed_score == "floor",
            counterfactual=cfg.orm_mode == "counterfactual",
        )
        judged.append(j)
        stats.append(s)
    searcher.shutdown()
    return finish_group(group, judged, stats, cfg)


def test_judge_rollout_by_hand(group, endpoints):
    reader_srv, judge_srv = endpoints
    res = run_local(group, reader_srv, judge_srv)
    sc = res.scores
    # prm: facts [ (1 recall + 1 trap)/2, 1 ]; chitchat [ (0 + 0)/2, 0 ]; nothing [ (0 + 1)/2, 0 ]
    assert sc.prm_GC == [[1.0, 1.0], [0.0, 0.0], [0.5, 0.0]]
    # orm: only the facts rollout recovers the gold facts of chunk 0 and chunk 1
    assert sc.orm_GC == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    # pen (l=1, u=3, floor 4 tokens): facts 0->5->11 tokens: g = 5/4, 11/5 -> x = 0.125, 0.6
    # chitchat 0->6->12: g = 6/4, 12/6 -> x = 0.25, 0.5 ; nothing 0->0->0: x = 0
    assert sc.pen_GC[0] == pytest.approx([pen(0.125), pen(0.6)])
    assert sc.pen_GC[1] == pytest.approx([pen(0.25), pen(0.5)])
    assert sc.pen_GC[2] == [0.0, 0.0]
    assert sc.s_GC[0] == pytest.approx([3 - 0.3 * pen(0.125), 3 - 0.3 * pen(0.6)])
    assert sc.s_GC[1] == pytest.approx([-0.3 * pen(0.25), -0.3 * pen(0.5)])
    assert sc.s_GC[2] == pytest.approx([0.5, 0.0])
    # the rollout that stored the facts outscores chit-chat and nothing, in every chunk column
    for t in range(2):
        assert sc.adv_GC[0][t] > sc.adv_GC[2][t] and sc.adv_GC[0][t] > sc.adv_GC[1][t]
    assert res.best_rollout == 0
    assert res.metrics[M_TRAP_PASS] == pytest.approx(2 / 3)  # facts and nothing pass, chitchat fails
    assert res.metrics[M_EXCL_PROBES] == 0.0
    # gold facts, references and rubrics never reach the reader
    for r in reader_srv.chat_requests():
        blob = json.dumps(r.body)
        assert (
            "Ana's dog is named Rex" not in blob and "Full credit" not in blob and "a bakery; Rex" not in blob
        )
    # the judge saw the gold facts (ORM) and the rubric
    assert any("Gold facts:" in json.dumps(r.body) for r in judge_srv.chat_requests())


def test_judge_faults_are_excluded_and_counted_not_scored(group, endpoints):
    """Timeouts and garbage are retried, then the item is excluded; the policy's score is untouched."""
    reader_srv, judge_srv = endpoints
    attempts = {"n": 0}

    def flaky(body):
        text = body["messages"][1]["content"]
        # the trap probe of the "facts" rollout: a timeout, then garbage on every retry
        if (
            "Question: What did Ana eat for breakfast today?" in text
            and "Candidate answer: Ana works at" in text
        ):
            attempts["n"] += 1
            return HttpFailure(500, delay_s=1.0) if attempts["n"] == 1 else "The answer looks fine to me."
        return H.judge_reply(body)

    judge_srv.set_replies(flaky)
    res = run_local(group, reader_srv, judge_srv, timeout_s=0.3)
    assert attempts["n"] == 3  # 1 attempt + 2 retries
    sc = res.scores
    # prm[0] of "facts" = recall only = 1/1; a faulted trap scored as 0 would give (1 + 0) / 2
    assert sc.prm_GC[0][0] == 1.0
    assert sc.valid_GC == [[True, True]] * 3
    assert res.metrics[M_JUDGE_FAULTS] == 1.0
    assert res.metrics[M_RETRIES] == 2.0
    assert res.metrics[M_EXCL_PROBES] == pytest.approx(1 / 9)  # 3 probes x 3 rollouts
    # the other rollouts are not touched by the fault
    assert sc.prm_GC[1:] == [[0.0, 0.0], [0.5, 0.0]]


def test_every_probe_of_a_cell_faulted_makes_the_cell_invalid(group, endpoints):
    reader_srv, judge_srv = endpoints

    def dead_on_dog(body):
        text = body["messages"][1]["content"]
        return "garbage" if "Question: What is the name of Ana's dog?" in text else H.judge_reply(body)

    judge_srv.set_replies(dead_on_dog)
    res = run_local(group, reader_srv, judge_srv)
    # chunk 1 has one probe; it faulted in every rollout: column 1 is excluded, not a column of zeros
    assert [v[1] for v in res.scores.valid_GC] == [False, False, False]
    assert [a[1] for a in res.scores.adv_GC] == [0.0, 0.0, 0.0]
    assert res.metrics[M_EXCL_CELLS] == pytest.approx(0.5)
    assert res.best_rollout is None  # no fully valid rollout to promote on partial information


def test_policy_error_scored_platform_error_excluded(group, endpoints):
    reader_srv, judge_srv = endpoints
    g = dataclasses.replace(group, rollouts=list(group.rollouts))
    facts = g.rollouts[0]
    g.rollouts[0] = dataclasses.replace(facts, status="platform_error")
    nothing = g.rollouts[2]
    g.rollouts[2] = dataclasses.replace(
        nothing, chunks=[dataclasses.replace(c, status="policy_error") for c in nothing.chunks]
    )
    n_before = len(judge_srv.chat_requests())
    res = run_local(g, reader_srv, judge_srv)
    assert res.scores.valid_GC == [[False, False], [True, True], [True, True]]
    assert res.scores.adv_GC[0] == [0.0, 0.0]
    # policy error: a valid cell with low reward (prm = orm = 0), not its unchanged bank's 0.5
    assert res.scores.s_GC[2] == pytest.approx([0.0, 0.0])
    assert res.metrics[M_EXCL_ROLLOUTS] == pytest.approx(1 / 3)
    # judge calls: rollout 1 (3 probes + 1 question) + rollout 2 (its ORM question only: the probes
    # of its malformed chunks score the floor, so they are not read or judged); the failed rollout none
    assert len(judge_srv.chat_requests()) - n_before == 5
    n_before = len(judge_srv.chat_requests())
    bank = run_local(g, reader_srv, judge_srv, cfg=H.scoring_config(malformed_score="bank"))
    assert bank.scores.s_GC[2] == pytest.approx([0.5, 0.0])  # ablation: what its bank earned
    assert len(judge_srv.chat_requests()) - n_before == 8  # 2 valid rollouts x (3 probes + 1 question)


def test_missing_chunk_mapping_raises(group):
    bad_probe = dataclasses.replace(group.probes[0], chunk_index=5, probe_id="synth/000/c0005/p000")
    with pytest.raises(ChunkMappingError, match="probe synth/000/c0005/p000.*silent failure chunk-unmapped"):
        validate_group(dataclasses.replace(group, probes=[*group.probes, bad_probe]))
    q = group.questions[0]
    bad_q = dataclasses.replace(q, gold_facts=[*q.gold_facts, GoldFact("later", 2)])
    with pytest.raises(ChunkMappingError, match=r"gold_facts\[2\].source_chunk=2"):
        validate_group(dataclasses.replace(group, questions=[bad_q]))
    r0 = dataclasses.replace(group.rollouts[0], segment_chunks=[0, None, 1])
    with pytest.raises(ChunkMappingError, match="segment 1 has chunk index None"):
        validate_group(dataclasses.replace(group, rollouts=[r0, *group.rollouts[1:]]))
    r0 = dataclasses.replace(group.rollouts[0], chunks=group.rollouts[0].chunks[:1])
    with pytest.raises(ChunkMappingError, match=r"snapshots for chunks \[0\]"):
        validate_group(dataclasses.replace(group, rollouts=[r0, *group.rollouts[1:]]))
    # an earlier-window fact is legitimate: it credits no chunk of this window
    early = dataclasses.replace(q, gold_facts=[*q.gold_facts], window_index=0)
    validate_group(dataclasses.replace(group, questions=[early]))


@pytest.mark.slow
def test_ray_service_end_to_end(group, endpoints):
    """The whole service: Ray actor pool, native banks, scripted endpoints; equals the local path."""
    import ray

    reader_srv, judge_srv = endpoints
    expected = run_local(group, reader_srv, judge_srv)
    cfg = RewardConfig(
        scoring=H.scoring_config(),
        reader=llm_cfg(reader_srv),
        judge=llm_cfg(judge_srv),
        search_k=5,
        num_actors=2,
    )
    g2 = dataclasses.replace(
        group, rollouts=[*group.rollouts, dataclasses.replace(group.rollouts[1], status="platform_error")]
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        svc = RewardService(cfg, functools.partial(NativeHarness, None))
        res, res2 = svc.score_groups([group, g2])
        bad = dataclasses.replace(group, probes=[dataclasses.replace(group.probes[0], chunk_index=9)])
        n = len(judge_srv.chat_requests())
        with pytest.raises(ChunkMappingError):
            svc.score(bad)
        assert len(judge_srv.chat_requests()) == n  # raised before any call
        svc.shutdown()
        # an ablated service (probes only, no growth penalty) scores its own way in training, and with
        # the report's protocol (held-out evaluation) exactly as the baseline service does
        ablated = dataclasses.replace(
            cfg, scoring=H.scoring_config(use_traps=False, use_growth_penalty=False), num_actors=1
        )
        svc = RewardService(ablated, functools.partial(NativeHarness, None))
        own = svc.score(group)
        yardstick = svc.score_groups([group], ablated.scoring.report_protocol())[0]
        svc.shutdown()
    finally:
        ray.shutdown()
    flat = lambda t: [x for row in t for x in row]  # noqa: E731
    assert flat(res.scores.s_GC) == pytest.approx(flat(expected.scores.s_GC))
    assert flat(res.scores.adv_GC) == pytest.approx(flat(expected.scores.adv_GC))
    assert res.best_rollout == 0 and res.trajectory_ids == ["traj-facts", "traj-chitchat", "traj-nothing"]
    assert res2.scores.valid_GC[3] == [False, False] and res2.metrics[M_EXCL_ROLLOUTS] == 0.25
    # the excluded 4th rollout does not move the others' advantages
    assert flat(res2.scores.adv_GC[:3]) == pytest.approx(flat(expected.scores.adv_GC))
    assert own.scores.prm_GC[2] == [0.0, 0.0] and own.scores.pen_GC[0] == [0.0, 0.0]  # no trap, no pen
    assert flat(yardstick.scores.s_GC) == pytest.approx(flat(expected.scores.s_GC))
    assert yardstick.metrics[M_TRAP_PASS] == pytest.approx(2 / 3)


def test_unreadable_bank_snapshot_is_a_counted_platform_fault(group, endpoints, tmp_path):
    reader_srv, judge_srv = endpoints
    facts = group.rollouts[0]
    gone = dataclasses.replace(facts.chunks[1], bank_dir=str(tmp_path / "missing"))
    g = dataclasses.replace(
        group, rollouts=[dataclasses.replace(facts, chunks=[facts.chunks[0], gone]), *group.rollouts[1:]]
    )
    res = run_local(g, reader_srv, judge_srv)
    # chunk 1's probe and the ORM question (final bank = chunk 1's snapshot) could not be asked
    assert res.metrics[M_BANK_FAULTS] == 2.0
    assert res.scores.valid_GC[0] == [False, False]  # orm of both chunks unknown -> both cells excluded
    assert res.scores.valid_GC[1:] == [[True, True], [True, True]]
    assert res.metrics[M_EXCL_QUESTIONS] == pytest.approx(1 / 3)


def test_exact_match_judge_kind(group, endpoints):
    reader_srv, judge_srv = endpoints
    cfg = RewardConfig(
        scoring=H.scoring_config(),
        reader=llm_cfg(reader_srv),
        judge=llm_cfg(judge_srv),
        judge_kind="exact_match",
    )
    with pytest.raises(ValueError, match="answers_atomic"):
        RewardService(
            cfg, functools.partial(NativeHarness, None), manifest=Manifest(name="locomo", sources=["locomo"])
        )
    scorer = ExactMatchScorer(Manifest(name="synth", sources=["synthetic"], answers_atomic=True))
    n_judge = len(judge_srv.chat_requests())
    res = run_local(group, reader_srv, judge_srv, judge=scorer)
    assert len(judge_srv.chat_requests()) == n_judge  # no judge model involved
    # "nothing": the reader says "no such record": recall "at a bakery" misses, the trap matches
    assert res.scores.prm_GC[2] == [0.5, 0.0]
    # "facts": the reader repeats its records ("Ana works at a bakery"), equal to neither "at a bakery"
    # nor "no such record": 0 and 0. Exact match is only right for atomic answers (hence the refusal)
    assert res.scores.prm_GC[0] == [0.0, 0.0]


def test_best_rollout_ties_go_to_the_lowest_index_and_invalid_rollouts_never_compete():
    s = [[0.2, 0.3], [0.4, 0.1], [0.9, 0.9], [0.1, 0.4]]
    v = [[True, True], [True, True], [True, False], [True, True]]
    # rollouts 0, 1 and 3 tie at 0.5; rollout 2 has the highest sum but a platform-failed cell
    assert best_rollout(s, v) == 0
    assert best_rollout(s[1:], v[1:]) == 0  # (old rollouts 1 and 3 tie: the first of them)
    assert best_rollout([[0.1], [0.2]], [[True], [True]]) == 1
    assert best_rollout([[1.0]], [[False]]) is None


def test_counterfactual_orm_credits_the_answers_a_chunk_changes(tmp_path, endpoints):
    """orm[t] = share recovered from the final bank - share with chunk t's writes left out. Where the
    bakery fact is stored twice, leaving chunk 0 out loses nothing: attributed ORM credits chunk 0 (the
    fact's source) in full, counterfactual ORM not at all."""
    reader_srv, judge_srv = endpoints
    g = H.build_group(tmp_path, ["facts", "restated", "chitchat", "nothing"])
    att = run_local(g, reader_srv, judge_srv)
    assert att.scores.orm_GC == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert att.metrics[M_ORM_OFF_SOURCE] == 0.0 and att.metrics[M_CF_READER_CALLS] == 0
    cf = run_local(g, reader_srv, judge_srv, cfg=H.scoring_config(orm_mode="counterfactual"))
    # facts: either chunk left out loses one of two facts; restated: chunk 0's copy is redundant;
    # chitchat changes the reader's view but no answer; nothing wrote nothing (and costs no call)
    assert cf.scores.orm_GC == [[0.5, 0.5], [0.0, 0.5], [0.0, 0.0], [0.0, 0.0]]
    # one question, re-read per chunk whose leave-out view differs: 2 + 2 + 2 + 0
    assert cf.metrics[M_CF_READER_CALLS] == 6
    assert cf.metrics[M_READER_CALLS] == att.metrics[M_READER_CALLS] + 6
    assert cf.scores.prm_GC == att.scores.prm_GC  # only the ORM term reads the leave-outs
