"""Bad input a new user feeds the data build: each gives one clear message, and each
test asserts the guard's own message (it fails without the guard)."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import data_pipeline.build as build_mod
from data_pipeline import store
from data_pipeline.build import BuildError, build, load_config, main, usage
from data_pipeline.chunking import ChunkingConfig, chunk_sequence, load_tokenizer, render_chunk
from data_pipeline.loaders import (
    EvidenceIssue,
    load_generic_jsonl,
    load_locomo,
    load_longmemeval,
    parse_locomo_evidence,
)
from data_pipeline.schema import RecordError
from data_pipeline.stats import compute, format_table
from data_pipeline.typed_config import REPO_ROOT
from tests.doubles.annotator import annotator_responder, failing_override
from tests.doubles.openai_server import StandInServer

SHIPPED_TOKENIZER = REPO_ROOT / "hymem_train" / "assets" / "tokenizer"


def _small_locomo(src: Path, dst: Path, num_sessions: int = 4, drop: tuple[int, ...] = ()) -> Path:
    """conv-30 of the bundled slice cut to its first sessions (fast builds), optionally with sessions removed."""
    sample = next(s for s in json.loads(src.read_text()) if s["sample_id"] == "conv-30")
    keep = [i for i in range(1, num_sessions + 1) if i not in drop]
    conv = sample["conversation"]
    for k in [k for k in conv if k.startswith("session_")]:
        n = int(k.split("_")[1])
        if n > num_sessions or (n in drop and not k.endswith("date_time")):
            del conv[k]
    for key in ("observation", "session_summary", "event_summary"):
        sample[key] = {k: v for k, v in sample[key].items() if int(re.search(r"session_(\d+)", k)[1]) in keep}
    ids = {t["dia_id"] for i in keep if f"session_{i}" in conv for t in conv[f"session_{i}"]}
    sample["qa"] = [q for q in sample["qa"] if q["evidence"] and set(q["evidence"]) <= ids]
    dst.write_text(json.dumps([sample]))
    return dst


def _cfg(tmp_path, locomo: Path, profiles=("mem0",), extra=()):
    cfg = load_config(["data=locomo_sample", f"out_dir={tmp_path / 'out'}", *extra])
    cfg.data.sources = cfg.data.sources[:1]
    cfg.data.sources[0].path = str(locomo)
    cfg.data.profiles = {p: cfg.data.profiles[p] for p in profiles}
    return cfg


# ------------------------------------------------------------------------------------------------
# loaders


def test_missing_session_is_an_error_naming_conversation_and_numbers(tmp_path, locomo_path, caplog):
    data = json.loads(locomo_path.read_text())
    del data[0]["conversation"]["session_1"]
    p = tmp_path / "locomo10.json"
    p.write_text(json.dumps(data))
    with pytest.raises(
        RecordError, match=r"sample conv-26: field 'conversation' has no session_1 \(sessions present: 2-19\)"
    ) as e:
        load_locomo(p)
    assert "data.allow_session_gaps=true" in str(e.value)
    # the override loads it, loudly
    res = load_locomo(p, allow_session_gaps=True)
    assert len(res.sequences[0].sessions) == 18 and "loaded anyway" in caplog.text
    # a gap in the middle, and a removed last session (its observations still name it)
    data = json.loads(locomo_path.read_text())
    for n in (5, 6, 19):
        del data[1]["conversation"][f"session_{n}"]
    p.write_text(json.dumps(data))
    with pytest.raises(
        RecordError, match=r"conv-30: .*no session_5, session_6, session_19 \(sessions present: 1-4, 7-18\)"
    ):
        load_locomo(p)


def test_session_gap_override_through_the_build_config(tmp_path, locomo_path):
    p = _small_locomo(locomo_path, tmp_path / "gap.json", drop=(2,))
    with pytest.raises(
        RecordError, match=r"data.sources\[0\] \(kind locomo\): .*gap.json sample conv-30: .*no session_2"
    ):
        build(_cfg(tmp_path, p))
    outs, _ = build(_cfg(tmp_path, p, extra=["data.allow_session_gaps=true"]))
    assert len(store.read_table(outs["mem0"], "chunks")) == 3


def test_empty_locomo_file_warns_with_zero_sequences(tmp_path, caplog, longmemeval_path):
    empty = tmp_path / "locomo10.json"
    empty.write_text("[]")
    cfg = load_config(["data=locomo_sample", f"out_dir={tmp_path / 'out'}"])
    cfg.data.sources[0].path = str(empty)
    cfg.data.sources[1].path = str(longmemeval_path)
    cfg.data.profiles = {"mem0": cfg.data.profiles["mem0"]}
    with caplog.at_level(logging.WARNING):
        build(cfg)
    assert f"data.sources[0] (kind locomo): {empty} contributed 0 sequences" in caplog.text


def test_source_kind_mixup_names_the_other_kind(tmp_path, locomo_path, longmemeval_path):
    with pytest.raises(
        RecordError,
        match=r"looks like a longmemeval file, not locomo .*set this source's kind to 'longmemeval'",
    ):
        load_locomo(longmemeval_path)
    with pytest.raises(
        RecordError, match=r"looks like a locomo file, not longmemeval .*set this source's kind to 'locomo'"
    ):
        load_longmemeval(locomo_path)
    with pytest.raises(RecordError, match=r"is one JSON list, not JSON Lines.*looks like a locomo file"):
        load_generic_jsonl(locomo_path)
    jsonl = tmp_path / "seqs.jsonl"
    jsonl.write_text('{"sequence_id": "a", "sessions": []}\n{"sequence_id": "b", "sessions": []}\n')
    with pytest.raises(
        RecordError, match=r"holds one JSON object per line .*set this source's kind to 'jsonl'"
    ):
        load_locomo(jsonl)


def test_evidence_variants_recovered_and_summary_split(tmp_path):
    known = {"D11:26", "D1:1"}
    assert parse_locomo_evidence("D:11:26", known) == (
        ["D11:26"],
        "nonstandard turn id 'D:11:26', read as D11:26",
    )
    assert parse_locomo_evidence("D11: 26", known)[0] == ["D11:26"]
    assert parse_locomo_evidence("D:11:27", known) == (
        [],
        "nonstandard turn id 'D:11:27', read as D11:27; unresolved: ['D11:27']",
    )
    statuses = [
        EvidenceIssue("f", "s", "i", "q", raw, *parse_locomo_evidence(raw, known)[::-1]).status
        for raw in ("D:11:26", "D8:6; D1:1", "D9:9", "D")
    ]
    assert statuses == ["recovered", "unresolved", "unresolved", "unresolved"]
    assert EvidenceIssue("f", "s", "i", "q", "", "empty evidence list").status == "empty"
    row = compute(
        "p", [], [], [], [], [], [], [], evidence_statuses=["unresolved", "recovered", "recovered", "empty"]
    )
    table = format_table([row])
    assert "evidence issues (unresolved/recovered/empty)" in table and "| 1/2/1 |" in table


def test_locomo_sample_evidence_summary_in_stats(tmp_path, locomo_path):
    outs, rows = build(_cfg(tmp_path, locomo_path))
    assert (rows[0].num_evidence_unresolved, rows[0].num_evidence_recovered, rows[0].num_evidence_empty) == (
        0,
        1,
        2,
    )
    issues = [json.loads(x) for x in (outs["mem0"] / "evidence_issues.jsonl").read_text().splitlines()]
    assert sorted(i["status"] for i in issues) == ["empty", "empty", "recovered"]
    assert "| 0/1/2 |" in (tmp_path / "out" / "stats.md").read_text()


# ------------------------------------------------------------------------------------------------
# entry point


def test_missing_file_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    args = ["data=locomo_sample", f"out_dir={tmp_path}", f"data.sources.0.path={tmp_path}/nope.json"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: data.sources[0] (kind locomo): {tmp_path}/nope.json: no such file")
    assert "\n" not in err and "Traceback" not in err
    with pytest.raises(RecordError, match="no such file"):
        main([*args, "--debug"])
    monkeypatch.setenv("HYMEM_DEBUG", "1")
    with pytest.raises(RecordError, match="no such file"):
        main(args)


def test_help_lists_config_groups_and_an_example(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "data=NAME" in out and "locomo_sample" in out and "synthetic_demo" in out
    assert "examples:" in out and "python -m data_pipeline.build data=locomo_sample" in out
    assert usage() in out
    from reward.judge_validation import main as judged_main

    assert judged_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m reward.judge_validation data=locomo_sample judge_validation.enabled=true" in out


@pytest.mark.parametrize(
    "mode,reason", [("context", r"\d+x platform: BadRequestError"), ("json", r"\d+x not valid JSON")]
)
def test_all_annotation_calls_failed_refuses_to_write(tmp_path, locomo_path, capsys, caplog, mode, reason):
    small = _small_locomo(locomo_path, tmp_path / "small.json")
    with StandInServer(annotator_responder(failing_override(mode))) as srv:
        args = [
            "data=locomo_sample",
            f"out_dir={tmp_path / 'out'}",
            f"data.sources=[{{kind:locomo,path:{small}}}]",
            "data.annotate=true",
            f"annotator.base_url={srv.base_url}",
            "annotator.model=m",
            "annotator.progress=false",
            "annotator.num_transport_retries=0",
            "annotator.num_retries=0",
        ]
        with caplog.at_level(logging.INFO):
            assert main(args) == 2
        with pytest.raises(
            BuildError,
            match=rf"only 0 of \d+ annotation calls succeeded \(0% < annotator.min_success_rate=0.9\); reasons: {reason}",
        ):
            main([*args, "--debug"])
    err = capsys.readouterr().err
    assert "profile mem0: only 0 of 4 annotation calls succeeded" in err and "failures.jsonl" in err
    assert not (tmp_path / "out" / "mem0").exists()  # nothing written
    # the HTTP client's one line per call stays out of the build's log
    assert not [r for r in caplog.records if "HTTP Request" in r.getMessage()]
    assert [r for r in caplog.records if r.name == "data_pipeline.annotate" and r.levelno == logging.INFO]


def test_some_annotation_failures_counted_in_stats(tmp_path, locomo_path):
    small = _small_locomo(locomo_path, tmp_path / "small.json")

    def first_chunk_fails(which, p, attempt):
        return 400 if which == "prm" and p["chunk_index"] == 0 else None

    cfg = _cfg(
        tmp_path,
        small,
        extra=[
            "data.annotate=true",
            "annotator.model=m",
            "annotator.progress=false",
            "annotator.base_url=http://127.0.0.1:1/v1",
            "annotator.num_transport_retries=0",
        ],
    )
    with StandInServer(annotator_responder(first_chunk_fails)) as srv:
        cfg.annotator.base_url = srv.base_url
        with pytest.raises(
            BuildError, match=r"only 4 of 5 annotation calls succeeded \(80%.*1x platform: BadRequestError"
        ):
            build(cfg)
        cfg.annotator.min_success_rate = 0.75
        outs, rows = build(cfg)
    assert (rows[0].num_annotation_failures, rows[0].num_annotation_calls) == (1, 5)
    assert "| 1/5 |" in (outs["mem0"] / "stats.md").read_text()
    assert "annotation failures" in (tmp_path / "out" / "stats.md").read_text()


# ------------------------------------------------------------------------------------------------
# output on disk


def test_killed_build_is_recognisable_and_refused(tmp_path, locomo_path, monkeypatch):
    small = _small_locomo(locomo_path, tmp_path / "small.json")
    out = tmp_path / "out"
    outs, _ = build(_cfg(tmp_path, small, profiles=("mem0", "memos")))
    old_id = store.read_manifest(outs["mem0"]).config["build_id"]
    assert json.loads((out / "build.json").read_text())["profiles"] == {"mem0": old_id, "memos": old_id}

    real_install = build_mod.install_profile
    installed = []

    class Killed(BaseException):
        pass

    def install_then_die(staged, target):
        if installed:
            raise Killed  # dies after the first profile went into place
        installed.append(target.name)
        return real_install(staged, target)

    monkeypatch.setattr(build_mod, "install_profile", install_then_die)
    with pytest.raises(Killed):
        build(_cfg(tmp_path, small, profiles=("mem0", "memos"), extra=["data.eval_seed=1"]))
    monkeypatch.undo()
    assert installed == ["mem0"] and (out / store.BUILD_INCOMPLETE).exists()
    for p in ("mem0", "memos"):
        with pytest.raises(
            RecordError, match=r"the data build of .* did not finish \(.*BUILD_INCOMPLETE exists"
        ):
            store.BuiltDataset(out / p)
    # without the marker the mix is still caught: mem0 is new, build.json names the old build
    (out / store.BUILD_INCOMPLETE).unlink()
    with pytest.raises(RecordError, match=r"mem0: built by build .*names build .* mixes two builds"):
        store.read_table(out / "mem0", "chunks")
    store.BuiltDataset(out / "memos")  # the old, consistent one
    # a killed build's staging directory (dead pid) is removed by the next build, which is readable
    stale = out / ".staging-20200101-000000-999999999-x"
    stale.mkdir()
    outs, _ = build(_cfg(tmp_path, small, profiles=("mem0", "memos")))
    assert not stale.exists() and not (out / store.BUILD_INCOMPLETE).exists()
    assert not list(out.glob(".staging-*")) and not list(out.glob(".*.old-*"))
    for p in outs.values():
        store.BuiltDataset(p)


def test_failed_profile_leaves_previous_output(tmp_path, locomo_path, monkeypatch):
    small = _small_locomo(locomo_path, tmp_path / "small.json")
    outs, _ = build(_cfg(tmp_path, small, profiles=("mem0", "memos")))
    before = {p: store.read_manifest(d).config["build_id"] for p, d in outs.items()}

    real = build_mod.build_profile

    def second_fails(cfg, profile, *a, **k):
        if profile == "memos":
            raise RuntimeError("boom")
        return real(cfg, profile, *a, **k)

    monkeypatch.setattr(build_mod, "build_profile", second_fails)
    with pytest.raises(RuntimeError):
        build(_cfg(tmp_path, small, profiles=("mem0", "memos")))
    after = {p: store.BuiltDataset(d).manifest.config["build_id"] for p, d in outs.items()}
    assert after == before  # staged only: nothing replaced


@pytest.mark.parametrize("umask,dmode,fmode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_outputs_readable_by_others_respecting_umask(tmp_path, umask, dmode, fmode):
    old = os.umask(umask)
    try:
        assert main([f"out_dir={tmp_path}", "data.synthetic.num_sequences=2"]) == 0
    finally:
        os.umask(old)
    root = tmp_path / "hy_memory"

    def mode(p):
        return stat.S_IMODE(p.stat().st_mode)

    assert [mode(p) for p in (root, root / "chunks")] == [dmode, dmode]
    files = [
        tmp_path / "stats.md",
        tmp_path / "stats.json",
        tmp_path / "build.json",
        root / "stats.md",
        root / "manifest.json",
    ]
    assert [mode(p) for p in files] == [fmode] * len(files)


# ------------------------------------------------------------------------------------------------
# chunk budgets


@pytest.mark.parametrize("mode", ["tokens", "session_tokens"])
def test_no_chunk_over_budget_with_shipped_tokenizer(mode, locomo_path, longmemeval_path):
    if not (SHIPPED_TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"shipped tokenizer missing: {SHIPPED_TOKENIZER}")
    tok = load_tokenizer(str(SHIPPED_TOKENIZER))
    seqs = load_locomo(locomo_path).sequences + load_longmemeval(longmemeval_path).sequences
    cfg = ChunkingConfig(mode=mode, max_tokens=512)
    chunks = [c for s in seqs for c in chunk_sequence(s, cfg, tok)]
    over = [(c.sequence_id, c.index, c.num_tokens) for c in chunks if c.num_tokens > 512 and len(c.turns) > 1]
    assert not over, f"{len(over)} of {len(chunks)} multi-turn chunks exceed 512 tokens: {over[:5]}"
    for c in chunks[:50]:
        assert c.num_tokens == len(tok.encode(render_chunk(c)))
    # packing stays tight: most chunks use a good part of the budget
    multi = [c.num_tokens for c in chunks if len(c.turns) > 1]
    assert sum(multi) / len(multi) > 200


_KILL_AFTER_FIRST_PROFILE = """
import os, signal, sys
import data_pipeline.build as b
real, done = b.install_profile, []
def install(staged, target):
    if done:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 between two renames: no finally, no cleanup
    done.append(target)
    return real(staged, target)
b.install_profile = install
b.main(sys.argv[1:])
"""


def test_real_sigkill_mid_install_is_refused(tmp_path, locomo_path):
    small = _small_locomo(locomo_path, tmp_path / "small.json")
    out = tmp_path / "out"
    args = ["data=locomo_sample", f"out_dir={out}", f"data.sources=[{{kind:locomo,path:{small}}}]"]
    assert main(args) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_FIRST_PROFILE, *args, "data.eval_seed=1"], env=env
    )
    assert proc.returncode == -9
    with pytest.raises(RecordError, match=r"did not finish .*BUILD_INCOMPLETE exists: build .*pid"):
        store.BuiltDataset(out / "memos")
    assert main(args) == 0  # a rerun repairs it
    store.BuiltDataset(out / "memos")
