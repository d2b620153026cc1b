"""Build reward / evaluation data: `python -m data_pipeline.build [data=NAME] [key=value ...]`.

    python -m data_pipeline.build                                   # synthetic demo data (no LLM)
    python -m data_pipeline.build data=locomo_sample                # shared LoCoMo + LongMemEval slices
    python -m data_pipeline.build data=locomo_sample data.annotate=true \
        annotator.base_url=http://HOST:8000/v1 annotator.model=annotator   # + PRM / ORM passes
    python -m data_pipeline.build --cfg [overrides]                 # print the resolved config, exit
    python -m data_pipeline.build --help                            # config groups, keys, examples
    python -m data_pipeline.build --debug [overrides]               # errors with their traceback

Errors a user can fix (config, input files, annotation below `annotator.min_success_rate`) print as one
line `error: ...` and exit 2; `--debug` (or HYMEM_DEBUG=1) re-raises them with the traceback.

The steps read like the pipeline: load sources -> per harness configuration (chunking profile):
chunk -> windows -> attribute evidence -> annotate (or take synthetic gold) -> fixed 20% eval
subsample -> statistics -> (judge validation) -> staged in `<out_dir>/.staging-<build id>/`; once every
profile is staged, each is renamed into `<out_dir>/<profile>/` under a `BUILD_INCOMPLETE` marker, then
`stats.*` and the top-level `build.json` are written last and the marker removed (store.py says how a
reader recognises an incomplete build).

Judge validation scores answers with the reward package's judge, a layer above this one
(docs/architecture.md), so the build does not import it: a caller passes it in as `judge_validator`.
`python -m reward.judge_validation [same overrides]` is this entry point with the judge passed in;
`python -m data_pipeline.build judge_validation.enabled=true` refuses and names that command.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf

from data_pipeline.annotate import AnnotatorConfig, annotate, failure_reasons
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
from data_pipeline.memoryarena import load_memoryarena_shopping, load_memoryarena_travel
from data_pipeline.personamem import load_personamem_v2
from data_pipeline.schema import (
    NO_SUCH_RECORD,
    EvalItem,
    Fact,
    Manifest,
    OrmQuestion,
    Probe,
    ProbeKind,
    RecordError,
    chunk_id,
)
from data_pipeline.stats import Stats, compute, format_table
from data_pipeline.stats import to_json as stats_json
from data_pipeline.store import (
    BUILD_INCOMPLETE,
    BUILD_MANIFEST,
    atomic_write_text,
    replace_dir,
    shared_mode,
    write_dataset,
)
from data_pipeline.synthetic import SyntheticConfig, SyntheticData, generate
from data_pipeline.typed_config import (
    CONFIG_DIR,
    ConfigError,
    RunConfig,
    compose,
    register_schema,
    to_typed,
    to_yaml,
)

log = logging.getLogger(__name__)
# benchmarks with their own loader module (docs/evaluation_benchmarks.md): kind -> loader(path[, name])
BENCHMARK_LOADERS = {
    "personamem_v2": load_personamem_v2,
    "memoryarena_travel": load_memoryarena_travel,
    "memoryarena_shopping": load_memoryarena_shopping,
}
SOURCE_KINDS = ("locomo", "longmemeval", "jsonl", "synthetic", *BENCHMARK_LOADERS)
JUDGED_BUILD_COMMAND = "python -m reward.judge_validation"  # the build with the reward judge passed in
DEBUG_ENV = "HYMEM_DEBUG"  # =1: errors keep their traceback (like --debug)


class BuildError(ValueError):
    """A build that must not write its output (e.g. annotation success below the configured rate)."""


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
    allow_session_gaps: bool = False  # load a LoCoMo conversation with missing session numbers (warned)
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
        if not 0.0 <= self.annotator.min_success_rate <= 1.0:
            raise ConfigError(f"annotator.min_success_rate={self.annotator.min_success_rate} not in [0, 1]")


register_schema("data_build", DataBuildConfig)


def load_sources(cfg: DataConfig) -> tuple[LoadResult, SyntheticData | None]:
    loaded = LoadResult()
    synth = None
    for i, s in enumerate(cfg.sources):
        if s.kind == "synthetic":
            synth = generate(cfg.synthetic)
            continue
        try:
            if s.kind in BENCHMARK_LOADERS:
                part = BENCHMARK_LOADERS[s.kind](s.path, *([s.name] if s.name else []))
            else:
                part = load_source(s.kind, s.path, s.name or None, allow_session_gaps=cfg.allow_session_gaps)
        except RecordError as e:
            hint = ""
            if str(e).endswith("no such file"):
                hint = f" (set data.sources[{i}].path; the shipped data configs read $HYMEM_DATA, default data/, and $HYMEM_SAMPLE_DATA, default tests/fixtures/sample_data)"
            raise RecordError(f"data.sources[{i}] (kind {s.kind}): {e}{hint}") from None
        if not part.sequences:
            log.warning(
                "data.sources[%d] (kind %s): %s contributed 0 sequences (the file holds no records); "
                "the dataset is built from the other sources only",
                i,
                s.kind,
                s.path,
            )
        loaded.extend(part)
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
            Probe(
                f"{chunk_id(it.sequence_id, chunk)}/adv{k:03d}",
                it.sequence_id,
                chunk,
                ProbeKind.SEMANTIC_PRECISION,
                it.question,
                NO_SUCH_RECORD,
                rubric,
                True,
            )
        )
    return out


def build_profile(
    cfg: DataBuildConfig,
    profile: str,
    chunking: ChunkingConfig,
    loaded: LoadResult,
    synth: SyntheticData | None,
    judge_validator: JudgeValidator | None = None,
    out: Path | None = None,
    build_id: str = "",
) -> tuple[Path, Stats]:
    """Build one profile's dataset into `out` (default `<out_dir>/<profile>`, written atomically)."""
    out = Path(cfg.out_dir) / profile if out is None else out
    tok = load_tokenizer(chunking.tokenizer_path)
    chunks = [c for seq in loaded.sequences for c in chunk_sequence(seq, chunking, tok)]
    windows = build_windows(chunks, chunking.num_chunks_per_window)
    eval_items = copy.deepcopy(loaded.eval_items)  # evidence_chunks differ per profile
    attribute_eval_items(eval_items, chunks)
    facts, probes, questions, failures = [], [], [], []
    num_units = 0
    if cfg.data.annotate and chunks:
        cache = Path(cfg.annotator.cache_dir or Path(cfg.out_dir) / ".annotation_cache") / profile
        res = annotate(chunks, windows, cfg.annotator, cache)
        facts, probes, questions, failures = res.facts, res.probes, res.orm_questions, res.failures
        num_units = res.num_units
        if res.success_rate < cfg.annotator.min_success_rate:
            raise BuildError(
                f"profile {profile}: only {res.num_units - len(failures)} of {res.num_units} annotation calls "
                f"succeeded ({res.success_rate:.0%} < annotator.min_success_rate="
                f"{cfg.annotator.min_success_rate}); reasons: {failure_reasons(failures)}; "
                f"details in {cache / 'failures.jsonl'}; nothing was written (threshold: annotator.min_success_rate=R)"
            )
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
    stats = compute(
        profile,
        sequences,
        chunks,
        windows,
        facts,
        probes,
        questions,
        eval_items,
        num_annotation_calls=num_units,
        num_annotation_failures=len(failures),
        evidence_statuses=[i.status for i in loaded.issues],
    )
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
            "build_id": build_id,
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
    return OmegaConf.to_container(OmegaConf.structured(obj))  # type: ignore[return-value]


def build(
    cfg: DataBuildConfig, judge_validator: JudgeValidator | None = None
) -> tuple[dict[str, Path], list[Stats]]:
    """Build every profile's dataset. `judge_validator` is required when judge_validation.enabled.

    Every profile is built into a staging directory first (a failure or a kill there leaves the old
    output untouched), then renamed into place under the `BUILD_INCOMPLETE` marker; `build.json`
    (build id per profile) is written last and the marker removed.
    """
    if cfg.judge_validation.enabled and judge_validator is None:
        raise ConfigError(
            "judge_validation.enabled=true needs the reward judge, which the data build does not import: "
            f"run `{JUDGED_BUILD_COMMAND}` with the same overrides"
        )
    loaded, synth = load_sources(cfg.data)
    if loaded.issues:
        by = {k: sum(i.status == k for i in loaded.issues) for k in ("unresolved", "recovered", "empty")}
        log.warning(
            "%d evidence issue(s): %d unresolved, %d recovered, %d empty (see evidence_issues.jsonl)",
            len(loaded.issues),
            by["unresolved"],
            by["recovered"],
            by["empty"],
        )
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out_dir)
    build_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage = Path(tempfile.mkdtemp(prefix=f".staging-{build_id}-", dir=out_dir))
    try:
        shared_mode(stage, directory=True)
        staged, rows = {}, []
        for profile, chunking in cfg.data.profiles.items():
            staged[profile], st = build_profile(
                cfg, profile, chunking, loaded, synth, judge_validator, stage / profile, build_id
            )
            rows.append(st)
        marker = out_dir / BUILD_INCOMPLETE
        atomic_write_text(marker, f"build {build_id}, pid {os.getpid()}, profiles {list(staged)}\n")
        outs = {}
        for profile, path in staged.items():
            outs[profile] = install_profile(path, out_dir / profile)
        atomic_write_text(out_dir / "stats.md", format_table(rows) + "\n")
        atomic_write_text(out_dir / "stats.json", stats_json(rows))
        top = {"build_id": build_id, "name": cfg.data.name, "profiles": {p: build_id for p in outs}}
        atomic_write_text(out_dir / BUILD_MANIFEST, json.dumps(top, indent=2, sort_keys=True))
        marker.unlink()
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return outs, rows


def install_profile(staged: Path, target: Path) -> Path:
    """Rename one complete, staged profile directory into place (replacing the previous version)."""
    replace_dir(staged, target)
    return target


def _remove_stale_staging(out_dir: Path) -> None:
    """Staging directories of builds that were killed (their pid is gone)."""
    for d in out_dir.glob(".staging-*"):
        try:
            pid = int(d.name.split("-")[3])
            os.kill(pid, 0)
            if pid != os.getpid():
                continue  # that build is still running
        except (IndexError, ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)


def load_config(overrides: list[str]) -> DataBuildConfig:
    return to_typed(compose("data_build", overrides), DataBuildConfig)


# HTTP client loggers that print one INFO line per request (openai 3.x logs through httpx2)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "urllib3")
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, RecordError, BuildError, OSError)


def usage(prog: str = "python -m data_pipeline.build") -> str:
    """`--help`: the config groups and keys of configs/data_build.yaml, and example commands."""
    data = sorted(p.stem for p in (Path(CONFIG_DIR) / "data").glob("*.yaml"))
    exps = sorted(
        p.stem for p in (Path(CONFIG_DIR) / "exp").glob("*.yaml") if "primaries: data_build" in p.read_text()
    )
    judged = ", then judge validation (judge_validation.*)" if prog == JUDGED_BUILD_COMMAND else ""
    return f"""usage: {prog} [--cfg] [--debug] [--help] [KEY=VALUE ...]

Builds reward / evaluation data (docs/data.md){judged}: one dataset per harness configuration under
<out_dir>/<profile>/ plus <out_dir>/stats.md. Config: configs/data_build.yaml, composed by Hydra;
arguments are Hydra overrides (KEY=VALUE for any field of DataBuildConfig).

config groups:
  data=NAME        {", ".join(data)}  (configs/data/; default synthetic_demo)
  +exp=NAME        {", ".join(exps) or "-"}  (configs/exp/)
primary keys:
  out_dir          output root (default runs/data/<data.name>)
  data.*           sources (kind locomo | longmemeval | jsonl | synthetic, path, name), profiles.<harness>
                   (mode, max_tokens, num_chunks_per_window, tokenizer_path), annotate, use_seed_facts,
                   allow_session_gaps, eval_fraction, eval_seed, synthetic.*
  annotator.*      base_url, model, api_key, num_workers, use_json_schema, progress,
                   +min_success_rate (default 0.9), +num_retries, +max_tokens, ...
  judge_validation.*  enabled, base_url, model, num_items, ... (run via python -m reward.judge_validation)
flags:
  --cfg            print the resolved config and exit
  --debug          show the traceback of an error (also {DEBUG_ENV}=1); otherwise one line, exit 2
  --help, -h       this text

examples:
  {prog}                                   # synthetic demo data, no LLM
  {prog} data=locomo_sample out_dir=runs/data/sample
  {prog} data=locomo_sample data.annotate=true annotator.base_url=http://HOST:8000/v1 annotator.model=annotator
  {JUDGED_BUILD_COMMAND} data=locomo_sample judge_validation.enabled=true \\
      judge_validation.base_url=http://HOST:8001/v1 judge_validation.model=judge
"""


def setup_logging() -> None:
    """The build's own INFO lines; the HTTP clients' one-line-per-request INFO logs are held at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(
    argv: list[str] | None = None,
    judge_validator: JudgeValidator | None = None,
    prog: str = "python -m data_pipeline.build",
) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(usage(prog))
        return 0
    debug = "--debug" in args or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    show = "--cfg" in args
    setup_logging()
    try:
        cfg = load_config([a for a in args if a not in ("--cfg", "--debug")])
        if show:
            print(to_yaml(cfg))
            return 0
        outs, rows = build(cfg, judge_validator)
    except (*USER_ERRORS, HydraException) as e:
        if debug:
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, HydraException):
            msg = f"bad override: {msg.split(' Config search path')[0]} (see --help)"
        print(f"error: {msg}  [traceback: --debug or {DEBUG_ENV}=1]", file=sys.stderr)
        return 2
    print(format_table(rows))
    for profile, path in outs.items():
        print(f"{profile}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
