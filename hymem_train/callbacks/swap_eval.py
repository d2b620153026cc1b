"""The writer-swap matrix on the stage's current policy every `swap_eval.every` steps (docs/evaluation.md,
"In a stage"). The policy writes through the stage's own gateway; each bank build registers an identity
of its own and is forgotten afterwards, so its segments never reach training. The policy writes with the
evaluation protocol's decoding (evaluation/config.py EVAL_DECODING), not the rollouts' temperature."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from harnesses.base import Endpoint
from hymem_train.callbacks import Callback
from hymem_train.evaluation.config import EvalData, MatrixConfig, WriterConfig, with_writer_decoding
from hymem_train.evaluation.matrix import Endpoints, MatrixRun, held_out, safe
from hymem_train.evaluation.report import build_table, write_outputs

log = logging.getLogger(__name__)


class StageGatewayWriter:
    """The stage's policy as a writer: one registered identity per bank build, chunk declared per write."""

    def __init__(self, gateway: Any, base_url: str, model: str, step: int):
        self.gateway, self.base_url, self.model, self.step = gateway, base_url, model, step
        self._tid: dict[str, str] = {}

    def begin(self, unit: Any) -> Endpoint:
        tid = f"swap-s{self.step}-{safe(unit.harness)}-{safe(unit.sequence_id)}-{uuid.uuid4().hex[:6]}"
        self._tid[unit.label] = tid
        return Endpoint(self.base_url, self.gateway.register(tid, bank_id=str(unit.dir / "bank")), self.model)

    def chunk(self, unit: Any, chunk_index: int) -> None:
        self.gateway.set_chunk(self._tid[unit.label], chunk_index)

    def end(self, unit: Any) -> None:
        tid = self._tid.pop(unit.label, None)
        if tid is not None:
            self.gateway.forget(tid)  # drops its identity and its recorded segments


class SwapEval(Callback):
    def __init__(self, stage: Any):
        self.stage = stage

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        c, st = self.stage.cfg.swap_eval, self.stage
        if not c.every or step % c.every:
            return
        proto = c.protocol
        if (
            not proto.reader.base_url and st.reward_reader is not None
        ):  # the RL stage's reader (local or remote)
            proto = dataclasses.replace(proto, reader=st.reward_reader)
        names = list(c.harnesses) or [next(iter(st.cfg.harnesses))]
        writer = f"step_{step}"
        mcfg = MatrixConfig(
            writers=[
                WriterConfig(name=writer, base_url=st.server.base_url, model=st.cfg.gateway.served_model_name)
            ],
            harnesses={h: st.cfg.harnesses[h] for h in names},
            data=EvalData(path=c.data or st.cfg.data.eval_path),
            benchmarks=list(c.benchmarks),
            protocol=proto,
            subsample=c.subsample,
            max_items_per_benchmark=c.max_items_per_benchmark,
            bootstrap_resamples=c.bootstrap_resamples,
            seed=st.cfg.run.seed,
        )
        mcfg.validate()
        mcfg = with_writer_decoding(mcfg)
        r = proto.reader
        search = Endpoint(r.base_url, r.api_key, r.model) if proto.search_llm == "reader" else None
        embedder = next(iter(st.bank_readers.values())).embedder
        g = st.gateway.counters
        endpoints = Endpoints(
            {
                writer: StageGatewayWriter(
                    st.gateway, st.server.base_url, st.cfg.gateway.served_model_name, step
                )
            },
            embedder,
            search,
            proto.reader,
            proto.judge,
            served={writer: lambda: g["requests_ok"] + g["bad_request"] + g["engine_error"]},
        )
        out = st.run_dir / "swap" / f"step_{step}"
        # one directory per step, written by the policy at that step: a restart restores the same
        # weights but serves them on another port, which the writer check would take for another writer
        matrix = MatrixRun(mcfg, out, endpoints, progress=False, check_writers=False)
        records = matrix.run()
        table = build_table(
            records,
            [writer],
            names,
            {h: held_out(mcfg.harnesses[h]) for h in names},
            resamples=c.bootstrap_resamples,
            seed=st.cfg.run.seed,
        )
        write_outputs(
            out,
            table,
            records,
            [f"- step {step}: the stage's policy through its gateway"],
            {
                "stats": dict(matrix.stats),
                "harnesses": {h: dataclasses.asdict(mcfg.harnesses[h]) for h in names},
            },
        )
        for h in names:
            cell = table.harness_scores.get((writer, h))
            if cell is not None and cell.n:
                metrics[f"swap/{h}"] = cell.mean
        if writer in table.average and table.average[writer].n:
            metrics["swap/average"] = table.average[writer].mean
        metrics["swap/failed_items"] = float(sum(1 for x in records if "failure" in x))
