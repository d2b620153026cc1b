"""The embedded-default pipeline `make demo` runs on 2 CPU cores (issue: the two stages end to end).

Demo code, not part of the hymem_train package: each stage runs as its real entry point
(`python -m hymem_train.sft / .opd / .rl`) in a subprocess; this module orchestrates and reports.

synthetic data (train + held-out) -> oracle demonstrations through the real native harness ->
SFT of the tiny teacher (writer + reader tasks) -> OPD of a smaller student from the teacher ->
RL of the student (reader = the frozen teacher, exact-match judge on atomic synthetic answers) ->
the writer-swap table (SFT, OPD and RL students writing the held-out sequences, python -m hymem_train.evaluate) ->
a report (text + PNG) with held-out numbers.

The oracle writes the gold operations of each synthetic chunk through the same harness, gateway and
chat template the policy later uses, so the teacher learns the exact prompt format; gold facts only
reach the oracle (a demonstrator), never a bank the policy reads during training or evaluation.
What the demo runs measured behind its settings: docs/findings.md, "Demo pipeline".
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)


def build_data(
    root: Path, *, num_sequences: int, num_chunks: int, window: int, seed: int, unique_names: bool = True
) -> Path:
    from data_pipeline.build import build, load_config

    cfg = load_config([
        f"out_dir={root}", "data.name=demo", f"data.synthetic.num_sequences={num_sequences}",
        f"data.synthetic.unique_person_names={str(unique_names).lower()}",
        f"data.synthetic.num_chunks_per_sequence={num_chunks}", f"data.synthetic.num_chunks_per_window={window}",
        f"data.synthetic.seed={seed}", "~data.profiles.hy_memory",
        f"+data.profiles.native={{mode: session, max_tokens: 0, num_chunks_per_window: {window}, tokenizer_path: ''}}",
    ])  # fmt: skip
    outs, _ = build(cfg)
    return outs["native"]


class Oracle:
    """Gold native-harness operations for a synthetic chunk, from the dataset's facts (demonstrator).

    The shipped demo (`make demo`, `oracle_sft_data`) uses it to write the teacher's SFT
    demonstrations. It reads the native harness's prompt with regexes, so it only fits that prompt.
    """

    def __init__(self, ds):
        turn_text = {(c.sequence_id, t.turn_id): t.text for c in ds.tables["chunks"] for t in c.turns}
        # keyed by (sequence, turn text): sequences reuse first-person sentences ("I play volleyball")
        self.by_turn: dict[tuple[str, str], object] = {}
        self.fact_text = {f.fact_id: f.text for f in ds.tables["facts"]}
        for f in ds.tables["facts"]:
            for tid in f.turn_ids:
                self.by_turn[(f.sequence_id, turn_text[(f.sequence_id, tid)])] = f
        self.sequence_id = ""  # the sequence being demonstrated (windows are written one at a time)

    def __call__(self, prompt: str) -> str:
        new = prompt.split("New conversation:")[-1]
        existing = dict(re.findall(r"^\[(\d+)\] (.+)$", prompt.split("New conversation:")[0], re.M))
        ops = []
        for line in new.splitlines():
            m = re.match(r"^user: [^:]+: (.+)$", line.strip())
            f = self.by_turn.get((self.sequence_id, m.group(1))) if m else None
            if f is None:
                continue
            old = self.fact_text.get(f.supersedes) if f.supersedes else None
            ids = [i for i, t in existing.items() if t == old] if old else []
            ops.append(
                {"op": "UPDATE", "id": int(ids[0]), "text": f.text} if ids else {"op": "ADD", "text": f.text}
            )
        return json.dumps({"ops": ops or [{"op": "NONE"}]})


def oracle_sft_data(ds_path: Path, out: Path, harness_cfg, search_k: int) -> dict[str, int]:
    """Writer segments (oracle through the real harness) + reader examples (probe over the oracle bank)."""
    from data_pipeline.store import BuiltDataset
    from harnesses.native import NativeHarness
    from hymem_train.engines.scripted import ScriptedEngine
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway, GatewayConfig
    from hymem_train.models.tokenizer import default_tokenizer
    from hymem_train.rollout.worker import RolloutTask, RolloutWorker
    from reward.judge import reader_messages

    ds = BuiltDataset(ds_path)
    tok = default_tokenizer()
    oracle = Oracle(ds)
    gw = Gateway(ScriptedEngine(tok, oracle), tok, GatewayConfig(embeddings=False))
    rows: list[dict] = []
    n_writer = n_reader = 0
    with GatewayServer(gw) as srv:
        worker = RolloutWorker({"native": harness_cfg}, srv.url, gw.admin_token)
        parents: dict[str, str] = {}
        for w in sorted(ds.windows, key=lambda w: (w.sequence_id, w.index)):
            task = RolloutTask(w, ds.chunks_of(w), 0, "native", parents.get(w.sequence_id),
                               str(out.parent / "oracle" / w.window_id.replace("/", "_")))  # fmt: skip
            oracle.sequence_id = w.sequence_id
            res = worker.run(task)
            parents[w.sequence_id] = res.record.final_bank_dir
            for s in res.segments:
                rows.append({"prompt_ids": s.prompt_ids, "response_ids": s.response_ids})
                n_writer += 1
            snaps = {c.chunk_index: c.bank_dir for c in res.record.chunks}
            h = NativeHarness(None, harness_cfg.native)
            for p in ds.probes_of(w):
                h.open(snaps[p.chunk_index])
                entries = h.search(p.question, search_k)
                h.close()
                msgs = reader_messages(p.question, entries)
                prompt = tok.apply_chat_template(
                    msgs, add_generation_prompt=True, tokenize=True, return_dict=False
                )
                rows.append(
                    {"prompt_ids": list(prompt), "response_ids": tok.encode(p.reference) + [tok.eos_token_id]}
                )
                n_reader += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"writer_segments": n_writer, "reader_examples": n_reader}


def pretraining_data(out: Path, num_documents: int, seed: int) -> int:
    """The pretraining stand-in corpus (data_pipeline.synthetic.pretraining_documents) as SFT
    `text_ids` records: plain language modelling, loss on every token. Returns the token count."""
    from data_pipeline.synthetic import pretraining_documents
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w") as f:
        for doc in pretraining_documents(num_documents, seed):
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


def _run(args: list[str], log_path: Path) -> None:
    import subprocess
    import sys

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as f:
        r = subprocess.run([sys.executable, *args], stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise RuntimeError(f"`python {' '.join(args)}` failed (exit {r.returncode}); see {log_path}:\n{tail}")


def run_demo(
    root: str | Path = "runs/demo",
    *,
    num_train_sequences: int = 96,
    num_prompt_sequences: int = 96,
    num_eval_sequences: int = 24,
    pretrain_documents: int = 8000,
    teacher_epochs: int = 3,
    student_epochs: int = 1,
    student_pretrain_steps: int = 300,
    extra: dict[str, list[str]] | None = None,
) -> dict:
    """The whole tiny pipeline; each stage is the real entry point in its own process."""
    import time

    from harnesses.registry import HarnessConfig

    extra = extra or {}
    root = Path(root)
    t0 = time.perf_counter()
    timings = {}
    print(f"[1/7] synthetic data -> {root}/data", flush=True)
    # many sequences, few epochs, names recurring across sequences: so the writer has to copy values
    # from the chunk instead of memorising them (docs/findings.md, "Demo pipeline")
    train = build_data(
        root / "data" / "train",
        num_sequences=num_train_sequences,
        num_chunks=6,
        window=3,
        seed=0,
        unique_names=False,
    )
    # OPD and RL prompts: fresh sequences the SFT demonstrations never showed, so the updates reward
    # copying from the chunk, not recall of memorised gold (docs/findings.md, "Demo pipeline")
    prompts = build_data(
        root / "data" / "prompts",
        num_sequences=num_prompt_sequences,
        num_chunks=6,
        window=3,
        seed=2000,
        unique_names=False,
    )
    # 24 held-out sequences: fewer let evaluation noise reach the size of the effect the demo looks
    # for (docs/findings.md, "Demo pipeline")
    held = build_data(
        root / "data" / "eval", num_sequences=num_eval_sequences, num_chunks=3, window=3, seed=1000
    )
    timings["data"] = time.perf_counter() - t0

    print("[2/7] oracle demonstrations through the native harness -> SFT data", flush=True)
    t = time.perf_counter()
    hcfg = HarnessConfig(framework="native", in_process=True)
    hcfg.native.max_tokens, hcfg.native.num_context_memories = 80, 4
    counts = oracle_sft_data(train, root / "sft" / "data.jsonl", hcfg, search_k=5)
    print(f"      {counts['writer_segments']} writer segments, {counts['reader_examples']} reader examples")
    counts["pretrain_tokens"] = pretraining_data(root / "pretrain" / "data.jsonl", pretrain_documents, seed=0)
    counts["pretrain_documents"] = pretrain_documents
    timings["oracle"] = time.perf_counter() - t

    # One epoch of short copy episodes stands in for the report's pretrained LLMs; the student gets
    # fewer steps (time budget). ZeRO off on the one CPU rank. Why: docs/findings.md, "Demo pipeline".
    print("[3/7] pretraining stand-in: teacher and student (python -m hymem_train.sft, plain LM)", flush=True)
    t = time.perf_counter()
    for name, model, steps in (
        ("teacher", "tiny_teacher", 0),
        ("student", "tiny_student", student_pretrain_steps),
    ):
        _run(["-m", "hymem_train.sft", f"model={model}", f"data_path={root}/pretrain/data.jsonl",
              f"out_dir={root}/pretrain_{name}", "num_epochs=1", "num_segments_per_step=16", "trainer.lr=2e-3",
              f"max_steps={steps}", "trainer.gradient_checkpointing=false", "trainer.zero_stage=0",
              *extra.get(f"pretrain_{name}", [])],
             root / "logs" / f"pretrain_{name}.log")  # fmt: skip
    timings["pretrain"] = time.perf_counter() - t

    print(
        "[4/7] SFT: the tiny teacher, and a short one for the student (python -m hymem_train.sft)", flush=True
    )
    t = time.perf_counter()
    # teacher: 4 layers, trained on the demonstrations (writer + reader tasks)
    _run(["-m", "hymem_train.sft", f"model.path={root}/pretrain_teacher/final", f"data_path={root}/sft/data.jsonl",
          f"out_dir={root}/sft", f"num_epochs={teacher_epochs}", "num_segments_per_step=16", "trainer.lr=2e-3",
          "trainer.gradient_checkpointing=false", "trainer.zero_stage=0",
          *extra.get("sft", [])], root / "logs" / "sft_teacher.log")  # fmt: skip
    # student: 3 layers, one epoch only: OPD does the rest (after 2 epochs OPD only added noise;
    # docs/findings.md, "Demo pipeline")
    _run(["-m", "hymem_train.sft", "model=tiny_student", f"model.path={root}/pretrain_student/final",
          f"data_path={root}/sft/data.jsonl", f"out_dir={root}/student_init", f"num_epochs={student_epochs}",
          "num_segments_per_step=16", "trainer.lr=2e-3",
          "trainer.gradient_checkpointing=false", "trainer.zero_stage=0", *extra.get("student", [])],
         root / "logs" / "sft_student.log")  # fmt: skip
    timings["sft"] = time.perf_counter() - t

    common = [f"data.path={prompts}", f"data.eval_path={held}"]
    print("[5/7] OPD: student <- teacher (python -m hymem_train.opd +exp=demo_opd)", flush=True)
    t = time.perf_counter()
    _run(["-m", "hymem_train.opd", "+exp=demo_opd", *common, f"teacher.path={root}/sft/final",
          f"init_checkpoint={root}/student_init/final", f"run.output_dir={root}/opd", *extra.get("opd", [])],
         root / "logs" / "opd.log")  # fmt: skip
    timings["opd"] = time.perf_counter() - t

    # The growth penalty's bounds from the OPD student's own writes, as docs/reward.md prescribes for
    # every harness (the configs' floor never bites on the demo's small banks: docs/findings.md)
    growth, counts["growth_bounds"] = growth_overrides(root / "opd")
    print(f"      {counts['growth_bounds']}", flush=True)
    print("[6/7] RL: chunk-level GRPO (python -m hymem_train.rl +exp=demo_rl)", flush=True)
    t = time.perf_counter()
    _run(["-m", "hymem_train.rl", "+exp=demo_rl", *common, f"init_checkpoint={root}/opd/final",
          f"reader_model.path={root}/sft/final", f"run.output_dir={root}/rl", *growth, *extra.get("rl", [])],
         root / "logs" / "rl.log")  # fmt: skip
    timings["rl"] = time.perf_counter() - t

    print("[7/7] writer-swap table: SFT, OPD and RL students as writers (python -m hymem_train.evaluate "
          "+exp=evaluate_demo)", flush=True)  # fmt: skip
    t = time.perf_counter()
    writers = ", ".join(f"{{name: {n}, checkpoint: '{root}/{d}/final'}}" for n, d in
                        (("sft", "student_init"), ("opd", "opd"), ("rl", "rl")))  # fmt: skip
    _run(["-m", "hymem_train.evaluate", "+exp=evaluate_demo", f"writers=[{writers}]", f"data.path={held}",
          f"reader_model.path={root}/sft/final", f"run.output_dir={root}/swap", *extra.get("eval", [])],
         root / "logs" / "evaluate.log")  # fmt: skip
    timings["evaluate"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    counts["train_sequences"], counts["eval_sequences"] = num_train_sequences, num_eval_sequences
    counts["prompt_sequences"] = num_prompt_sequences
    return write_report(root, counts, timings)


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


def write_report(root: Path, counts: dict, timings: dict) -> dict:
    opd, rl = history(root / "opd"), history(root / "rl")
    kl = first_last(opd, "eval/reverse_kl")
    kl_train = first_last(opd, "distill/reverse_kl_topk")
    rew = first_last(rl, "eval/s")
    prm = first_last(rl, "eval/prm")
    rew_train = first_last(rl, "reward/s")
    pen = first_last(rl, "eval/pen")
    zadv = [r["reward/zero_advantage_share"] for r in rl if "reward/zero_advantage_share" in r]
    lines = [
        "# hymem-train CPU demo report",
        "",
        f"data: {counts['train_sequences']} SFT sequences x 6 chunks (windows of 3), "
        f"{counts.get('prompt_sequences', 0)} OPD/RL prompt sequences (not in SFT), {counts['eval_sequences']} held-out sequences; "
        f"{counts['writer_segments']} oracle writer segments + {counts['reader_examples']} reader examples for SFT; "
        f"pretraining stand-in: {counts.get('pretrain_documents', 0)} copy-episode documents, {counts.get('pretrain_tokens', 0)} tokens",
        "",
        "## OPD (student: 3 layers, hidden 96 <- teacher: 4 layers, hidden 128)",
        "- held-out reverse KL(student || teacher), full vocab, at the student's sampled positions: "
        + (f"{kl[0]:.3f} (step 0) -> {kl[1]:.3f} (last step)" if kl else "n/a"),
        "- training top-50 reverse KL: "
        + (f"{kl_train[0]:.3f} (step 1) -> {kl_train[1]:.3f}" if kl_train else "n/a"),
        "",
        "## RL (chunk-level GRPO from the OPD student)",
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
        "## time (s)",
        ", ".join(f"{k} {v:.0f}" for k, v in timings.items()),
        "",
        f"curves: {root}/opd/opd_curves.png, {root}/rl/rl_curves.png, {root}/report.png",
        *swap_table(root / "swap" / "eval"),
    ]
    text = "\n".join(lines) + "\n"
    (root / "report.md").write_text(text)
    _report_png(root, opd, rl)
    print(text)
    return {"kl": kl, "reward": rew, "prm": prm, "pen": pen, "timings": timings}


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

    panels = [(opd, "eval/reverse_kl", "OPD: held-out reverse KL"), (opd, "distill/reverse_kl_topk", "OPD: train KL (top-50)"),
              (rl, "eval/s", "RL: held-out mean s[t]"), (rl, "reward/s", "RL: train mean s[t]")]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for ax, (rows, key, title) in zip(axes.flat, panels, strict=True):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(root / "report.png", dpi=90)
    plt.close(fig)
