"""The report's writer-only swap matrix in one command (docs/evaluation.md).

    python -m hymem_train.evaluate +exp=evaluate_demo
    python -m hymem_train.evaluate +exp=evaluate_locomo 'writers=[{name: base, checkpoint: ckpt/base},
        {name: hy-memory, base_url: "http://gpu-node:8000/v1", model: hy-memory}]'
        protocol.reader.base_url=http://reader:8001/v1 protocol.judge.base_url=http://judge:8002/v1

Every writer builds its banks from empty in every harness; only the write path reaches the writer. The
harnesses' search-time calls, the reader and the judge go to fixed endpoints (a run where the writer
serves any of them is refused). Output: <run>/eval/{table.md, table.csv, table.png, items.jsonl,
summary.json, endpoints.json, build_times.jsonl} and, on ledger data in the native harness,
bank_metrics.{json,md} (evaluation/bank_report.py); a killed run resumes from <run>/eval/cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from harnesses.base import Endpoint, write_json_atomic
from hymem_train.config import CONFIG_DIR, to_typed, to_yaml
from hymem_train.evaluation.bank_report import write_bank_metrics
from hymem_train.evaluation.config import WriterConfig, with_writer_decoding
from hymem_train.evaluation.matrix import Endpoints, MatrixRun, gold_datasets, held_out, plan_matrix
from hymem_train.evaluation.report import build_table, write_outputs
from hymem_train.run_config import EvaluateConfig
from reward.eval_protocol import metric_for
from reward.judge import Reader
from reward.llm import ChatClient
from reward.reader_checks import preflight_to

log = logging.getLogger(__name__)

WRITER_MODEL = "writer"  # the model name a local writer's gateway serves


def writer_model_cfg(cfg: EvaluateConfig, w: WriterConfig):
    from hymem_train.models.loading import require_local_dir

    require_local_dir(w.checkpoint, f"writers[{w.name}].checkpoint")
    return dataclasses.replace(cfg.model, path=w.checkpoint, preset=w.preset or cfg.model.preset)


def writer_tokenizer(cfg: EvaluateConfig, model_cfg):
    """The checkpoint's own tokenizer when it has one (HF directories do, step checkpoints do not)."""
    from hymem_train.models.loading import load_tokenizer_for

    if (Path(model_cfg.path) / "tokenizer.json").exists():
        return load_tokenizer_for(model_cfg)
    return load_tokenizer_for(cfg.model)


@contextlib.contextmanager
def serve_writer(
    cfg: EvaluateConfig, w: WriterConfig, gold_data: dict | None = None, gold_counts: dict | None = None
):
    """(endpoint, served-call counter) for one writer; a checkpoint is served by the engine in frozen
    mode behind a gateway of this process for as long as its cell runs; so is the gold writer's scripted
    engine (evaluation/bound.py, `gold_data`: framework -> the dataset its harnesses write; its reply
    record lands in `gold_counts[w.name]` as it stops); the empty writer has no endpoint (nothing is
    written)."""
    if w.kind == "empty":
        yield None, None
        return
    if w.base_url:
        yield Endpoint(w.base_url, w.api_key, w.model, timeout_s=w.timeout_s), None
        return
    from hymem_train.engines import build_engine
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway

    if w.kind == "gold":
        from hymem_train.evaluation.bound import gold_engine

        engine, tok = gold_engine(gold_data or {}, cfg.engine.max_model_len)
    else:
        model_cfg = writer_model_cfg(cfg, w)
        tok = writer_tokenizer(cfg, model_cfg)
        engine = build_engine(dataclasses.replace(cfg.engine, capture_routes=False), model_cfg, tok)
    gcfg = dataclasses.replace(cfg.gateway, frozen=True, embeddings=False, served_model_name=WRITER_MODEL)
    gateway = Gateway(engine, tok, gcfg)
    c = gateway.counters
    with GatewayServer(gateway) as server:
        log.info("writer %s (%s) served on %s", w.name, w.checkpoint or w.kind, server.base_url)
        yield (
            Endpoint(server.base_url, "EMPTY", WRITER_MODEL, timeout_s=w.timeout_s),
            lambda: c["requests_ok"] + c["bad_request"] + c["engine_error"],
        )
    if w.kind == "gold" and gold_counts is not None:
        gold_counts[w.name] = engine.reply.record()


@contextlib.contextmanager
def fixed_services(cfg: EvaluateConfig):
    """The embedder (local MiniLM), and the reader / judge from local HF engines when asked (CPU boxes);
    the reader is the extractive reader (no model) under reader_kind=extractive."""
    from hymem_train.gateway.local_reader import start_frozen_server, start_instrument_server
    from hymem_train.gateway.runner import GatewayServer
    from hymem_train.gateway.server import Gateway
    from hymem_train.models.loading import load_tokenizer_for
    from hymem_train.models.tokenizer import default_tokenizer

    with contextlib.ExitStack() as stack:
        emb = Gateway(None, None, dataclasses.replace(cfg.gateway, frozen=True, embeddings=True))
        emb_server = stack.enter_context(GatewayServer(emb))
        proto = cfg.protocol
        for role, local, model in (
            ("reader", cfg.local_reader, cfg.reader_model),
            ("judge", cfg.local_judge, cfg.judge_model),
        ):
            if local:
                client = getattr(proto, role)
                if role == "reader" and cfg.reader_kind != "model":  # an instrument: reader_model unused
                    srv = start_instrument_server(
                        default_tokenizer(),
                        served_model_name=client.model,
                        max_model_len=cfg.engine.max_model_len,
                        kind=cfg.reader_kind,
                    )
                else:
                    srv = start_frozen_server(
                        model,
                        load_tokenizer_for(model),
                        served_model_name=client.model,
                        max_model_len=cfg.engine.max_model_len,
                    )
                stack.callback(srv.stop)
                setattr(proto, role, dataclasses.replace(client, base_url=srv.base_url))
        # an identity of its own that never declares a chunk (as the training stages' bank readers)
        yield Endpoint(emb_server.base_url, emb.register("evaluation", bank_id="*"), emb.embedder.name)


def evaluate(cfg: EvaluateConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the matrix and write its tables; returns the summary and where the files are."""
    cfg.validate()
    cfg = with_writer_decoding(cfg)  # config.yaml below records the decoding the writers used
    run_dir = Path(cfg.run.output_dir)
    out = run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    planned = plan_matrix(cfg)  # bad data, benchmarks or subsample: refused before any model loads
    with fixed_services(cfg) as embedder:
        if cfg.reader_preflight:
            reader_preflight(cfg, run_dir, {pl.harness: pl.dataset for pl in planned})
        search = None
        if cfg.protocol.search_llm == "reader":
            r = cfg.protocol.reader
            search = Endpoint(r.base_url, r.api_key, r.model, timeout_s=r.timeout_s)
        endpoints = Endpoints({}, embedder, search, cfg.protocol.reader, cfg.protocol.judge)
        matrix = MatrixRun(cfg, out, endpoints, parallel_builds=cfg.parallel_builds, progress=progress)
        served_calls: dict[str, int | None] = {}
        gold_counts: dict[str, dict] = {}
        gold_data = gold_datasets(cfg, planned)
        for w in cfg.writers:
            with serve_writer(cfg, w, gold_data, gold_counts) as (ep, served):
                endpoints.writers[w.name] = ep
                if served is not None:
                    endpoints.served[w.name] = served
                matrix.run([w])
                served_calls[w.name] = served() if served else None
        plans = plan_matrix(cfg)
        records = matrix.all_records(plans)
    record_endpoints(out, cfg, endpoints, matrix, served_calls, gold_counts)
    times = record_build_times(out, matrix.build_times)
    harnesses = list(cfg.harnesses)
    table = build_table(
        records,
        [w.name for w in cfg.writers],
        harnesses,
        {h: held_out(cfg.harnesses[h]) for h in harnesses},
        resamples=cfg.bootstrap_resamples,
        seed=cfg.seed,
    )
    header = table_header(cfg, plans, gold_counts)
    table.notes += [f"bank builds, {h}: {v}" for h, v in times.items()]
    md = write_outputs(out, table, records, header, {"stats": dict(matrix.stats), "build_seconds": times})
    bank_md = write_bank_metrics(matrix, plans)  # ledger data in the native harness only
    return {
        "table_md": md,
        "out": str(out),
        "stats": dict(matrix.stats),
        "records": records,
        "table": table,
        "bank_metrics_md": str(bank_md) if bank_md else None,
    }


def reader_preflight(cfg: EvaluateConfig, run_dir: Path, datasets: dict[str, Any]) -> None:
    """On ledger-world data: does the fixed reader read the bank? The four figures go to
    <run_dir>/reader_preflight.json and the log; a failed check stops the run before any writer
    (reward.reader_checks)."""
    preflight_to(
        run_dir / "reader_preflight.json",
        datasets,
        Reader(ChatClient(cfg.protocol.reader)),
        search_k=cfg.protocol.search_k,
        echo=lambda s: print(s, flush=True),
    )


def table_header(cfg: EvaluateConfig, plans, gold_counts: dict | None = None) -> list[str]:
    p = cfg.protocol
    lines = [
        f"- command: `{' '.join(sys.argv)}`" if sys.argv and sys.argv[0] else "- command: (library call)"
    ]
    for w in cfg.writers:
        lines.append(f"- writer **{w.name}**: " + writer_label(w))
        counts = (gold_counts or {}).get(w.name, {}).get("counts")
        if counts:  # real data: a prompt with no whole chunk leaves that chunk's memories out of the bank
            lines.append(
                f"  - its replies: {counts.get('memories', 0)} gold memories written; "
                f"{counts.get('unmatched', 0)} write prompt(s) matched no chunk (their memories are missing); "
                + ", ".join(
                    f"{k} {v}" for k, v in sorted(counts.items()) if k not in ("memories", "unmatched")
                )
            )
    judged = p.judge_mode == "protocol" and bool(p.judge.base_url)
    lines.append(
        f"- reader: model `{p.reader.model}` at {p.reader.base_url}; judge mode `{p.judge_mode}`"
        + (f", judge model `{p.judge.model}` at {p.judge.base_url}" if judged else "")
        + (" (token F1: not the report's judge protocol)" if p.judge_mode == "token_f1" else "")
    )
    budgets = {b: p.budget(metric_for(b)) for pl in plans for b in pl.benchmarks}
    lines.append(
        "- reader answer budgets (max_tokens): "
        + ", ".join(f"{b} {n}" for b, n in sorted(budgets.items()))
        + (
            f"; capped at {p.reader_budget_cap} for this reader, not the published budgets"
            if p.reader_budget_cap
            else "; each benchmark's published budget (docs/evaluation.md)"
        )
    )
    for pl in plans:
        sub = pl.dataset.manifest.eval_subsample
        n = sum(len(v) for v in pl.items.values())
        lines.append(
            f"- {pl.harness}: `{pl.dataset.root}`, {n} items over {len(pl.items)} sequences; subsample "
            f"{cfg.subsample} (fraction {sub.get('fraction')}, seed {sub.get('seed')})"
            + (f", first {cfg.max_items_per_benchmark} per benchmark" if cfg.max_items_per_benchmark else "")
        )
    return lines


def writer_label(w: WriterConfig) -> str:
    if w.kind == "empty":
        return "store nothing (bound: each bank is created and nothing is written)"
    if w.kind == "gold":
        return "gold bank (bound: the data's gold memories through each harness's own write path)"
    return f"checkpoint `{w.checkpoint}`" if w.checkpoint else f"endpoint {w.base_url} model `{w.model}`"


def record_endpoints(
    out: Path, cfg: EvaluateConfig, ep: Endpoints, matrix: MatrixRun, served: dict, gold_counts: dict
) -> None:
    """Which endpoint served which call kind (the run refuses a writer that served anything else), and the
    gold writer's reply counts (evaluation/bound.py)."""
    rec = {
        "gold_replies": gold_counts,
        "write": {
            w: {"base_url": e.base_url, "model": e.model, "served_requests": served.get(w)} if e else None
            for w, e in ep.writers.items()
        },
        "write_calls_made": matrix.stats.get("write_calls", 0),
        "embedder": {"base_url": ep.embedder.base_url, "model": ep.embedder.model} if ep.embedder else None,
        "search_llm": {"base_url": ep.search.base_url, "model": ep.search.model} if ep.search else None,
        "reader": {
            "base_url": ep.reader.base_url,
            "model": ep.reader.model,
            "calls": matrix.stats.get("reader_calls", 0),
        },
        "judge": {
            "base_url": ep.judge.base_url,
            "model": ep.judge.model,
            "mode": cfg.protocol.judge_mode,
            "calls": matrix.stats.get("judge_calls", 0),
        },
    }
    write_json_atomic(out / "endpoints.json", rec)


def record_build_times(out: Path, times: list[dict[str, Any]]) -> dict[str, str]:
    """Mean seconds per chunk and per build, per harness, over every build in build_times.jsonl (the matrix
    appends each as it finishes, across resumed invocations; a resumed build counts only its last part)."""
    path = out / "build_times.jsonl"
    all_times = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    by: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for t in all_times:
        if t["status"] == "ok":
            by[t["harness"]].append((t["seconds"], t["chunks"]))
    return {
        h: f"mean {statistics.mean(s for s, _ in v):.1f} s per build, {sum(s for s, _ in v) / max(1, sum(c for _, c in v)):.1f} "
        f"s per chunk, over {len(v)} builds"
        for h, v in by.items()
    }


@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base=None)
def main(dcfg: DictConfig) -> None:
    cfg = to_typed(dcfg, EvaluateConfig)
    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per request would bury the progress bars
        logging.getLogger(noisy).setLevel(logging.WARNING)
    res = evaluate(cfg)
    print(res["table_md"], flush=True)
    print(f"tables: {res['out']}/table.md, table.csv, table.png; items: {res['out']}/items.jsonl", flush=True)


if __name__ == "__main__":
    main()
