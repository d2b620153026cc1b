"""The embedded-default pipeline `make demo` runs on 2 CPU cores.

Demo code, not part of the hymem_train package: each stage runs as its real entry point
(`python -m hymem_train.sft / .opd / .rl / .evaluate`) in a subprocess; this module orchestrates and reports.

ledger-world data (train, OPD/RL prompts, held-out) -> the flawed teacher's demonstrations through the
real native harness -> copy-episode pretraining of the tiny model -> SFT on the demonstrations with the
copy corpus mixed in, whose checkpoint after two of its four epochs is the student and whose end is the
teacher -> OPD of the student from the teacher -> RL of the
student (reader = the extractive instrument, exact match per gold fact) -> the writer-swap table and the
bank metrics on held-out sequences (bound rows, the three students, the teacher) -> report.md with the
paired differences the recipe predicts (docs/testbed.md).

The teacher's demonstrations come from `LedgerOracle` with planted flaws (it stores half the small talk
and overwrites a third of the changes): the report's teacher is strong but imperfect, and RL is meant
to go beyond it. Gold facts reach only the demonstrator, never a bank the policy reads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harnesses.registry import HarnessConfig

log = logging.getLogger(__name__)

# the demo teacher's planted flaws (data_pipeline/ledger_oracle.py `Flaws`): what RL can fix
TEACHER_FLAWS = {"store_small_talk": 0.5, "drop_history": 0.3}


def build_data(
    root: Path,
    *,
    num_sequences: int,
    num_chunks: int,
    window: int,
    seed: int,
    unique_names: bool = True,
    world: str = "templated",
) -> Path:
    from data_pipeline.build import build, load_config

    cfg = load_config(
        [
            f"out_dir={root}",
            "data.name=demo",
            f"data.synthetic.num_sequences={num_sequences}",
            f"data.synthetic.unique_person_names={str(unique_names).lower()}",
            f"data.synthetic.world={world}",
            f"data.synthetic.num_chunks_per_sequence={num_chunks}",
            f"data.synthetic.num_chunks_per_window={window}",
            f"data.synthetic.seed={seed}",
            "~data.profiles.hy_memory",
            f"+data.profiles={{native: {{mode: session, max_tokens: 0, num_chunks_per_window: {window}, tokenizer_path: ''}}}}",
        ]
    )
    outs, _ = build(cfg)
    return outs["native"]


def demo_harness():
    """The native harness the demo's stages write through (configs/exp/demo_*.yaml hold the same)."""
    h = HarnessConfig(framework="native", in_process=True)
    h.native.max_tokens, h.native.num_context_memories = 96, 6
    return h


def teacher_demonstrations(
    ds_path: Path, out: Path, harness_cfg, flaws: dict, *, workers: int = 2
) -> dict[str, int]:
    """Writer segments of the flawed ledger oracle, written through the real native harness, gateway and
    chat template the policy later uses (so the teacher learns the exact prompt); one per chunk. Returns
    the segment count and what the oracle did, by kind (its planted flaws included).

    `workers` processes write contiguous shards of the sorted sequences (one process keeps one core busy:
    the gateway and the harness share its interpreter). The oracle's draws hash each line, so the file is
    the same for any number of workers."""
    from collections import Counter
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from data_pipeline.store import BuiltDataset

    seqs = sorted({w.sequence_id for w in BuiltDataset(ds_path).windows})
    n = max(1, min(workers, len(seqs)))
    shards = [seqs[i * len(seqs) // n : (i + 1) * len(seqs) // n] for i in range(n)]
    jobs = [(ds_path, out.parent / "oracle", harness_cfg, flaws, shard) for shard in shards]
    if n == 1:
        parts = [_demonstrations_of(*jobs[0])]
    else:
        with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as ex:
            parts = list(ex.map(_demonstrations_of, *zip(*jobs, strict=True)))
    rows = [r for part_rows, _ in parts for r in part_rows]
    counts = Counter()
    for _, c in parts:
        counts.update(c)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"writer_segments": len(rows), **{f"oracle_{k}": v for k, v in sorted(counts.items())}}


def _demonstrations_of(
    ds_path: Path, bank_root: Path, harness_cfg, flaws: dict, sequences: list[str]
) -> tuple[list[dict], dict[str, int]]:
    """One shard of `teacher_demonstrations`: its sequences' windows in order, each window's bank carried
    into the next; returns the segments and the oracle's counts."""
    from data_pipeline.ledger_oracle import Flaws, LedgerOracle
    from data_pipeline.store import BuiltDataset
    from hymem_train.engines.scripted import ScriptedEngine
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway, GatewayConfig
    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.rollout.worker import RolloutTask, RolloutWorker

    ds = BuiltDataset(ds_path)
    keep = set(sequences)
    tok = default_tokenizer()
    oracle = LedgerOracle(Flaws(**flaws))
    gw = Gateway(ScriptedEngine(tok, oracle), tok, GatewayConfig(embeddings=False))
    rows: list[dict] = []
    with GatewayServer(gw) as srv:
        worker = RolloutWorker({"native": harness_cfg}, srv.url, gw.admin_token)
        parents: dict[str, str] = {}
        windows = sorted(
            (w for w in ds.windows if w.sequence_id in keep), key=lambda w: (w.sequence_id, w.index)
        )
        for w in windows:
            task = RolloutTask(
                w,
                ds.chunks_of(w),
                0,
                "native",
                parents.get(w.sequence_id),
                str(bank_root / w.window_id.replace("/", "_")),
            )
            res = worker.run(task)
            parents[w.sequence_id] = res.record.final_bank_dir
            rows += [{"prompt_ids": s.prompt_ids, "response_ids": s.response_ids} for s in res.segments]
    return rows, dict(oracle.counts)


def pretraining_data(
    out: Path, num_documents: int, seed: int, mixed_share: float = 0.35, session_share: float = 0.0
) -> int:
    """The pretraining stand-in corpus (data_pipeline.ledger.pretraining_documents: copy episodes in
    the ledger's own forms) as SFT `text_ids` records: plain language modelling, loss on every token.
    Returns the token count."""
    from data_pipeline.ledger import pretraining_documents
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w") as f:
        for doc in pretraining_documents(
            num_documents, seed, mixed_share=mixed_share, session_share=session_share
        ):
            ids = tok.encode(doc) + [tok.eos_token_id]
            n += len(ids)
            f.write(json.dumps({"text_ids": ids}) + "\n")
    return n


def history(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
    by = {r["step"]: r for r in rows}
    return [by[s] for s in sorted(by)]


def first_last(rows: list[dict], key: str) -> tuple[float, float] | None:
    vals = [r[key] for r in rows if key in r]
    return (vals[0], vals[-1]) if vals else None


def _start(args: list[str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as f:
        return subprocess.Popen([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, log_path: Path) -> None:
    if proc.wait() != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise RuntimeError(
            f"`python {' '.join(proc.args[1:])}` failed (exit {proc.returncode}); see {log_path}:\n{tail}"
        )


def _run(args: list[str], log_path: Path) -> None:
    _wait(_start(args, log_path), log_path)


def _beside(side: list[str], side_log: Path, main: list[str], main_log: Path) -> float:
    """`main` run with `side` started beside it; a failing `main` kills `side`, a failing `side` fails the
    demo. Returns the seconds `side` ran past `main`."""
    proc = _start(side, side_log)
    try:
        _run(main, main_log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    t = time.perf_counter()
    _wait(proc, side_log)
    return time.perf_counter() - t


def run_demo(
    root: str | Path = "runs/demo",
    *,
    num_train_sequences: int = 500,
    num_prompt_sequences: int = 96,
    num_eval_sequences: int = 24,
    num_final_eval_sequences: int = 96,
    num_chunks: int = 6,
    pretrain_documents: int = 4000,
    pretrain_session_share: float = 0.0,
    teacher_epochs: int = 4,
    teacher_pretrain_mix: int = 2000,
    student_epochs: int = 2,
    rl_steps: int | None = None,
    data_seed: int = 0,
    run_seed: int = 0,
    extra: dict[str, list[str]] | None = None,
) -> dict:
    """The whole tiny pipeline; each stage is the real entry point in its own process. `data_seed` draws
    the data (and the pretraining corpus), `run_seed` every training run's seeds: a seed pair. The
    stages evaluate on `num_eval_sequences` held-out sequences; the final evaluation reads those and more
    drawn from the same seed, `num_final_eval_sequences` in all (`final_eval_data`)."""
    extra = extra or {}
    if not 1 <= student_epochs < teacher_epochs:
        raise ValueError(
            f"student_epochs={student_epochs}: want 1 <= student_epochs < teacher_epochs={teacher_epochs}"
        )
    if not 0 <= teacher_pretrain_mix <= pretrain_documents:
        # a negative count would slice from the corpus's end, a larger one silently mix in all of it
        raise ValueError(
            f"teacher_pretrain_mix={teacher_pretrain_mix}: want 0 <= teacher_pretrain_mix <= "
            f"pretrain_documents={pretrain_documents}"
        )
    if num_train_sequences < 1:
        raise ValueError(
            f"num_train_sequences={num_train_sequences}: want >= 1 (the teacher's demonstrations)"
        )
    if rl_steps is not None and rl_steps < 1:
        raise ValueError(f"rl_steps={rl_steps}: want >= 1 (None keeps configs/exp/demo_rl.yaml's num_steps)")
    if num_final_eval_sequences < num_eval_sequences:
        raise ValueError(
            f"num_final_eval_sequences={num_final_eval_sequences}: want >= num_eval_sequences="
            f"{num_eval_sequences} (the final evaluation reads the stages' held-out sequences and more)"
        )
    root = Path(root)
    t0 = time.perf_counter()
    timings = {}
    print(f"[1/8] ledger-world data -> {root}/data", flush=True)
    sizes = {"num_chunks": num_chunks, "window": 3, "world": "ledger"}
    train = build_data(root / "data" / "train", num_sequences=num_train_sequences, seed=data_seed, **sizes)
    # OPD and RL prompts: sequences the demonstrations never showed; held-out: the evaluation's own
    prompts = build_data(
        root / "data" / "prompts", num_sequences=num_prompt_sequences, seed=data_seed + 2000, **sizes
    )
    held = build_data(
        root / "data" / "eval", num_sequences=num_eval_sequences, seed=data_seed + 1000, **sizes
    )
    final = final_eval_data(root, num_final_eval_sequences)
    timings["data"] = time.perf_counter() - t0

    print("[2/8] the flawed teacher's demonstrations through the native harness; probe leakage", flush=True)
    t = time.perf_counter()
    counts = teacher_demonstrations(train, root / "sft" / "demos.jsonl", demo_harness(), TEACHER_FLAWS)
    print(f"      {counts['writer_segments']} writer segments", flush=True)
    counts["leaked"] = probe_leakage(root, {"prompts": prompts, "eval": held, "final_eval": final})
    counts["pretrain_tokens"] = pretraining_data(
        root / "pretrain" / "data.jsonl",
        pretrain_documents,
        seed=data_seed,
        session_share=pretrain_session_share,
    )
    counts["pretrain_documents"], counts["pretrain_session_share"] = (
        pretrain_documents,
        pretrain_session_share,
    )
    # the teacher's SFT keeps part of the copy corpus in its mix: without it, SFT on the harness's format
    # unlearnt the copying the pretraining had taught (docs/testbed.md, "Why the recipe looks like this")
    demos = (root / "sft" / "demos.jsonl").read_text().splitlines()
    pre = (root / "pretrain" / "data.jsonl").read_text().splitlines()
    (root / "sft" / "teacher.jsonl").write_text("\n".join(demos + pre[:teacher_pretrain_mix]) + "\n")
    timings["demonstrations"] = time.perf_counter() - t

    sft = [
        "num_segments_per_step=16",
        "trainer.gradient_checkpointing=false",
        "trainer.zero_stage=0",
        f"trainer.seed={run_seed}",
        f"model.seed={run_seed}",
    ]
    print("[3/8] pretraining stand-in (python -m hymem_train.sft, plain LM)", flush=True)
    t = time.perf_counter()
    # one epoch of copy episodes stands in for the report's pretrained LLM
    _run(
        [
            "-m",
            "hymem_train.sft",
            "model=tiny_teacher",
            f"data_path={root}/pretrain/data.jsonl",
            f"out_dir={root}/pretrain_teacher",
            "num_epochs=1",
            "trainer.lr=2e-3",
            *sft,
            *extra.get("pretrain", []),
        ],
        root / "logs" / "pretrain_teacher.log",
    )
    timings["pretrain"] = time.perf_counter() - t

    print(
        f"[4/8] SFT, copy corpus mixed in (python -m hymem_train.sft): {student_epochs} epochs -> the student, "
        f"resumed to {teacher_epochs} -> the teacher",
        flush=True,
    )
    t = time.perf_counter()
    # The student is this run stopped early: its copying is partly formed (recall 0.54 against the
    # four-epoch teacher's 0.86 on pair 0), which OPD can move; students without it did not (docs/testbed.md).
    teacher_sft = [
        "-m",
        "hymem_train.sft",
        f"model.path={root}/pretrain_teacher/final",
        f"data_path={root}/sft/teacher.jsonl",
        "trainer.lr=1e-3",
        *sft,
        *extra.get("sft", []),
    ]
    _run(
        [*teacher_sft, f"out_dir={root}/student_init", f"num_epochs={student_epochs}"],
        root / "logs" / "sft_student.log",
    )
    # the teacher resumes the student's last checkpoint: each epoch's own shuffle and the constant lr
    # make it the same run as one uninterrupted SFT of teacher_epochs (its losses match step for step)
    if not (root / "sft" / "checkpoints").exists():
        shutil.copytree(root / "student_init" / "checkpoints", root / "sft" / "checkpoints")
    _run(
        [*teacher_sft, f"out_dir={root}/sft", f"num_epochs={teacher_epochs}"],
        root / "logs" / "sft_teacher.log",
    )
    timings["sft"] = time.perf_counter() - t

    common = [f"data.path={prompts}", f"data.eval_path={held}", f"run.seed={run_seed}"]
    ev = extra.get("eval", [])
    print(
        "[5/8] OPD: student <- teacher (python -m hymem_train.opd +exp=demo_opd); the bounds, the SFT student "
        "and the teacher are evaluated beside it",
        flush=True,
    )
    t = time.perf_counter()
    # OPD leaves about a third of the two cores idle and RL about a quarter, so each writer is read as soon
    # as it exists, beside the next stage; the evaluation after RL reuses their cached banks (greedy
    # decoding: the same table as one evaluation of every writer; tests/evaluation)
    waited = _beside(
        _evaluate_args(root, final, run_seed, ev, skip=("opd", "rl")),
        root / "logs" / "evaluate_beside_opd.log",
        [
            "-m",
            "hymem_train.opd",
            "+exp=demo_opd",
            *common,
            f"teacher.path={root}/sft/final",
            f"init_checkpoint={root}/student_init/final",
            f"run.output_dir={root}/opd",
            *extra.get("opd", []),
        ],
        root / "logs" / "opd.log",
    )
    timings["opd"] = time.perf_counter() - t - waited

    # The growth penalty's bounds from the OPD student's own writes, as docs/reward.md prescribes
    growth, counts["growth_bounds"] = growth_overrides(root / "opd")
    print(f"      {counts['growth_bounds']}", flush=True)
    print(
        "[6/8] RL: chunk-level GRPO, extractive reader (python -m hymem_train.rl +exp=demo_rl); the OPD "
        "student is evaluated beside it",
        flush=True,
    )
    t = time.perf_counter()
    waited_rl = _beside(
        _evaluate_args(root, final, run_seed, ev, skip=("rl",)),
        root / "logs" / "evaluate_beside_rl.log",
        [
            "-m",
            "hymem_train.rl",
            "+exp=demo_rl",
            *common,
            f"init_checkpoint={root}/opd/final",
            f"run.output_dir={root}/rl",
            *growth,
            # the step count on the command line, not in the recipe file: the ablation runs key on
            # that file and keep their own step count
            *(() if rl_steps is None else (f"num_steps={rl_steps}", f"eval_every={rl_steps}")),
            *extra.get("rl", []),
        ],
        root / "logs" / "rl.log",
    )
    timings["rl"] = time.perf_counter() - t - waited_rl

    print(
        "[7/8] writer-swap table and bank metrics: bounds, students, teacher (python -m hymem_train.evaluate "
        "+exp=evaluate_demo)",
        flush=True,
    )
    t = time.perf_counter()
    evaluate_writers(root, final, run_seed, ev)
    # the time the side evaluations ran past their stages counts as the evaluation's
    timings["evaluate"] = time.perf_counter() - t + waited + waited_rl
    print("[8/8] report", flush=True)
    timings["total"] = time.perf_counter() - t0
    counts["train_sequences"], counts["eval_sequences"] = num_train_sequences, num_eval_sequences
    counts["final_eval_sequences"] = num_final_eval_sequences
    counts["student_epochs"], counts["teacher_epochs"] = student_epochs, teacher_epochs
    counts["rl_steps"] = rl_steps
    counts["prompt_sequences"], counts["data_seed"], counts["run_seed"] = (
        num_prompt_sequences,
        data_seed,
        run_seed,
    )
    return write_report(root, counts, timings)


def _evaluate_args(
    root: Path, held: Path, run_seed: int, extra: list[str], skip: tuple[str, ...] = ()
) -> list[str]:
    writers = ", ".join(
        ["{name: nothing, kind: empty}", "{name: gold, kind: gold}"]
        + [f"{{name: {n}, checkpoint: '{root}/{d}/final'}}" for n, d in DEMO_WRITERS if n not in skip]
    )
    return [
        "-m",
        "hymem_train.evaluate",
        "+exp=evaluate_demo",
        f"writers=[{writers}]",
        f"data.path={held}",
        f"run.output_dir={root}/swap",
        f"run.seed={run_seed}",
        *extra,
    ]


def evaluate_writers(root: Path, held: Path, run_seed: int, extra: list[str]) -> None:
    """The writer-swap table and bank metrics of a demo's writers (the bounds, the students, the teacher)."""
    _run(_evaluate_args(root, held, run_seed, extra), root / "logs" / "evaluate.log")


def probe_leakage(root: Path, splits: dict[str, Path]) -> dict[str, float]:
    """Each split's share of probes the reader answers from an empty bank: those measure nothing about the
    writer, and the stages and the evaluation drop them (reward/leakage.py)."""
    _run(
        ["-m", "reward.leakage", *map(str, splits.values()), "--reader", "extractive"],
        root / "logs" / f"leakage_{'_'.join(splits)}.log",
    )
    return {k: json.loads((p / "leakage.json").read_text())["leaked_share"] for k, p in splits.items()}


def final_eval_data(root: Path, num_sequences: int) -> Path:
    """The final evaluation's held-out sequences: the stages' (`data/eval`) and more, drawn by the same
    synthetic config but for the count. The ledger world draws sequence by sequence, so the first of
    them are the stages' (tests/stages/test_demo_pipeline.py checks it)."""
    held = root / "data" / "eval" / "native"
    syn = json.loads((held / "manifest.json").read_text())["config"]["data"]["synthetic"]
    if num_sequences < syn["num_sequences"]:
        raise ValueError(
            f"num_final_eval_sequences={num_sequences}: want >= the {syn['num_sequences']} held-out "
            f"sequences of {held} (the final evaluation reads those and more)"
        )
    out = root / "data" / "final_eval"
    shutil.rmtree(out, ignore_errors=True)  # rebuilt whole: the same sequences every time
    return build_data(
        out,
        num_sequences=num_sequences,
        seed=syn["seed"],
        num_chunks=syn["num_chunks_per_sequence"],
        window=syn["num_chunks_per_window"],
        unique_names=syn["unique_person_names"],
        world=syn["world"],
    )


def reevaluate(root: str | Path, num_final_eval_sequences: int = 96) -> dict:
    """A finished demo evaluated again (its evaluation and report only, nothing retrained): after a change
    to the evaluation, the same checkpoints read under it. The old table is replaced once the new one is
    done; an evaluation that fails leaves the old one in place. The final evaluation's held-out set is
    built again from the stages' (`final_eval_data`), so a demo from before it had one gets it too."""
    root = Path(root)
    old = json.loads((root / "report.json").read_text())
    t = time.perf_counter()
    final = final_eval_data(root, num_final_eval_sequences)
    counts = {
        **old["counts"],
        "final_eval_sequences": num_final_eval_sequences,
        "leaked": {**old["counts"].get("leaked", {}), **probe_leakage(root, {"final_eval": final})},
    }
    swap, previous = root / "swap", root / "swap.previous"
    shutil.rmtree(previous, ignore_errors=True)
    if swap.exists():
        swap.rename(previous)  # its cache was built under the old evaluation: not resumed
    try:
        evaluate_writers(root, final, counts["run_seed"], [])
    except BaseException:
        shutil.rmtree(swap, ignore_errors=True)
        if previous.exists():
            previous.rename(swap)
        raise
    shutil.rmtree(previous, ignore_errors=True)
    took = time.perf_counter() - t
    timings = {
        **old["timings"],
        "evaluate": took,
        "total": old["timings"]["total"] - old["timings"]["evaluate"] + took,
    }
    return write_report(root, counts, timings)


# the model writers of the table, in the order the recipe predicts them to improve (checkpoint dirs)
DEMO_WRITERS = (("sft", "student_init"), ("opd", "opd"), ("rl", "rl"), ("teacher", "sft"))


def growth_overrides(opd_dir: Path, harness: str = "native") -> tuple[list[str], str]:
    """RL overrides for the growth penalty calibrated from the OPD run's recorded bank sizes
    (reward.calibrate_growth, also written to <opd>/growth_bounds.yaml), and a line for the report.
    Too few valid OPD writes to take quantiles from keeps the config's bounds, and the line says why."""
    from reward.calibrate_growth import calibrate, load_rows, to_yaml

    try:
        cals = calibrate(load_rows([opd_dir]))
    except (FileNotFoundError, ValueError) as e:
        return [], f"growth penalty: the config's bounds (not calibrated: {e})"
    (opd_dir / "growth_bounds.yaml").write_text(to_yaml(cals))
    c = cals[harness]
    q = c.quantiles
    return c.overrides(), (
        f"growth penalty: l_h={c.lower:.3g}, u_h={c.upper:.3g}, floor={c.floor_tokens} tokens, from {c.num_writes} "
        f"OPD writes (g_t median {q['p50']:.2f}, p99 {q['p99']:.2f}; {c.share_penalised:.0%} of them above l_h)"
    )


# The differences the recipe predicts, registered before the runs (docs/testbed.md): (a, b, bank metric,
# rule, why). Over held-out sequences, a - b's paired 95% interval lies above 0 ("> 0"), or does not lie
# below it (">= 0": no loss shown).
PREDICTIONS = (
    (
        "opd",
        "sft",
        "memory_recall",
        "> 0",
        "OPD moves the student toward the teacher, which stores more gold facts",
    ),
    (
        "rl",
        "opd",
        "false_memory_resistance",
        "> 0",
        "the trap probes penalise the small talk the teacher taught to store",
    ),
    ("rl", "opd", "history_kept", "> 0", "the ORM history questions reward the states the teacher overwrote"),
    (
        "rl",
        "opd",
        "memory_recall",
        ">= 0",
        "the probes reward the gold facts RL must keep while refusing small talk",
    ),
)


# where a gain comes from, by operation class (bank metrics: reward/bank_metrics.py METRICS)
GAIN_CLASSES = (
    ("new facts extracted", "memory_recall"),
    ("records that are gold points", "target_precision"),
    ("Transitions (every state kept)", "history_kept"),
    ("updates right", "update_correct"),
    ("restatements reconciled (one record)", "restated_once"),
    ("traps refused (small talk not stored)", "false_memory_resistance"),
    ("deletions (share of ops)", "op_delete"),
    ("malformed writes (share of ops)", "op_invalid"),
    ("records outside the grammar", "unparsed_share"),
)
GAIN_PAIRS = (("opd", "sft"), ("rl", "opd"))


def gain_decomposition(bank_json: Path, pairs: tuple[tuple[str, str], ...] = GAIN_PAIRS) -> list[str]:
    """OPD - SFT and RL - OPD split by operation class: each class's paired difference over held-out
    sequences with its 95% interval (bank_metrics.json); "*" marks an interval that excludes 0."""
    doc = json.loads(bank_json.read_text())["harnesses"]["native"] if bank_json.exists() else {}
    diffs = {(d["a"], d["b"], d["metric"]): d for d in doc.get("differences", [])}
    if not diffs:
        return []
    L = [
        "",
        "## Where the gain comes from (paired over held-out sequences, 95% interval; * excludes 0)",
        "| operation class | bank metric | " + " | ".join(f"{a} - {b}" for a, b in pairs) + " |",
        "|---|---|" + "---|" * len(pairs),
    ]
    for label, metric in GAIN_CLASSES:
        cells = []
        for a, b in pairs:
            d = diffs.get((a, b, metric))
            if d is None or d["lo"] is None:
                cells.append("n/a")
                continue
            star = "*" if d["lo"] > 0 or d["hi"] < 0 else ""
            cells.append(f"{d['value']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]{star}")
        L.append(f"| {label} | {metric} | " + " | ".join(cells) + " |")
    return L


def paired_checks(bank_json: Path) -> list[dict]:
    """Each prediction against the paired differences of bank_metrics.json (missing pair: not held)."""
    doc = json.loads(bank_json.read_text())["harnesses"]["native"] if bank_json.exists() else {}
    diffs = {(d["a"], d["b"], d["metric"]): d for d in doc.get("differences", [])}
    out = []
    for a, b, metric, rule, why in PREDICTIONS:
        d = diffs.get((a, b, metric))
        ok = d is not None and d["lo"] is not None and (d["lo"] > 0 if rule == "> 0" else d["hi"] >= 0)
        out.append(
            {
                "a": a,
                "b": b,
                "metric": metric,
                "rule": rule,
                "why": why,
                "held": ok,
                **(
                    {k: d[k] for k in ("value", "lo", "hi")} if d else {"value": None, "lo": None, "hi": None}
                ),
            }
        )
    return out


# the testbed's gates: the teacher must be able to do the task, and RL must start with signal
TEACHER_RECALL_GATE = 0.6  # gold facts stored value-exact by the teacher, held out
PASS1_RANGE = (0.2, 0.7)  # the OPD student's held-out mean chunk score at RL step 0, over its maximum
ZERO_ADV_MAX = 0.5  # share of scored cells with no GRPO signal at RL step 1


def score_maximum(rl_config: Path) -> float:
    """w_prm + w_orm of the RL run's scoring (ScoringConfig's defaults when the run left no config)."""
    import yaml

    from reward.scoring import ScoringConfig

    d = {f.name: f.default for f in dataclasses.fields(ScoringConfig)}
    sc = (
        (yaml.safe_load(rl_config.read_text()) or {}).get("reward", {}).get("scoring", {})
        if rl_config.exists()
        else {}
    )
    return float(sc.get("w_prm", d["w_prm"])) + float(sc.get("w_orm", d["w_orm"]))


def gates(root: Path, rl: list[dict]) -> list[dict]:
    """Each gate's measured value and whether it is met (a missing number: not met)."""
    bank = root / "swap" / "eval" / "bank_metrics.json"
    writers = json.loads(bank.read_text())["harnesses"]["native"]["writers"] if bank.exists() else {}
    recall = writers.get("teacher", {}).get("memory_recall", {}).get("value")
    s0 = next((r["eval/s"] for r in rl if r.get("step") == 0 and "eval/s" in r), None)
    # s[t] = w_prm prm + w_orm orm - w_pen pen, with prm and orm in [0, 1]: a pass rate is s over its
    # maximum, so the range stays a rate once the ORM term scores (raw s was 1.56 at step 0 on seed 0)
    top = score_maximum(root / "rl" / "config.yaml")
    s0 = None if s0 is None else s0 / top
    z1 = next((r["reward/zero_advantage_share"] for r in rl if "reward/zero_advantage_share" in r), None)
    lo, hi = PASS1_RANGE
    return [
        {
            "gate": f"teacher's held-out memory recall >= {TEACHER_RECALL_GATE}",
            "value": recall,
            "met": recall is not None and recall >= TEACHER_RECALL_GATE,
        },
        {
            "gate": f"OPD student's held-out chunk score at RL step 0 / its maximum {top:g} in [{lo}, {hi}]",
            "value": s0,
            "met": s0 is not None and lo <= s0 <= hi,
        },
        {
            "gate": f"zero-advantage share at RL step 1 <= {ZERO_ADV_MAX}",
            "value": z1,
            "met": z1 is not None and z1 <= ZERO_ADV_MAX,
        },
    ]


def _preflight_line(path: Path) -> str:
    if not path.exists():
        return "reader self-checks: not run"
    checks = json.loads(path.read_text()).get("checks", {})
    return "reader self-checks: " + ", ".join(f"{k} {c['value']:.2f}" for k, c in checks.items())


def write_report(root: Path, counts: dict, timings: dict) -> dict:
    opd, rl = history(root / "opd"), history(root / "rl")
    kl = first_last(opd, "eval/reverse_kl")
    kl_train = first_last(opd, "distill/reverse_kl_topk")
    rew = first_last(rl, "eval/s")
    prm = first_last(rl, "eval/prm")
    rew_train = first_last(rl, "reward/s")
    pen = first_last(rl, "eval/pen")
    zadv = [r["reward/zero_advantage_share"] for r in rl if "reward/zero_advantage_share" in r]
    flaws = ", ".join(
        f"{k.removeprefix('oracle_')} {v}" for k, v in counts.items() if k.startswith("oracle_")
    )
    checks = paired_checks(root / "swap" / "eval" / "bank_metrics.json")
    gate_rows = gates(root, rl)
    lines = [
        "# hymem-train CPU demo report",
        "",
        f"data (ledger world, data seed {counts.get('data_seed', 0)}, run seed {counts.get('run_seed', 0)}): "
        f"{counts['train_sequences']} demonstration sequences, {counts.get('prompt_sequences', 0)} OPD/RL prompt "
        f"sequences, {counts['eval_sequences']} held-out sequences for the stages and "
        f"{counts.get('final_eval_sequences', counts['eval_sequences'])} (those and more) for the final "
        f"evaluation; {counts['writer_segments']} teacher "
        f"demonstrations ({flaws})",
        f"pretraining stand-in: {counts.get('pretrain_documents', 0)} copy-episode documents"
        + (
            f" ({counts['pretrain_session_share']:.0%} of the episodes in the writer prompt's layout)"
            if counts.get("pretrain_session_share")
            else ""
        )
        + f", {counts.get('pretrain_tokens', 0)} tokens; probes leaked from an empty bank: "
        + ", ".join(f"{k} {v:.1%}" for k, v in counts.get("leaked", {}).items()),
        "",
        f"## OPD (student: the SFT after {counts.get('student_epochs', '?')} of its "
        f"{counts.get('teacher_epochs', '?')} epochs <- teacher: its end; both 4 layers, hidden 128)",
        "- held-out reverse KL(student || teacher), full vocab, at the student's sampled positions: "
        + (f"{kl[0]:.3f} (step 0) -> {kl[1]:.3f} (last step)" if kl else "n/a"),
        "- training top-50 reverse KL: "
        + (f"{kl_train[0]:.3f} (step 1) -> {kl_train[1]:.3f}" if kl_train else "n/a"),
        "",
        "## RL (chunk-level GRPO from the OPD student, extractive reader, "
        f"{max((r['step'] for r in rl), default=0)} steps)",
        f"- {_preflight_line(root / 'rl' / 'reader_preflight.json')}",
        f"- {counts.get('growth_bounds', 'growth penalty: the config bounds')}",
        "- held-out mean growth penalty pen[t]: " + (f"{pen[0]:.3f} -> {pen[1]:.3f}" if pen else "n/a"),
        "- held-out mean per-chunk score s[t]: "
        + (f"{rew[0]:.3f} (step 0) -> {rew[1]:.3f} (last step)" if rew else "n/a"),
        "- held-out mean prm[t]: " + (f"{prm[0]:.3f} -> {prm[1]:.3f}" if prm else "n/a"),
        "- training mean s[t]: "
        + (f"{rew_train[0]:.3f} (step 1) -> {rew_train[1]:.3f}" if rew_train else "n/a"),
        "- share of scored training cells with advantage 0 (no GRPO signal), mean over steps: "
        + (f"{sum(zadv) / len(zadv):.2f}" if zadv else "n/a"),
        "",
        "## Gates (the teacher can do the task; RL starts with signal)",
        *(
            f"- {g['gate']}: "
            + ("n/a" if g["value"] is None else f"{g['value']:.3f}")
            + f" ({'met' if g['met'] else 'NOT met'})"
            for g in gate_rows
        ),
        "",
        "## Predicted differences (paired over held-out sequences, 95% bootstrap interval)",
        "| a - b | bank metric | predicted | difference | held | why predicted |",
        "|---|---|---|---|---|---|",
        *(
            f"| {c['a']} - {c['b']} | {c['metric']} | {c['rule']} | "
            + (f"{c['value']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]" if c["value"] is not None else "n/a")
            + f" | {'yes' if c['held'] else 'no'} | {c['why']} |"
            for c in checks
        ),
        "",
        "## time (s)",
        ", ".join(f"{k} {v:.0f}" for k, v in timings.items()),
        "",
        f"curves: {root}/opd/opd_curves.png, {root}/rl/rl_curves.png, {root}/report.png",
        *gain_decomposition(root / "swap" / "eval" / "bank_metrics.json"),
        *bank_table(root / "swap" / "eval"),
        *swap_table(root / "swap" / "eval"),
    ]
    text = "\n".join(lines) + "\n"
    (root / "report.md").write_text(text)
    result = {
        "kl": kl,
        "reward": rew,
        "prm": prm,
        "pen": pen,
        "timings": timings,
        "checks": checks,
        "gates": gate_rows,
    }
    (root / "report.json").write_text(json.dumps({**result, "counts": counts}, indent=1, default=str))
    _report_png(root, opd, rl)
    print(text)
    return result


def bank_table(out: Path) -> list[str]:
    """The bank metrics per writer (the whole page, with every paired difference: <out>/bank_metrics.md)."""
    md = out / "bank_metrics.md"
    if not md.exists():
        return []
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("|")]
    end = next((i for i, ln in enumerate(rows[2:], 2) if " - " in ln.split("|")[1]), len(rows))
    return [
        "",
        "## Bank metrics (held-out sequences, native harness; 95% CI over sequences)",
        *rows[:end],
        f"paired differences: {md}",
    ]


def swap_table(out: Path) -> list[str]:
    """The writer-swap table's overall rows (the whole table: <out>/table.md)."""
    md = out / "table.md"
    if not md.exists():
        return []
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("|")]
    end = next(
        (i for i, ln in enumerate(rows[2:], 2) if ln.startswith("| A - B") or ln.startswith("| Writer")),
        len(rows),
    )
    return [
        "",
        "## Writer-swap table (held-out sequences, native harness, exact match; x100, 95% CI)",
        *rows[:end],
        f"full table, differences and categories: {md}",
    ]


def _report_png(root: Path, opd: list[dict], rl: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (opd, "eval/reverse_kl", "OPD: held-out reverse KL"),
        (opd, "distill/reverse_kl_topk", "OPD: train KL (top-50)"),
        (rl, "eval/s", "RL: held-out mean s[t]"),
        (rl, "reward/s", "RL: train mean s[t]"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for ax, (rows, key, title) in zip(axes.flat, panels, strict=True):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(root / "report.png", dpi=90)
    plt.close(fig)
