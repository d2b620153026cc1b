"""`python -m hymem_train.evaluate`: the writer-only swap matrix on the shared LoCoMo + LongMemEval-S slices.

Writers, reader and judge are scripted stand-in endpoints here (the harness, the data, the judge prompts,
the cache and the tables are the real ones), so every call can be counted: a killed matrix resumes
without paying for finished work twice, an injected harness crash is a counted failure and never a 0,
and a writer that serves a fixed role is refused. Real tiny checkpoints as writers: test_checkpoint_writers.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.memoryarena import DAY_KEYS
from hymem_train.config import compose, to_typed
from hymem_train.evaluate import evaluate
from hymem_train.evaluation import matrix as mx
from hymem_train.evaluation.config import WriterConfig
from hymem_train.evaluation.matrix import WriterLeakError
from hymem_train.run_config import EvaluateConfig
from tests.doubles.openai_server import HttpFailure, StandInServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def locomo(locomo_sample):
    return locomo_sample / "mem0"


def user_text(body):
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")


def copy_writer(body):
    """Stores the chunk's first three lines: enough for some questions, not all."""
    new = user_text(body).split("New conversation:")[-1]  # the native prompt's chunk part
    lines = [ln.strip() for ln in new.splitlines() if ln.strip().startswith("user: ")][:3]
    return json.dumps({"ops": [{"op": "ADD", "text": ln[:300]} for ln in lines]})


def empty_writer(body):
    return json.dumps({"ops": []})


def reader(body):
    m = re.search(r"\[1\] (?:\([^)]*\) )?(.*)", user_text(body))
    return m.group(1)[:200] if m else "no such record"


def judge(body):
    text = user_text(body)
    m = re.search(r"Gold answer: (.*)\nGenerated answer: (.*)\n", text)
    if m:  # LoCoMo's published prompt: a JSON label
        hit = m.group(1).strip().lower()[:12] in m.group(2).lower()
        return json.dumps({"label": "CORRECT" if hit else "WRONG"})
    m = re.search(r"(?:Correct Answer|Explanation|Rubric): (.*?)\n\nModel Response: (.*?)\n\n", text, re.S)
    assert m, text[-400:]  # LongMemEval's per-type prompt: yes / no
    return "yes" if m.group(1).strip().lower()[:12] in m.group(2).lower() else "no"


def overrides(data, out, writers, rd, jd, *extra):
    ws = ",".join(f"{{name: {n}, base_url: '{s.base_url}', model: {n}}}" for n, s in writers.items())
    return [
        "+exp=evaluate_locomo_sample",
        "~harnesses.mem0",
        "~harnesses.hy_memory",
        "harnesses.native.in_process=true",
        f"data.per_harness.native={data}",
        f"writers=[{ws}]",
        f"protocol.reader.base_url={rd.base_url}",
        f"protocol.judge.base_url={jd.base_url}",
        "protocol.reader.num_retries=0",
        "protocol.judge.num_retries=1",
        "protocol.judge.retry_backoff_s=0",
        "max_items_per_benchmark=6",
        "bootstrap_resamples=200",
        f"run.output_dir={out}",
        # the exp's CPU defaults (the demo teacher as local reader, token F1) replaced by the stand-ins
        "local_reader=false",
        "protocol.judge_mode=protocol",
        "protocol.reader_budget_cap=0",
        "parallel_builds=1",
        *extra,
    ]


def cfg_of(args):
    return to_typed(compose("evaluate", args), EvaluateConfig)


@pytest.fixture
def servers():
    with (
        StandInServer(copy_writer) as a,
        StandInServer(empty_writer) as b,
        StandInServer(reader) as rd,
        StandInServer(judge) as jd,
    ):
        yield {"copy": a, "empty": b}, rd, jd


@pytest.fixture(scope="module")
def reference(locomo, tmp_path_factory):
    """One uninterrupted matrix (two writers): the table test reads it, the resume test compares with it."""
    with (
        StandInServer(copy_writer) as a,
        StandInServer(empty_writer) as b,
        StandInServer(reader) as rd,
        StandInServer(judge) as jd,
    ):
        writers = {"copy": a, "empty": b}
        res = evaluate(
            cfg_of(overrides(locomo, tmp_path_factory.mktemp("ref"), writers, rd, jd)), progress=False
        )
        yield res, writers, rd, jd


def test_table_two_writers_locomo_and_longmemeval(locomo, reference):
    res, writers, rd, jd = reference
    out = Path(res["out"])
    md = (out / "table.md").read_text()
    for f in ("table.csv", "table.png", "items.jsonl", "endpoints.json", "plan.json"):
        assert (out / f).stat().st_size > 0, f
    assert "| copy |" in md and "| empty |" in md and "LoCoMo Judge" in md and "LongMemEval" in md
    assert "Not run: PersonaMem-v2: no data in this run" in md and "CMB: not run (no public data)" in md
    assert "Intervals side by side: clustered (the table's) and cell" in md
    # the reader answered each benchmark under its published budget (LoCoMo: Mem0 sets none, 1024 here)
    assert {b["max_tokens"] for b in rd.chat_bodies()} == {1024, 800}
    recs = [json.loads(x) for x in (out / "items.jsonl").read_text().splitlines()]
    bench = {r["benchmark"] for r in recs}
    assert bench == {"locomo", "longmemeval_s"}
    # the plan is the build's fixed subsample, cut to 6 per benchmark; LoCoMo's category 5 is not scored
    plan = json.loads((out / "plan.json").read_text())["harnesses"]["native"]["items"]
    manifest = json.loads((locomo / "manifest.json").read_text())["eval_subsample"]["ids"]
    assert set(plan) <= set(manifest["locomo"]) | set(manifest["longmemeval_s"])
    assert not any(r["category"] == "adversarial" for r in recs)
    assert len(recs) == 2 * len(plan)  # every writer, the same items
    # the empty writer stores nothing: every answer is "no such record"; the copy writer retrieves text
    assert all(r.get("retrieved") == [] for r in recs if r["writer"] == "empty")
    assert any(r.get("retrieved") for r in recs if r["writer"] == "copy")
    # endpoints: the write path reached only the writers; reader and judge are the fixed ones
    ep = json.loads((out / "endpoints.json").read_text())
    assert ep["reader"]["base_url"] == rd.base_url and ep["judge"]["base_url"] == jd.base_url
    assert ep["reader"]["calls"] == len(rd.chat_requests()) == len(recs)
    assert (
        len(writers["copy"].chat_requests())
        == len(writers["empty"].chat_requests())
        == ep["write_calls_made"] / 2
    )
    # LongMemEval was judged with its per-type prompt and 10-token budget, LoCoMo with the JSON label prompt
    bodies = jd.chat_bodies()
    assert any(
        "Is the model response correct? Answer yes or no only." in user_text(b) and b["max_tokens"] == 10
        for b in bodies
    )
    assert any('in a json format with the key as "label"' in user_text(b) for b in bodies)
    csv = (out / "table.csv").read_text()
    assert "copy,Average,average," in csv and "empty,native,harness_score," in csv


def test_kill_and_resume_pays_no_call_twice(locomo, servers, tmp_path, reference):
    """The matrix runs in a child process; the stand-in writer kills it with SIGKILL in the middle of the
    second writer's bank builds (the call that triggers the kill is received but never answered). The
    rerun pays for that one chunk again and for nothing else."""
    writers, rd, jd = servers
    args = overrides(locomo, tmp_path, writers, rd, jd)
    cmd = [sys.executable, "-m", "hymem_train.evaluate", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    full, ref_writers, _, ref_judge = reference
    chunks = len(ref_writers["empty"].chat_requests())  # chunks of the planned sequences, one call each
    items = len([r for r in full["records"] if r["writer"] == "empty"])
    judged = len(ref_judge.chat_requests())

    child: dict = {"calls": 0}
    kill_at = chunks // 2

    def empty_then_kill(body):
        child["calls"] += 1
        if child["calls"] == kill_at:  # the child dies before this call is answered
            os.kill(child["pid"], signal.SIGKILL)
            return 500
        return empty_writer(body)

    writers["empty"].set_replies(empty_then_kill)
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child["pid"] = p.pid
    log = p.communicate(timeout=600)[0]
    assert p.returncode == -signal.SIGKILL, log[-3000:]
    assert not (tmp_path / "eval" / "table.md").exists()
    paid = {n: len(s.chat_requests(None)) for n, s in writers.items()}
    assert paid == {"copy": chunks, "empty": kill_at}
    assert len(rd.chat_requests()) == items  # the first writer's items were read and judged before the kill
    judged_before = len(jd.chat_requests())

    writers["empty"].set_replies(empty_writer)
    evaluate(cfg_of(args), progress=False)  # the resume (in this process: the kill needed the child)
    after = {n: len(s.chat_requests(None)) for n, s in writers.items()}
    # the copy writer's cell was done: nothing re-paid; the empty writer: the killed chunk once more
    assert after == {"copy": chunks, "empty": chunks + 1}
    assert len(rd.chat_requests()) == 2 * items
    assert len(jd.chat_requests()) == 2 * judged_before == judged
    resumed = [json.loads(x) for x in (tmp_path / "eval" / "items.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (Path(full["out"]) / "items.jsonl").read_text().splitlines()]
    key = lambda r: (r["writer"], r["item_id"])  # noqa: E731
    assert sorted(resumed, key=key) == sorted(ref, key=key)  # the same table as an uninterrupted run


def test_injected_harness_crash_is_a_counted_failure_not_a_zero(locomo, servers, tmp_path):
    """Every write attempt of one sequence's bank build has its sandbox SIGKILLed: after the harness's
    retries and the build's re-attempt, that sequence's items are failures, excluded from the mean."""
    writers, rd, jd = servers
    base = overrides(
        locomo, tmp_path / "ok", {"copy": writers["copy"]}, rd, jd, "harnesses.native.in_process=false"
    )
    ok = evaluate(cfg_of(base), progress=False)
    seqs = sorted({r["sequence_id"] for r in ok["records"]})
    crashed = seqs[0]
    args = overrides(
        locomo,
        tmp_path / "crash",
        {"copy": writers["copy"]},
        rd,
        jd,
        "harnesses.native.in_process=false",
        f"faults.kill_sandbox=['native:{crashed}']",
    )
    res = evaluate(cfg_of(args), progress=False)
    recs = res["records"]
    failed = [r for r in recs if "failure" in r]
    assert failed and {r["sequence_id"] for r in failed} == {crashed}
    assert all(r["failure"]["stage"] == "bank_build" and "score" not in r for r in failed)
    assert {r["failure"]["class"] for r in failed} == {"platform"}  # the sandbox died: not the writer's
    build = json.loads(
        (Path(res["out"]) / "cache/copy/native" / crashed.replace("/", "_") / "build.json").read_text()
    )
    assert build["status"] == "failed" and build["attempts"] == 2 and build["failure_class"] == "platform"
    t = res["table"]
    for m in t.metrics["native"]:
        cell = t.cells[("copy", "native", m)]
        fails = sum(1 for r in failed if r["metric"] == m)
        assert cell.excluded == fails and cell.writer_failures == 0
        scored = [r["score"] for r in recs if r["metric"] == m and "score" in r]
        assert cell.n == len(scored) and (
            not scored or abs(cell.mean - 100 * sum(scored) / len(scored)) < 1e-9
        )
    md = (Path(res["out"]) / "table.md").read_text()
    assert f"{len(failed)} excluded" in md or "excluded (" in md


@pytest.mark.slow  # two bank-building runs: kept out of the edit-test loop
def test_a_writer_that_times_out_fails_its_items_as_zeros_and_is_not_retried(locomo, servers, tmp_path):
    """The writer's endpoint answers slower than the writer's timeout: its bank builds end as writer
    failures (not retried, not excused as the platform's), and its items are 0 in its means; the other
    writer's pairs on those items stay in the table."""
    writers, rd, jd = servers
    with StandInServer(lambda body: HttpFailure(500, delay_s=1.5)) as slow:
        args = overrides(locomo, tmp_path, {"copy": writers["copy"], "slow": slow}, rd, jd)
        args = [a.replace("model: slow}", "model: slow, timeout_s: 0.3}") for a in args]
        res = evaluate(cfg_of(args), progress=False)
    recs = [r for r in res["records"] if r["writer"] == "slow"]
    assert recs and all(r["failure"]["class"] == "writer" and "score" not in r for r in recs)
    builds = list((Path(res["out"]) / "cache/slow/native").glob("*/build.json"))
    assert builds and all(json.loads(b.read_text())["attempts"] == 1 for b in builds)  # not retried
    t = res["table"]
    for m in t.metrics["native"]:
        slow_cell, copy_cell = t.cells[("slow", "native", m)], t.cells[("copy", "native", m)]
        assert slow_cell.mean == 0.0 and slow_cell.writer_failures == slow_cell.n == copy_cell.n > 0
        assert copy_cell.excluded == 0
    assert "writer-failed" in (Path(res["out"]) / "table.md").read_text()


def test_writer_that_serves_a_fixed_role_is_refused(locomo, servers, tmp_path):
    writers, rd, jd = servers
    same = overrides(
        locomo,
        tmp_path,
        {"copy": writers["copy"]},
        rd,
        jd,
        f"protocol.reader.base_url={writers['copy'].base_url}",
        "protocol.reader.model=copy",
    )
    with pytest.raises(ValueError, match="leak into a fixed role"):
        cfg_of(same).validate()
    assert not writers["copy"].requests

    # at run time: the reader's calls reach the writer's server under another model name

    args = overrides(
        locomo,
        tmp_path / "rt",
        {"copy": writers["copy"]},
        rd,
        jd,
        f"protocol.reader.base_url={writers['copy'].base_url}",
        "protocol.reader.model=reader",
    )
    served = lambda: len(writers["copy"].requests)  # noqa: E731
    orig = mx.MatrixRun.run

    def run(self, ws=None):
        self.endpoints.served["copy"] = served
        return orig(self, ws)

    mx.MatrixRun.run = run
    try:
        with pytest.raises(WriterLeakError, match="served .* call"):
            evaluate(cfg_of(args), progress=False)
    finally:
        mx.MatrixRun.run = orig


def test_resume_refuses_another_plan(locomo, servers, tmp_path):
    writers, rd, jd = servers
    evaluate(cfg_of(overrides(locomo, tmp_path, {"copy": writers["copy"]}, rd, jd)), progress=False)
    with pytest.raises(ValueError, match="plan .* differs"):
        evaluate(
            cfg_of(
                overrides(locomo, tmp_path, {"copy": writers["copy"]}, rd, jd, "max_items_per_benchmark=5")
            ),
            progress=False,
        )


def test_writers_added_to_a_run_reuse_its_cache_and_another_writer_under_an_old_name_is_refused(
    locomo, servers, tmp_path, reference
):
    """`make demo` reads its early writers while RL trains, then all of them into the same directory: the
    cached writers are not paid again and the table equals one uninterrupted run. The cache is keyed by
    a writer's name, so a different writer under that name must not inherit it."""
    writers, rd, jd = servers
    full = reference[0]
    evaluate(cfg_of(overrides(locomo, tmp_path, {"copy": writers["copy"]}, rd, jd)), progress=False)
    paid = len(writers["copy"].chat_requests(None))
    res = evaluate(cfg_of(overrides(locomo, tmp_path, writers, rd, jd)), progress=False)
    assert len(writers["copy"].chat_requests(None)) == paid  # nothing re-paid for the cached writer
    key = lambda r: (r["writer"], r["item_id"])  # noqa: E731
    assert sorted(res["records"], key=key) == sorted(full["records"], key=key)
    swapped = {"copy": writers["empty"], "empty": writers["empty"]}  # another endpoint named "copy"
    with pytest.raises(ValueError, match="writer 'copy' is not the writer its cached banks were built by"):
        evaluate(cfg_of(overrides(locomo, tmp_path, swapped, rd, jd)), progress=False)


def test_a_checkpoint_retrained_in_place_is_another_writer(tmp_path):
    """The same name and the same checkpoint path, but the weights rewritten (a rerun of training into the
    same directory): the cached banks are not the new checkpoint's."""
    ckpt = tmp_path / "rl" / "final"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"a" * 64)
    w = WriterConfig(name="rl", checkpoint=str(ckpt))
    out = tmp_path / "eval"
    mx.check_writer(out, w)
    mx.check_writer(out, w)  # unchanged: resumed
    (ckpt / "model.safetensors").write_bytes(b"b" * 65)
    with pytest.raises(ValueError, match="writer 'rl' is not the writer its cached banks were built by"):
        mx.check_writer(out, w)


def test_the_writer_decodes_as_the_protocol_says(locomo, servers, tmp_path):
    """The harness configs are the training ones (native samples at 1.0). The evaluation sends the
    protocol's greedy decoding unless told to keep the harness's own, and a cache built under one decoding
    is not resumed under the other."""
    writers, rd, jd = servers
    w = writers["copy"]
    args = overrides(
        locomo,
        tmp_path / "a",
        {"copy": w},
        rd,
        jd,
        "harnesses.native.native.temperature=1.0",
        "max_items_per_benchmark=1",
    )
    evaluate(cfg_of(args), progress=False)
    greedy = len(w.chat_bodies())
    assert greedy and {b["temperature"] for b in w.chat_bodies()} == {0.0}
    with pytest.raises(ValueError, match=r"plan .* the writer's decoding\) differs"):
        evaluate(cfg_of([*args, "writer_decoding=as_configured"]), progress=False)
    args[args.index(f"run.output_dir={tmp_path / 'a'}")] = f"run.output_dir={tmp_path / 'b'}"
    evaluate(cfg_of([*args, "writer_decoding=as_configured"]), progress=False)
    assert {b["temperature"] for b in w.chat_bodies()[greedy:]} == {1.0}
    with pytest.raises(ValueError, match="writer_decoding='sampled'"):
        cfg_of([*args, "writer_decoding=sampled"]).validate()


def test_personamem_and_memoryarena_cells(servers, tmp_path):
    """The fixtures in the published layouts (tests/fixtures/eval_benchmarks), built by the data build and
    scored through the matrix with their own reader prompts and scorers: each gets its report column."""
    fix = REPO / "tests" / "fixtures" / "eval_benchmarks"
    sources = (
        f"[{{kind: personamem_v2, path: '{fix}/personamem_v2/benchmark/text/benchmark.csv', name: ''}},"
        f" {{kind: memoryarena_travel, path: '{fix}/memoryarena/group_travel_planner/test.jsonl', name: ''}},"
        f" {{kind: memoryarena_shopping, path: '{fix}/memoryarena/bundled_shopping/test.jsonl', name: ''}}]"
    )
    build(
        load_config(
            [
                "+exp=data_report_eval",
                f"out_dir={tmp_path / 'data'}",
                f"data.sources={sources}",
                "~data.profiles.hy_memory",
                "~data.profiles.memos",
            ]
        )
    )
    writers, rd, jd = servers
    args = overrides(
        tmp_path / "data" / "mem0",
        tmp_path / "run",
        {"copy": writers["copy"]},
        rd,
        jd,
        "subsample=all",
        "max_items_per_benchmark=0",
    )
    res = evaluate(cfg_of(args), progress=False)
    cols = res["table"].metrics["native"]
    assert cols == ["PersonaMem-v2", "Travel SPS", "Shopping PS"]  # the report's column order
    recs = res["records"]
    assert {r["benchmark"] for r in recs} == {"personamem_v2", "memoryarena_travel", "memoryarena_shopping"}
    assert all("score" in r for r in recs) and not jd.requests  # scored locally, no judge call
    # each benchmark's own reader prompt: PersonaMem's multiple choice asks for the letter
    assert any("Final Answer" in user_text(b) for b in rd.chat_bodies())


def long_reader(body):
    """Full-length answers: a 7-day Travel plan (~300 words of JSON) and a PersonaMem answer that reasons
    for ~90 words before its letter. A 64-token budget cuts both."""
    system = body["messages"][0]["content"]
    if system.startswith("You plan trips"):
        day = {k: f"a long planned {k} entry for this day with several words" for k in DAY_KEYS}
        return json.dumps([{**day, "days": d} for d in range(1, 8)])
    if "personalized" in system:
        return "The records say the user prefers quiet places and reads a lot. " * 7 + "Final Answer: A"
    return "ASIN: B000000000"


@pytest.mark.slow  # two bank-building runs: kept out of the edit-test loop
def test_each_benchmark_reads_under_its_published_budget_and_cut_answers_are_counted(tmp_path):
    fix = REPO / "tests" / "fixtures" / "eval_benchmarks"
    sources = (
        f"[{{kind: personamem_v2, path: '{fix}/personamem_v2/benchmark/text/benchmark.csv', name: ''}},"
        f" {{kind: memoryarena_travel, path: '{fix}/memoryarena/group_travel_planner/test.jsonl', name: ''}}]"
    )
    build(
        load_config(
            [
                "+exp=data_report_eval",
                f"out_dir={tmp_path / 'data'}",
                f"data.sources={sources}",
                "~data.profiles.hy_memory",
                "~data.profiles.memos",
            ]
        )
    )
    with (
        StandInServer(copy_writer) as wr,
        StandInServer(long_reader, honour_max_tokens=True) as rd,
        StandInServer(judge) as jd,
    ):

        def run(out, *extra):
            args = overrides(
                tmp_path / "data" / "mem0",
                tmp_path / out,
                {"copy": wr},
                rd,
                jd,
                "subsample=all",
                "max_items_per_benchmark=3",
                *extra,
            )
            return evaluate(cfg_of(args), progress=False)

        res = run("published")
        budgets = {b["messages"][0]["content"][:14]: b["max_tokens"] for b in rd.chat_bodies()}
        assert sorted(budgets.values()) == [4096, 32768]  # PersonaMem-v2, MemoryArena travel
        assert {r["finish_reason"] for r in res["records"]} == {"stop"}
        assert all(r["answer"].rstrip().endswith(("]", "Final Answer: A")) for r in res["records"])
        cut = run("capped", "protocol.reader_budget_cap=64")
    assert {r["finish_reason"] for r in cut["records"]} == {"length"}
    t = cut["table"]
    for m in ("PersonaMem-v2", "Travel SPS"):
        c = t.cells[("copy", "native", m)]
        assert c.truncated == c.n > 0
    md = (Path(cut["out"]) / "table.md").read_text()
    assert "TRUNCATION" in md and "capped at 64" in md
