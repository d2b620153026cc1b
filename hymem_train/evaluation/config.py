"""Config of `python -m hymem_train.evaluate` (the report's writer-only swap matrix; docs/evaluation.md).
No torch, Ray or HTTP import here, so composing and validating a run stays light."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from data_pipeline.source_gold import FRAMEWORKS
from harnesses.registry import HarnessConfig
from reward.config import LlmClientConfig

JUDGE_MODES = ("protocol", "token_f1")
# "model": a checkpoint or an endpoint; the bound rows: "empty" (store nothing) and "gold" (the gold bank)
WRITER_KINDS = ("model", "empty", "gold")
_NAME = re.compile(r"[A-Za-z0-9][\w.+-]*")


@dataclass
class WriterConfig:
    """One writer (a row of the table): a local checkpoint served in frozen mode behind a gateway of this
    run, or any OpenAI-compatible endpoint. Only the harnesses' write-path calls go to it. Two bound rows
    need neither: `kind: empty` (store nothing: the bank is created and nothing is written) and `kind: gold`
    (the gold bank: data_pipeline/ledger_oracle.py's gold ops, served like a checkpoint, written through
    the native harness's own write path; ledger data only)."""

    name: str = "???"  # display name (table row, cache directory)
    kind: str = "model"  # one of WRITER_KINDS
    # an HF directory (<run>/final, an export) or a DeepSpeed step checkpoint (<run>/checkpoints/step_N)
    checkpoint: str = ""
    preset: str = ""  # architecture of a step checkpoint whose run has no config.yaml ("" = the model config)
    base_url: str = (
        ""  # or an endpoint, e.g. http://host:8000/v1 of `vllm serve ... --served-model-name hy-memory`
    )
    model: str = "hy-memory"  # the model name requests carry (endpoint writers)
    api_key: str = "EMPTY"
    # a write call slower than this ends the bank build as the writer's failure (its items score 0)
    timeout_s: float = 600.0

    def validate(self) -> None:
        if not _NAME.fullmatch(self.name or ""):
            raise ValueError(f"writers: name {self.name!r} must be a plain name (letters, digits, . _ + -)")
        if self.timeout_s <= 0:
            raise ValueError(f"writer {self.name}: timeout_s must be > 0")
        if self.kind not in WRITER_KINDS:
            raise ValueError(f"writer {self.name}: kind={self.kind!r}, want one of {WRITER_KINDS}")
        if self.kind != "model":
            if self.checkpoint or self.base_url:
                raise ValueError(
                    f"writer {self.name}: kind={self.kind} takes neither checkpoint= nor base_url="
                )
        elif bool(self.checkpoint) == bool(self.base_url):
            raise ValueError(f"writer {self.name}: set exactly one of checkpoint= and base_url=")


@dataclass
class EvalData:
    """The evaluation data: built datasets (python -m data_pipeline.build). `path` serves every harness;
    `per_harness` gives a harness its own chunking profile. Their manifests hold the fixed subsample."""

    path: str = ""
    per_harness: dict[str, str] = field(default_factory=dict)

    def of(self, harness: str) -> str:
        return self.per_harness.get(harness, self.path)

    def validate(self, harnesses: list[str]) -> None:
        missing = [h for h in harnesses if not self.of(h)]
        if missing:
            raise ValueError(
                f"data: no dataset for harness(es) {missing} (data.path or data.per_harness.<h>)"
            )


@dataclass
class EvalFaults:
    """Fault injection for the failure accounting's tests: SIGKILL the sandbox of every write attempt of
    these bank builds, given as "<harness>:<sequence_id>" (the build then fails after its retries)."""

    kill_sandbox: list[str] = field(default_factory=list)


@dataclass
class EvalProtocol:
    """The fixed side of the matrix (report: only the writer changes)."""

    reader: LlmClientConfig = field(
        default_factory=lambda: LlmClientConfig(base_url="", model="reader", max_tokens=64)
    )
    judge: LlmClientConfig = field(
        default_factory=lambda: LlmClientConfig(base_url="", model="judge", max_tokens=128, json_mode=True)
    )
    # "protocol": each benchmark's published scorer (LLM judges for LoCoMo / LongMemEval); "token_f1":
    # LoCoMo's own token-F1 for the judged benchmarks, for boxes without a judge model (marked in the table)
    judge_mode: str = "protocol"
    # where the harnesses' own search-time LLM calls go: "reader" (the fixed reader endpoint) or "none"
    search_llm: str = "reader"
    search_k: int = 10  # memories retrieved per question through the harness's own search
    # the reader's answer budget is each benchmark's published one (reward/eval_protocol.py); a small reader
    # whose context cannot hold it sets a cap (marked in the table header; cut answers are counted).
    # reader.max_tokens is the reader self-checks' budget only
    reader_budget_cap: int = 0  # 0 = no cap

    def budget(self, metric: Any) -> int:
        """The reader's max_tokens for a benchmark: its published budget, capped when a cap is set."""
        b = metric.reader_max_tokens
        return min(b, self.reader_budget_cap) if self.reader_budget_cap else b

    def validate(self) -> None:
        if self.judge_mode not in JUDGE_MODES:
            raise ValueError(f"protocol.judge_mode={self.judge_mode!r}: want one of {JUDGE_MODES}")
        if self.search_llm not in ("reader", "none"):
            raise ValueError(f"protocol.search_llm={self.search_llm!r}: want 'reader' or 'none'")
        if self.search_k < 1:
            raise ValueError("protocol.search_k must be >= 1")
        if self.reader_budget_cap < 0:
            raise ValueError(
                "protocol.reader_budget_cap must be >= 0 (0 = each benchmark's published budget)"
            )
        self.reader.validate(), self.judge.validate()


@dataclass
class MatrixConfig:
    writers: list[WriterConfig] = field(default_factory=list)
    harnesses: dict[str, HarnessConfig] = field(default_factory=dict)  # held-out frameworks allowed here
    data: EvalData = field(default_factory=EvalData)
    # benchmarks (EvalItem.benchmark values) to score; [] = every benchmark of the data with a protocol
    benchmarks: list[str] = field(default_factory=list)
    protocol: EvalProtocol = field(default_factory=EvalProtocol)
    subsample: str = "fixed"  # "fixed": the build's seeded subsample (report: 20%); "all": every item
    max_items_per_benchmark: int = 0  # > 0: the first N items of the subsample (in-stage and quick runs)
    build_retries: int = 1  # re-builds (from empty) of a bank whose build hit a platform failure
    bootstrap_resamples: int = 1000  # 95% intervals on every cell and on writer differences
    seed: int = 0  # bootstrap seed
    parallel_builds: int = 1  # bank builds in flight at once (the writer's engine batches their calls)
    # "protocol": the writer decodes as each framework ships (EVAL_DECODING), whatever sampling the harness
    # config carries for training; "as_configured": the harness config's own sampling, kept as declared
    writer_decoding: str = "protocol"
    faults: EvalFaults = field(default_factory=EvalFaults)

    def validate(self) -> None:
        if not self.writers:
            raise ValueError("writers: name at least one writer (checkpoint= or base_url=)")
        for w in self.writers:
            w.validate()
        names = [w.name for w in self.writers]
        if len(set(names)) != len(names):
            raise ValueError(f"writers: names must be distinct, got {names}")
        if not self.harnesses:
            raise ValueError("harnesses: declare at least one harness configuration")
        for h in self.harnesses.values():
            h.validate()
        self.data.validate(list(self.harnesses))
        check_gold_harnesses(self.writers, self.harnesses)
        self.protocol.validate()
        if self.subsample not in ("fixed", "all"):
            raise ValueError(f"subsample={self.subsample!r}: want 'fixed' or 'all'")
        if self.writer_decoding not in ("protocol", "as_configured"):
            raise ValueError(f"writer_decoding={self.writer_decoding!r}: want 'protocol' or 'as_configured'")
        if (
            min(self.max_items_per_benchmark, self.build_retries, self.bootstrap_resamples) < 0
            or self.parallel_builds < 1
        ):
            raise ValueError(
                "max_items_per_benchmark, build_retries, bootstrap_resamples must be >= 0, parallel_builds >= 1"
            )
        check_no_leak(self.writers, self.protocol)


def check_gold_harnesses(writers: list[WriterConfig], harnesses: dict[str, HarnessConfig]) -> None:
    """The gold writer answers the write prompts of the native harness, mem0 and hy-memory's chat scene
    only (data_pipeline/source_gold.py; its data is checked with the plan, once the data is read:
    matrix.check_bound_writers)."""
    gold = [w.name for w in writers if w.kind == "gold"]
    other = {
        h: f"{c.framework}/{c.scene}"
        for h, c in harnesses.items()
        if c.framework not in FRAMEWORKS or (c.framework == "hy_memory" and c.scene != "chat")
    }
    if gold and other:
        raise ValueError(
            f"writer(s) {gold}: kind=gold replies to the write prompts of {FRAMEWORKS} (hy_memory: the chat "
            f"scene), but harness(es) {other} are not among them; drop them or the gold writer"
        )


def check_no_leak(writers: list[WriterConfig], protocol: EvalProtocol) -> None:
    """Refuse a run where a writer endpoint is also a fixed role (report: only the writer changes)."""
    fixed = {"reader": protocol.reader, "judge": protocol.judge}
    for w in writers:
        if not w.base_url:
            continue
        for role, c in fixed.items():
            if c.base_url and c.base_url.rstrip("/") == w.base_url.rstrip("/") and c.model == w.model:
                raise ValueError(
                    f"writer {w.name} ({w.base_url}, model {w.model!r}) is also the {role}: the writer would "
                    f"leak into a fixed role; point protocol.{role} at the fixed model"
                )


# The writer's decoding under the evaluation protocol: each framework's own defaults (training samples at
# 1.0 for on-policy rollouts; the evaluation is the frameworks as shipped). Native: greedy.
EVAL_DECODING: dict[str, dict[str, float]] = {
    "native": {"temperature": 0.0},
    "mem0": {"temperature": 0.1, "top_p": 0.1},  # mem0's BaseLlmConfig defaults
    "hy_memory": {"temperature": 0.1},
    "memoryos": {"temperature": 0.7},
    "everos": {"temperature": 0.0},  # everalgo LLMConfig's default
}


def with_writer_decoding(cfg: MatrixConfig) -> MatrixConfig:
    """`cfg` with its harnesses decoding as `writer_decoding` says (silent failure
    eval-at-training-temperature). The harness configs are the training ones, which sample at 1.0: one
    such sample per chunk makes a table that depends on the order in which concurrent builds drew from the
    engine's generator."""
    if cfg.writer_decoding == "as_configured":
        return cfg
    return dataclasses.replace(cfg, harnesses={n: eval_decoding(h) for n, h in cfg.harnesses.items()})


def writer_sampling(h: HarnessConfig) -> dict[str, float]:
    """The sampling knobs a harness sends with the writer's calls (recorded in a matrix's plan, so a cache
    built under other decoding is not resumed)."""
    if h.framework == "native":
        return {"temperature": h.native.temperature}
    return {k: h.options[k] for k in ("temperature", "top_p") if k in h.options}


def eval_decoding(h: HarnessConfig) -> HarnessConfig:
    """A copy of a training harness config that samples as the evaluation protocol does."""
    knobs = EVAL_DECODING.get(h.framework)
    if knobs is None:
        raise ValueError(f"no evaluation decoding known for framework {h.framework!r} (EVAL_DECODING)")
    if h.framework == "native":
        return dataclasses.replace(h, native=dataclasses.replace(h.native, **knobs))
    return dataclasses.replace(h, options={**h.options, **knobs})


@dataclass
class StageSwapEval:
    """The writer-swap matrix inside a training stage: every `every` steps the current policy (served by
    the stage's own gateway, each bank build under an identity of its own whose segments are dropped)
    builds banks from empty on a small fixed subsample; `swap/<harness>` and `swap/average` are logged,
    the tables go to <run>/swap/step_N/."""

    every: int = 0  # 0 = off
    data: str = ""  # a built dataset ("" = data.eval_path)
    harnesses: list[str] = field(default_factory=list)  # declared harness names ([] = the first)
    benchmarks: list[str] = field(default_factory=list)  # [] = every benchmark of the data with a protocol
    subsample: str = "fixed"
    max_items_per_benchmark: int = 8  # small: it runs inside the training loop
    bootstrap_resamples: int = 200
    # reader base_url "" = the RL stage's reward reader (OPD has none: set protocol.reader.base_url)
    protocol: EvalProtocol = field(default_factory=EvalProtocol)

    def validate(self, declared: list[str], has_reader: bool) -> None:
        if self.every < 0:
            raise ValueError("swap_eval.every must be >= 0 (0 = off)")
        if not self.every:
            return
        unknown = sorted(set(self.harnesses) - set(declared))
        if unknown:
            raise ValueError(
                f"swap_eval.harnesses: {unknown} are not declared harnesses ({sorted(declared)})"
            )
        if not (self.protocol.reader.base_url or has_reader):
            raise ValueError("swap_eval: set swap_eval.protocol.reader.base_url (this stage has no reader)")
        self.protocol.validate()
