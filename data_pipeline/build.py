"""Build reward / evaluation data: `python -m data_pipeline.build [data=NAME] [key=value ...]` (issue 4 item 8).

    python -m data_pipeline.build                                   # synthetic demo data (no LLM)
    python -m data_pipeline.build data=locomo_sample                # shared LoCoMo + LongMemEval slices
    python -m data_pipeline.build data=locomo_sample data.annotate=true \
        annotator.base_url=http://HOST:8000/v1 annotator.model=annotator   # + PRM / ORM passes
    python -m data_pipeline.build --cfg [overrides]                 # print the resolved config, exit

The steps read like the pipeline: load sources -> per harness configuration (chunking profile):
chunk -> windows -> attribute evidence -> annotate (or take synthetic gold) -> fixed 20% eval
subsample -> statistics -> (judge validation) -> write `<out_dir>/<profile>/` atomically.

Judge validation scores answers with the reward package's judge, a layer above this one
(docs/architecture.md), so the build does not import it: a caller passes it in as `judge_validator`.
`python -m reward.judge_validation [same overrides]` is this entry point with the judge passed in;
`python -m data_pipeline.build judge_validation.enabled=true` refuses and names that command.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from data_pipeline.annotate import AnnotatorConfig, annotate
from data_pipeline.chunking import (
    ChunkingConfig,
    attribute_eval_items,
    attribute_seed_facts,
    build_windows,
    chunk_sequence,
    load_tokenizer,
    select_subsample,
)
from data_pipeline.loaders import LoadResult, load_source
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    EvalItem,
    Fact,
    Manifest,
    OrmQuestion,
    Probe,
    ProbeKind,
    chunk_id,
)
from data_pipeline.stats import Stats, compute, format_table
from data_pipeline.stats import to_json as stats_json
from data_pipeline.store import atomic_write_text, write_dataset
from data_pipeline.synthetic import SyntheticConfig, SyntheticData, generate
from data_pipeline.typed_config import ConfigError, RunConfig, compose, to_typed, to_yaml

log = logging.getLogger(__name__)
SOURCE_KINDS = ("locomo", "longmemeval", "jsonl", "synthetic")
JUDGED_BUILD_COMMAND = "python -m reward.judge_validation"  # the build with the reward judge passed in


@dataclass
class JudgeValidationConfig:
    """Judge validation (report section 1; reward/judge_validation.py runs it)."""

    enabled: bool = False  # run judge validation as part of the build
    base_url: str = ""  # judge's OpenAI-compatible endpoint (required when enabled)
    model: str = ""  # judge model name (required when enabled)
    api_key: str = "EMPTY"  # bearer token for the endpoint
    num_items: int = 50  # items sampled (probes + ORM questions, traps excluded)
    seed: int = 0  # item sample and distractor choice
    full_threshold: float = 0.75  # score >= this counts as full credit
    zero_threshold: float = 0.25  # score <= this counts as zero credit; in between = partial
    max_concurrency: int = 16  # judge requests in flight


# (probes, ORM questions, facts, config) of one profile -> extra files for its dataset directory
JudgeValidator = Callable[[list[Probe], list[OrmQuestion], list[Fact], JudgeValidationConfig], dict[str, str]]


@dataclass
class SourceConfig:
    kind: str  # "locomo" | "longmemeval" | "jsonl" | "synthetic"
    path: str = ""  # input file in the source's original layout ("" for synthetic)
    name: str = ""  # benchmark name / sequence-id prefix ("" = the loader's default)


@dataclass
class DataConfig:
    name: str  # dataset name (manifest, default output folder)
    sources: list[SourceConfig]  # inputs, in order
    profiles: dict[str, ChunkingConfig]  # harness configuration -> chunking; one dataset dir each
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)  # used by kind=synthetic sources
    annotate: bool = False  # run the PRM / ORM annotation passes on benchmark sources
    use_seed_facts: bool = True  # without annotation: source-given facts (LoCoMo observation) as Fact rows
    adversarial_traps: bool = True  # LoCoMo category-5 items without an answer -> trap probes (natural traps)
    eval_fraction: float = 0.2  # the fixed evaluation subsample (report: 20%), per benchmark
    eval_seed: int = 0  # seed of that subsample (recorded in the manifest)


@dataclass
class DataBuildConfig:
    data: DataConfig  # what to build
    out_dir: str  # output root: <out_dir>/<profile>/ per harness configuration
    annotator: AnnotatorConfig = field(default_factory=AnnotatorConfig)  # annotator endpoint (data.annotate)
    judge_validation: JudgeValidationConfig = field(default_factory=JudgeValidationConfig)  # item 5
    run: RunConfig = field(default_factory=RunConfig)  # run name (experiments set it; `+exp=NAME`)

    def validate(self) -> None:
        for i, s in enumerate(self.data.sources):
            if s.kind not in SOURCE_KINDS:
                raise ConfigError(f"data.sources[{i}].kind={s.kind!r} not in {SOURCE_KINDS}")
            if s.kind != "synthetic" and not s.path:
                raise ConfigError(f"data.sources[{i}].path is required for kind {s.kind!r}")
        if not self.data.profiles:
            raise ConfigError("data.profiles: at least one harness configuration is required")
        for name, p in self.data.profiles.items():
            try:
                p.validate()
            except ValueError as e:
                raise ConfigError(f"data.profiles.{name}: {e}") from None
            if any(s.kind == "synthetic" for s in self.data.sources) and (
                p.mode != "session" or p.num_chunks_per_window != self.data.synthetic.num_chunks_per_window
            ):
                # synthetic gold is attributed to session chunks and windows by construction
                raise ConfigError(
                    f"data.profiles.{name}: synthetic sources need mode=session and num_chunks_per_window="
                    f"data.synthetic.num_chunks_per_window ({self.data.synthetic.num_chunks_per_window})"
                )
        if self.data.annotate and (not self.annotator.base_url or not self.annotator.model):
            raise ConfigError("annotator.base_url and annotator.model are required when data.annotate=true")
        if self.judge_validation.enabled and (
            not self.judge_validation.base_url or not self.judge_validation.model
        ):
            raise ConfigError(
                "judge_validation.base_url and judge_validation.model are required when enabled"
            )
        if not 0.0 < self.data.eval_fraction <= 1.0:
            raise ConfigError(f"data.eval_fraction={self.data.eval_fraction} not in (0, 1]")


def load_sources(cfg: DataConfig) -> tuple[LoadResult, SyntheticData | None]:
    loaded = LoadResult()
    synth = None
    for s in cfg.sources:
        if s.kind == "synthetic":
            synth = generate(cfg.synthetic)
        else:
            loaded.extend(load_source(s.kind, s.path, s.name or None))
    return loaded, synth


def eval_subsample(items, fraction: float, seed: int) -> dict:
    by_bench: dict[str, list[str]] = {}
    for it in items:
        by_bench.setdefault(it.benchmark, []).append(it.item_id)
    return {
        "unit": "eval_item",
        "fraction": fraction,
        "seed": seed,
        "ids": {b: select_subsample(ids, fraction, seed) for b, ids in sorted(by_bench.items())},
    }


def adversarial_trap_probes(items: list[EvalItem]) -> list[Probe]:
    """LoCoMo category 5 (adversarial) items as natural trap probes of the chunk holding their bait.

    They ask about something the conversation never states (often a fact of the other speaker); a
    bank that stored a mis-attributed fact answers with the baited `adversarial_answer`. Items that
    carry a real `answer` (e.g. "No") are not traps and are skipped; so are items without evidence.
    """
    out = []
    for it in items:
        if not (it.is_trap and it.benchmark.startswith("locomo") and not it.answer and it.evidence_chunks):
            continue
        chunk = max(it.evidence_chunks)  # the trap applies once every baiting turn has been written
        rubric = (
            f"The conversation never states this. Full credit only if the answer says there is no such "
            f"record; 0 if it answers {it.adversarial_answer!r} or anything else as if it were stated."
        )
        k = int(it.item_id.rsplit("/q", 1)[1])
        out.append(
            Probe(f"{chunk_id(it.sequence_id, chunk)}/adv{k:03d}", it.sequence_id, chunk,
                  ProbeKind.SEMANTIC_PRECISION, it.question, NO_SUCH_RECORD, rubric, True)
        )  # fmt: skip
    return out


def build_profile(
    cfg: DataBuildConfig,
    profile: str,
    chunking: ChunkingConfig,
    loaded: LoadResult,
    synth: SyntheticData | None,
    judge_validator: JudgeValidator | None = None,
) -> tuple[Path, Stats]:
    out = Path(cfg.out_dir) / profile
    tok = load_tokenizer(chunking.tokenizer_path)
    chunks = [c for seq in loaded.sequences for c in chunk_sequence(seq, chunking, tok)]
    windows = build_windows(chunks, chunking.num_chunks_per_window)
    eval_items = copy.deepcopy(loaded.eval_items)  # evidence_chunks differ per profile
    attribute_eval_items(eval_items, chunks)
    facts, probes, questions, failures = [], [], [], []
    if cfg.data.annotate and chunks:
        cache = Path(cfg.annotator.cache_dir or Path(cfg.out_dir) / ".annotation_cache") / profile
        res = annotate(chunks, windows, cfg.annotator, cache)
        facts, probes, questions, failures = res.facts, res.probes, res.orm_questions, res.failures
    elif cfg.data.use_seed_facts:
        facts = attribute_seed_facts(loaded.seed_facts, chunks)
    if cfg.data.adversarial_traps:
        probes += adversarial_trap_probes(eval_items)
    sequences = list(loaded.sequences)
    if synth is not None:
        sequences += synth.sequences
        chunks += synth.chunks
        windows += synth.windows
        facts += synth.facts
        probes += synth.probes
        questions += synth.orm_questions
        eval_items += synth.eval_items
    stats = compute(profile, sequences, chunks, windows, facts, probes, questions, eval_items)
    extra = {
        "stats.json": stats_json([stats]),
        "stats.md": format_table([stats]) + "\n",
        "evidence_issues.jsonl": "".join(json.dumps(i.to_dict()) + "\n" for i in loaded.issues),
        "annotation_failures.jsonl": "".join(json.dumps(f.__dict__) + "\n" for f in failures),
    }
    if cfg.judge_validation.enabled:
        assert judge_validator is not None  # build() refuses before any work otherwise
        extra.update(judge_validator(probes, questions, facts, cfg.judge_validation))
    sources = [s.name or s.kind for s in cfg.data.sources]
    manifest = Manifest(
        name=f"{cfg.data.name}/{profile}",
        sources=sources,
        # exact-match scoring is only sound when every answer is one span by construction
        answers_atomic=all(s.kind == "synthetic" for s in cfg.data.sources),
        eval_subsample=eval_subsample(eval_items, cfg.data.eval_fraction, cfg.data.eval_seed),
        config={
            "profile": profile,
            "chunking": _plain(chunking),
            "data": _plain(cfg.data),
            # provenance of the annotations (never the api key)
            "annotator": {"model": cfg.annotator.model, "base_url": cfg.annotator.base_url}
            if cfg.data.annotate
            else {},
        },
    )
    tables = {
        "sequences": sequences,
        "chunks": chunks,
        "windows": windows,
        "facts": facts,
        "probes": probes,
        "orm_questions": questions,
        "eval_items": eval_items,
    }
    return write_dataset(out, tables, manifest, extra), stats


def _plain(obj) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(obj))  # type: ignore[return-value]


def build(
    cfg: DataBuildConfig, judge_validator: JudgeValidator | None = None
) -> tuple[dict[str, Path], list[Stats]]:
    """Build every profile's dataset. `judge_validator` is required when judge_validation.enabled."""
    if cfg.judge_validation.enabled and judge_validator is None:
        raise ConfigError(
            "judge_validation.enabled=true needs the reward judge, which the data build does not import: "
            f"run `{JUDGED_BUILD_COMMAND}` with the same overrides"
        )
    loaded, synth = load_sources(cfg.data)
    if loaded.issues:
        log.warning("%d evidence issue(s) reported (see evidence_issues.jsonl)", len(loaded.issues))
    outs, rows = {}, []
    for profile, chunking in cfg.data.profiles.items():
        outs[profile], st = build_profile(cfg, profile, chunking, loaded, synth, judge_validator)
        rows.append(st)
    atomic_write_text(Path(cfg.out_dir) / "stats.md", format_table(rows) + "\n")
    atomic_write_text(Path(cfg.out_dir) / "stats.json", stats_json(rows))
    return outs, rows


def load_config(overrides: list[str]) -> DataBuildConfig:
    return to_typed(compose("data_build", overrides), DataBuildConfig)


def main(argv: list[str] | None = None, judge_validator: JudgeValidator | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    show = "--cfg" in args
    cfg = load_config([a for a in args if a != "--cfg"])
    if show:
        print(to_yaml(cfg))
        return 0
    outs, rows = build(cfg, judge_validator)
    print(format_table(rows))
    for profile, path in outs.items():
        print(f"{profile}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
