"""Preflight of a stage on its cluster, from the config alone: where each device process goes, and
whether it fits (docs/cluster.md, "Preflight").

    python -m hymem_train.plan +exp=hy_memory_opd                          # the experiment names its stage
    python -m hymem_train.plan +exp=hy_memory_rl cluster=slurm_16x8_h200   # RL on H200s
    python -m hymem_train.plan --config-name rl +exp=hy_memory_rl          # the stage given explicitly

Prints the placement (which GPUs train, which serve the policy, teacher, reader and judge), the batch
over the trainer ranks, the rollouts in flight, and a per-GPU memory estimate with each term's formula.
An impossible plan exits non-zero with the reason. No GPU and no model: parameter counts are analytic
(models/presets.py:count_params). `make_plan(cfg) -> Plan` and `format_plan(plan) -> str` are the core.

Estimates, not measurements: 1 GB = 1e9 bytes, and `cluster.gpu_memory_gb` is the marketed size
(nvidia-smi reports a little more), so the margins lean safe.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import DictConfig

from hymem_train.config import CONFIG_DIR, to_typed
from hymem_train.run_config import OpdConfig, RlConfig, StageConfig, ray_cpu_demand

GB = 1e9
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# vLLM's batch defaults on GPUs of >= 70 GiB (vllm/engine/arg_utils.py, get_batch_defaults): the LLM
# class (our VLLMEngine: policy, teacher) and the OpenAI server (the reader / judge endpoints).
VLLM_BATCH = {"llm": (16_384, 1_024), "server": (8_192, 1_024)}  # (max_num_batched_tokens, max_num_seqs)
ENGINE_RUNTIME_GB = 2.0  # one vLLM worker's CUDA context and CUDA graphs (vLLM logs ~0.5-1.5 GiB of graphs)
ENGINE_ASLEEP_GB = 1.0  # colocated: a sleeping vLLM worker drops weights and KV, keeps its CUDA context
TRAIN_RUNTIME_GB = 4.0  # CUDA context, NCCL communicators and buffers, caching-allocator fragmentation
# DeepSpeed ZeRO-3 defaults the trainer keeps (trainer/engine.py sets neither)
DS_PREFETCH_BUCKET = 5e7  # stage3_prefetch_bucket_size: parameters fetched ahead of the current module
DS_REDUCE_BUCKET = 5e8  # reduce_bucket_size: gradient elements per reduce-scatter


class PlanError(ValueError):
    """An impossible plan; the message says why and names the key to change."""


@dataclass(frozen=True)
class Arch:
    """The sizes the estimates need, from a preset (models/presets.py)."""

    preset: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    top_k: int
    moe_intermediate: int
    num_shared_experts: int
    total_params: int
    active_params: int
    layer_params: int  # one decoder layer: ZeRO-3 gathers a whole MoE block at once (a leaf module)

    @property
    def act_elems_per_token(self) -> int:
        """Activation elements one decoder layer keeps per token for backward: norms, q/k/v, QK-norm and
        rope outputs, attention and o_proj outputs; per routed slot (top_k) the expert input, gate, up,
        act and output; the shared expert likewise."""
        h, i = self.hidden, self.moe_intermediate
        qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        qk = (self.num_heads + self.num_kv_heads) * self.head_dim
        attn = h + qkv + 2 * qk + self.num_heads * self.head_dim + 2 * h
        return attn + (self.top_k + self.num_shared_experts) * (2 * h + 3 * i)


def load_arch(preset: str, key: str) -> Arch:
    from hymem_train.models.presets import count_params, make_config  # transformers config only, no model

    try:
        c = make_config(preset)
    except KeyError as e:
        raise PlanError(f"{key}={preset!r}: {e.args[0]}") from None
    n = count_params(c)
    outside = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2) + c.hidden_size
    return Arch(
        preset=preset,
        num_layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        vocab=c.vocab_size,
        num_experts=c.num_experts,
        top_k=c.num_experts_per_tok,
        moe_intermediate=c.moe_intermediate_size,
        num_shared_experts=c.num_shared_experts,
        total_params=n.total,
        active_params=n.active,
        layer_params=(n.total - outside) // c.num_hidden_layers,
    )


@dataclass(frozen=True)
class Pool:
    """A contiguous range of global GPU indices (node-major) owned by one role."""

    role: str  # train | train+policy | policy | teacher | reader | judge
    first_gpu: int
    num_gpus: int
    tp: int  # GPUs per replica (1 for the trainer: one rank per GPU)
    what: str

    @property
    def replicas(self) -> int:
        return self.num_gpus // self.tp

    def nodes(self, gpus_per_node: int) -> str:
        a, b = self.first_gpu // gpus_per_node, (self.first_gpu + self.num_gpus - 1) // gpus_per_node
        return str(a) if a == b else f"{a}-{b}"


@dataclass(frozen=True)
class Term:
    name: str
    formula: str
    bytes: float


@dataclass(frozen=True)
class GpuMemory:
    """One GPU of a role: the terms that fill it (they sum to the peak) and derived lines."""

    role: str
    title: str
    terms: tuple[Term, ...]
    capacity: float
    derived: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)


@dataclass(frozen=True)
class EngineFit:
    role: str
    kv_bytes_per_token: int  # per GPU of a replica
    max_model_len: int
    seqs_fit: int  # sequences of max_model_len one replica's KV cache holds
    seqs_assigned: float  # sequences in flight per replica (0 = not known from the config)


@dataclass(frozen=True)
class Plan:
    stage: str  # opd | rl
    run_name: str
    num_nodes: int
    gpus_per_node: int
    gpu_memory_gb: float
    mode: str
    model: Arch
    pools: tuple[Pool, ...]
    train_ranks: int
    batch: str  # the formula of the rollouts per step
    rollouts_per_step: int
    rollouts_per_update: int
    in_flight: int
    seqs_per_policy_replica: float
    ray_cpus: float
    memory: tuple[GpuMemory, ...] = ()
    engines: tuple[EngineFit, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def mem(self, role: str) -> GpuMemory:
        return next(m for m in self.memory if m.role == role)

    def engine(self, role: str) -> EngineFit:
        return next(e for e in self.engines if e.role == role)


def _gb(x: float) -> str:
    return f"{x / GB:.2f}"


def _b(n: float) -> str:
    """Parameter / element counts as people write them: 30.62B, 629.9M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _check_tp(tp: int, key: str, a: Arch, gpus_per_node: int) -> None:
    if gpus_per_node % tp:
        raise PlanError(
            f"{key}={tp} does not divide cluster.num_gpus_per_node={gpus_per_node}: a replica must sit "
            "within one node (tensor parallelism all-reduces every layer over NVLink)"
        )
    if a.num_heads % tp or (a.num_kv_heads % tp and tp % a.num_kv_heads):
        raise PlanError(
            f"{key}={tp}: vLLM shards {a.num_heads} attention / {a.num_kv_heads} KV heads, so the TP size "
            "must divide the attention heads and divide or be a multiple of the KV heads"
        )


def _layout(cfg: StageConfig, a: Arch, frozen: list[tuple[str, int, int, str]]) -> list[Pool]:
    """The pools in placement order; refuses counts the cluster cannot hold."""
    cl, pl = cfg.cluster, cfg.cluster.placement
    total, gpn = cl.num_nodes * cl.num_gpus_per_node, cl.num_gpus_per_node
    tp = cfg.engine.tensor_parallel_size
    _check_tp(tp, "engine.tensor_parallel_size", a, gpn)
    frozen_gpus = sum(n * t for _, n, t, _ in frozen)
    split = pl.mode == "split"
    if split and pl.policy_replicas < 1:
        raise PlanError(
            "cluster.placement.policy_replicas=0: a GPU cluster serves the policy from >= 1 replica"
        )
    policy_gpus = pl.policy_replicas * tp if split else 0
    train = pl.train_gpus or total - policy_gpus - frozen_gpus  # 0 = what the other pools leave
    used = train + policy_gpus + frozen_gpus
    if train < 1 or used > total:
        parts = [f"train {train}"] + ([f"policy {pl.policy_replicas} x {tp}"] if split else [])
        parts += [f"{role} {n} x {t}" for role, n, t, _ in frozen if n]
        raise PlanError(
            f"too few GPUs: {' + '.join(parts)} = {used} GPUs, the cluster has cluster.num_nodes="
            f"{cl.num_nodes} x cluster.num_gpus_per_node={gpn} = {total} (and the trainer needs >= 1)"
        )
    if not split:
        if train % tp:
            raise PlanError(
                f"cluster.placement.train_gpus={train}: colocated policy replicas fill the training GPUs, "
                f"so it must be a multiple of engine.tensor_parallel_size={tp}"
            )
        if pl.policy_replicas not in (0, train // tp):
            raise PlanError(
                f"cluster.placement.policy_replicas={pl.policy_replicas}: colocated, the policy replicas are "
                f"train_gpus / TP = {train} / {tp} = {train // tp} (or 0 for that)"
            )
    what = "DeepSpeed ZeRO-3, one rank per GPU"
    if not split:
        what += f"; vLLM policy replicas of TP {tp} on the same GPUs, asleep while the trainer steps"
    pools = [Pool("train" if split else "train+policy", 0, train, 1 if split else tp, what)]
    if split:
        pools.append(Pool("policy", train, policy_gpus, tp, "vLLM replicas behind the gateway"))
    for role, n, t, what in frozen:
        if n:
            pools.append(Pool(role, pools[-1].first_gpu + pools[-1].num_gpus, n * t, t, what))
    for p in pools:
        if (p.first_gpu % gpn) % p.tp:
            raise PlanError(
                f"the {p.role} pool starts at GPU {p.first_gpu} (node {p.first_gpu // gpn}, local "
                f"{p.first_gpu % gpn}): a replica of TP {p.tp} would span two nodes; make the pools before "
                f"it a multiple of {p.tp} GPUs"
            )
    return pools


def _train_memory(
    cfg: StageConfig, a: Arch, ranks: int, cap: float, tokens: int, extra: list[Term]
) -> GpuMemory:
    tr = cfg.trainer
    bf16 = tr.precision != "fp32"  # "auto" is bf16 on GPU (trainer/engine.py)
    p, w = a.total_params, 2 if bf16 else 4
    terms = [
        Term("params", f"{_b(p)} x {w} B / {ranks} ranks", p * w / ranks),
        Term("grads", f"{_b(p)} x {w} B / {ranks}", p * w / ranks),
    ]
    if bf16:
        terms.append(Term("fp32 master", f"{_b(p)} x 4 B / {ranks}", p * 4 / ranks))
    terms.append(Term("Adam m, v", f"{_b(p)} x 8 B / {ranks}", p * 8 / ranks))
    gather = max(a.layer_params, a.vocab * a.hidden) + DS_PREFETCH_BUCKET
    terms.append(
        Term(
            "gathered params",
            f"(max(layer {_b(a.layer_params)}, lm_head {_b(a.vocab * a.hidden)}) "
            f"+ prefetch {_b(DS_PREFETCH_BUCKET)}) x {w} B",
            gather * w,
        )
    )
    grad_buf = max(a.layer_params, DS_REDUCE_BUCKET)
    terms.append(
        Term(
            "layer grads",
            f"max(layer {_b(a.layer_params)}, reduce bucket {_b(DS_REDUCE_BUCKET)}) "
            f"x {w} B, before reduce-scatter",
            grad_buf * w,
        )
    )
    e = a.act_elems_per_token
    if tr.gradient_checkpointing:
        terms.append(
            Term(
                "checkpoints",
                f"{a.num_layers} layers x {tokens} tok x {a.hidden} x {w} B",
                a.num_layers * tokens * a.hidden * w,
            )
        )
        terms.append(
            Term(
                "layer recompute",
                f"{tokens} tok x {e} x {w} B x 2 (activations + their grads)",
                tokens * e * w * 2,
            )
        )
    else:
        terms.append(
            Term(
                "activations",
                f"{a.num_layers} layers x {tokens} tok x {e} x {w} B",
                a.num_layers * tokens * e * w,
            )
        )
    lo = tr.loss
    k = cfg.opd.teacher_top_k if isinstance(cfg, OpdConfig) else 1
    head = 3 * lo.block_rows * lo.block_vocab * 4 + tokens * (k + 2) * 4 + tokens * k * 12
    terms.append(
        Term(
            "chunked loss head",
            f"3 x {lo.block_rows} x {lo.block_vocab} x 4 B tiles + {tokens} tok "
            f"x ({k} + 2) x 4 B + top-{k} ids/logprobs",
            head,
        )
    )
    terms.append(
        Term("runtime", "CUDA context, NCCL buffers, allocator fragmentation", TRAIN_RUNTIME_GB * GB)
    )
    terms += extra
    title = (
        f"train (DeepSpeed ZeRO-3 over {ranks} ranks, {'bf16' if bf16 else 'fp32'}, {tokens} tokens per row)"
    )
    return GpuMemory("train", title, tuple(terms), cap)


def _engine_memory(
    role: str,
    a: Arch,
    tp: int,
    util: float,
    max_len: int,
    dtype: str,
    api: str,
    cap: float,
    assigned: float,
    *,
    prompt_logprobs: bool = False,
    extra: list[Term] | None = None,
    key: str,
) -> tuple[GpuMemory, EngineFit]:
    """vLLM: weights per TP shard + runtime + KV cache fill util x GPU; the KV cache decides how many
    sequences of max_model_len a replica holds at once."""
    db = DTYPE_BYTES[dtype]
    batched, seqs = VLLM_BATCH[api]
    pool = util * cap
    weights = a.total_params * db / tp
    runtime = batched * a.act_elems_per_token * db + seqs * a.vocab * 4 + ENGINE_RUNTIME_GB * GB
    kv = pool - weights - runtime
    kv_heads = math.ceil(a.num_kv_heads / tp)  # TP beyond the KV heads replicates them
    per_token = 2 * a.num_layers * kv_heads * a.head_dim * db
    fit = max(0, int(kv // (per_token * max_len)))
    terms = [
        Term("weights", f"{_b(a.total_params)} x {db} B / TP {tp}", weights),
        Term(
            "runtime",
            f"prefill {batched} tok x {a.act_elems_per_token} x {db} B + sampler {seqs} seqs x "
            f"{a.vocab} x 4 B + {ENGINE_RUNTIME_GB:g} GB context and CUDA graphs",
            runtime,
        ),
        Term("KV cache", f"{util} x {cap / GB:g} GB - weights - runtime", max(kv, 0.0)),
    ]
    if prompt_logprobs:  # the teacher's top-k over every prompt position: logits of a whole prefill chunk,
        # computed outside vLLM's profiled budget, so they must fit in the GPU's share vLLM leaves free
        terms.append(
            Term(
                "prompt logprobs",
                f"{batched} tok x {a.vocab} x ({db} B logits + 4 B log-probs)",
                batched * a.vocab * (db + 4),
            )
        )
    terms += extra or []
    derived = [
        f"KV per token per GPU: 2 x {a.num_layers} layers x {kv_heads} KV heads x {a.head_dim} x {db} B = "
        f"{per_token / 1e3:.1f} KB",
        f"sequences of {max_len} tokens a replica holds: {_gb(max(kv, 0))} GB / ({per_token / 1e3:.1f} KB x "
        f"{max_len}) = {fit}" + (f"; in flight per replica: {assigned:g}" if assigned else ""),
    ]
    title = f"{role} (vLLM, TP {tp}, {key}.gpu_memory_utilization {util} -> {_gb(pool)} GB, {a.preset})"
    if kv <= 0:
        raise PlanError(
            f"too little memory for the {role}: weights {_gb(weights)} GB + runtime {_gb(runtime)} GB "
            f"leave no KV cache in {util} x {cap / GB:g} GB; raise {key}.tensor_parallel_size or "
            f"{key}.gpu_memory_utilization"
        )
    if fit < 1:
        raise PlanError(
            f"too little memory for the {role}: its KV cache ({_gb(kv)} GB per GPU) holds no sequence of "
            f"max_model_len {max_len} ({_gb(per_token * max_len)} GB); vLLM refuses to start. Raise "
            f"{key}.tensor_parallel_size or {key}.gpu_memory_utilization, or lower {key}.max_model_len"
        )
    mem = GpuMemory(role, title, tuple(terms), cap, tuple(derived))
    return mem, EngineFit(role, per_token, max_len, fit, assigned)


def make_plan(cfg: StageConfig) -> Plan:
    """The placement, batch split and per-GPU memory of `cfg`'s stage; PlanError if it cannot work."""
    if not isinstance(cfg, OpdConfig | RlConfig):
        raise TypeError(f"make_plan wants an OpdConfig or RlConfig, got {type(cfg).__name__}")
    try:
        cfg.cluster.validate()
    except ValueError as e:
        raise PlanError(str(e)) from None
    opd = isinstance(cfg, OpdConfig)
    cl, pl, tr = cfg.cluster, cfg.cluster.placement, cfg.trainer
    if opd:
        o = cfg.opd
        rollouts = o.num_rows_per_step * o.num_rollouts_per_row
        batch = (
            f"opd.num_rows_per_step {o.num_rows_per_step} x opd.num_rollouts_per_row {o.num_rollouts_per_row}"
        )
    else:
        r = cfg.rl
        rollouts = r.num_windows_per_step * r.num_rollouts_per_window
        batch = f"rl.num_windows_per_step {r.num_windows_per_step} x rl.num_rollouts_per_window "
        batch += str(r.num_rollouts_per_window)
    slots = cfg.rollout.num_workers * cfg.rollout.rollouts_per_worker  # RolloutPool's tasks at once
    in_flight = min(slots, rollouts)
    notes: list[str] = []
    if in_flight < rollouts:
        notes.append(
            f"rollout.num_workers x rollouts_per_worker = {slots} < {rollouts} rollouts per step: they run in "
            f"{math.ceil(rollouts / in_flight)} waves, the engines batch only {in_flight} at a time"
        )
    # vLLM's async engine takes each call as it arrives (gateway.batcher.Continuous): no batch cap
    continuous = cfg.engine.kind == "vllm" and cfg.engine.async_engine
    if cfg.gateway.max_batch_size < in_flight and not continuous:
        # the batcher hands the engine one batch of at most max_batch_size calls and waits for it, so the
        # replicas never see more than that many sequences at once (docs/performance.md, cost model)
        notes.append(
            f"gateway.max_batch_size={cfg.gateway.max_batch_size} < {in_flight} calls in flight: the gateway "
            f"sends at most {cfg.gateway.max_batch_size} per engine call, one call at a time, so the policy "
            "replicas serve that many sequences at once, not the per-replica count above"
        )
    a = load_arch(cfg.model.preset, "model.preset")
    base = dict(
        stage="opd" if opd else "rl",
        run_name=cfg.run.name,
        num_nodes=cl.num_nodes,
        gpus_per_node=cl.num_gpus_per_node,
        gpu_memory_gb=cl.gpu_memory_gb,
        mode=pl.mode,
        model=a,
        batch=batch,
        rollouts_per_step=rollouts,
        in_flight=in_flight,
        ray_cpus=ray_cpu_demand(cfg),
    )
    if cl.num_gpus_per_node == 0:  # a CPU box: engines in-process, ranks as torchrun launches them
        cpu_pools = [
            f"{n} {role} replica(s) as CPU Ray actors ({pl.cpus_per_replica:g} CPU each, "
            f"{pl.replica_strategy})"
            for role, n in (
                ("policy", pl.policy_replicas),
                ("teacher", pl.teacher_replicas if opd else 0),
                ("reader", 0 if opd else pl.reader.replicas),
                ("judge", 0 if opd else pl.judge.replicas),
            )
            if n
        ]
        notes.append(
            "CPU-only cluster: "
            + (
                "; ".join(cpu_pools) + ", the rest in the driver (HF)"
                if cpu_pools
                else "every engine runs in the driver (HF)"
            )
            + "; no GPU placement or memory estimate"
        )
        return Plan(
            **base,
            pools=(),
            train_ranks=1,
            rollouts_per_update=rollouts,
            seqs_per_policy_replica=float(in_flight),
            notes=tuple(notes),
        )
    if cl.gpu_memory_gb <= 0:
        raise PlanError(
            f"cluster.gpu_memory_gb={cl.gpu_memory_gb}: set the memory of one GPU (H20: 96, H200: 141)"
        )
    cap = cl.gpu_memory_gb * GB
    if cfg.engine.kind != "vllm":
        notes.append(
            f"engine.kind={cfg.engine.kind}: the policy is sized as the vLLM replicas the placement names"
        )

    # the stage's frozen models: (role, replicas, TP, what), each checked against the node size
    if opd:
        if pl.teacher_replicas < 1:
            raise PlanError("cluster.placement.teacher_replicas=0: OPD scores every rollout with the teacher")
        _check_tp(
            cfg.teacher_engine.tensor_parallel_size,
            "teacher_engine.tensor_parallel_size",
            load_arch(cfg.teacher.preset, "teacher.preset"),
            cl.num_gpus_per_node,
        )
        frozen = [
            (
                "teacher",
                pl.teacher_replicas,
                cfg.teacher_engine.tensor_parallel_size,
                "vLLM, top-k log-probs of every sampled segment",
            )
        ]
    else:
        frozen = []
        for role in ("reader", "judge"):
            srv = getattr(pl, role)
            if srv.replicas:
                _check_tp(
                    srv.tensor_parallel_size,
                    f"cluster.placement.{role}.tensor_parallel_size",
                    load_arch(srv.model_preset, f"cluster.placement.{role}.model_preset"),
                    cl.num_gpus_per_node,
                )
                frozen.append((role, srv.replicas, srv.tensor_parallel_size, "vLLM OpenAI server, frozen"))
            else:
                notes.append(f"the {role} is not on this cluster: reward.{role}.base_url serves it")
        if cfg.reward.judge_kind == "exact_match" and pl.judge.replicas:
            notes.append("reward.judge_kind=exact_match: the judge replicas are never called")
    pools = _layout(cfg, a, frozen)
    total_gpus = cl.num_nodes * cl.num_gpus_per_node
    idle = total_gpus - sum(p.num_gpus for p in pools)
    if idle:
        notes.append(f"{idle} GPUs idle (GPUs {total_gpus - idle}-{total_gpus - 1})")

    # the batch over the trainer ranks: every rank gets the same share of each optimizer update
    ranks = pools[0].num_gpus
    if rollouts % tr.num_mini_batches or (rollouts // tr.num_mini_batches) % ranks:
        raise PlanError(
            f"the global batch does not divide over the trainer ranks: {batch} = {rollouts} rollouts / "
            f"trainer.num_mini_batches {tr.num_mini_batches} over {ranks} ranks "
            "(cluster.placement.train_gpus); "
            "every rank must get the same number of rollouts"
        )
    per_update = rollouts // tr.num_mini_batches
    policy = pools[0] if pl.mode == "colocated" else pools[1]
    per_replica = in_flight / policy.replicas

    # memory: the packed row is the trainer's unit; a row holds one whole call at the gateway's budgets
    call = cfg.gateway.max_prompt_tokens + cfg.gateway.max_response_tokens or cfg.engine.max_model_len
    tokens = max(tr.packing.num_tokens_per_micro_batch, call)
    colocated = pl.mode == "colocated"
    asleep = [Term("policy engine asleep", "vLLM sleep mode: CUDA context only", ENGINE_ASLEEP_GB * GB)]
    train = _train_memory(cfg, a, ranks, cap, tokens, asleep if colocated else [])
    resident = sum(t.bytes for t in train.terms if t.name in ("params", "grads", "fp32 master", "Adam m, v"))
    states = [
        Term(
            "trainer states",
            "ZeRO-3 shards (params, grads, master, Adam) + trainer runtime, resident while the engine runs",
            resident + TRAIN_RUNTIME_GB * GB,
        )
    ]
    memory, engines = [train], []
    m, e = _engine_memory(
        "policy",
        a,
        cfg.engine.tensor_parallel_size,
        cfg.engine.gpu_memory_utilization,
        cfg.engine.max_model_len,
        cfg.model.dtype,
        "llm",
        cap,
        per_replica,
        extra=states if colocated else None,
        key="engine",
    )
    memory.append(m), engines.append(e)
    if opd:
        te = cfg.teacher_engine
        m, e = _engine_memory(
            "teacher",
            load_arch(cfg.teacher.preset, "teacher.preset"),
            te.tensor_parallel_size,
            te.gpu_memory_utilization,
            te.max_model_len,
            cfg.teacher.dtype,
            "llm",
            cap,
            0,
            prompt_logprobs=True,
            key="teacher_engine",
        )
        memory.append(m), engines.append(e)
    else:
        for role, _, _, _ in frozen:
            srv = getattr(pl, role)
            m, e = _engine_memory(
                role,
                load_arch(srv.model_preset, f"cluster.placement.{role}.model_preset"),
                srv.tensor_parallel_size,
                srv.gpu_memory_utilization,
                srv.max_model_len,
                "bfloat16",
                "server",
                cap,
                0,
                key=f"cluster.placement.{role}",
            )
            memory.append(m), engines.append(e)
    for mem in memory:
        if mem.total > cap:
            raise PlanError(
                f"too little memory on a {mem.role} GPU: {_gb(mem.total)} GB estimated > "
                f"cluster.gpu_memory_gb {cl.gpu_memory_gb:g} ("
                + ", ".join(f"{t.name} {_gb(t.bytes)}" for t in mem.terms)
                + ")"
            )
    for eng in engines:
        if eng.seqs_assigned > eng.seqs_fit:
            notes.append(
                f"{eng.role}: {eng.seqs_assigned:g} sequences in flight per replica, its KV cache holds "
                f"{eng.seqs_fit} at max_model_len {eng.max_model_len}: vLLM queues the rest (shorter calls "
                "fit more)"
            )
    return Plan(
        **base,
        pools=tuple(pools),
        train_ranks=ranks,
        rollouts_per_update=per_update,
        seqs_per_policy_replica=per_replica,
        memory=tuple(memory),
        engines=tuple(engines),
        notes=tuple(notes),
    )


def format_plan(p: Plan) -> str:
    gpn = p.gpus_per_node
    out = [
        f"plan: {p.run_name} (stage {p.stage}) on {p.num_nodes} node(s) x {gpn} GPUs"
        + (f" x {p.gpu_memory_gb:g} GB, placement {p.mode}" if gpn else " (CPU only)"),
        f"model {p.model.preset}: {_b(p.model.total_params)} parameters, "
        f"{_b(p.model.active_params)} active per token",
        "",
        "Placement",
    ]
    if p.pools:
        out.append(f"  {'role':<13} {'GPUs':<9} {'nodes':<7} {'ranks / replicas x TP':<22} process")
        for pool in p.pools:
            reps = f"{pool.replicas} x {pool.tp}"
            if pool.role.startswith("train"):
                reps = f"{pool.num_gpus} ranks" + (f"; {reps}" if pool.role != "train" else "")
            gpus = f"{pool.first_gpu}-{pool.first_gpu + pool.num_gpus - 1}"
            out.append(f"  {pool.role:<13} {gpus:<9} {pool.nodes(gpn):<7} {reps:<22} {pool.what}")
    out.append(
        f"  driver: node 0's CPUs (step loop, scheduler, gateway, lineage); Ray CPU reservations "
        f"(rollout workers, engine replica actors, reward actors): {p.ray_cpus:g}"
    )
    out += [
        "",
        "Batch",
        f"  rollouts per step: {p.batch} = {p.rollouts_per_step}",
        f"  per optimizer update: {p.rollouts_per_update} over {p.train_ranks} trainer ranks = "
        f"{p.rollouts_per_update / p.train_ranks:g} per rank",
        f"  in flight: min(rollout.num_workers x rollouts_per_worker, {p.rollouts_per_step}) = {p.in_flight}; per policy replica: "
        f"{p.seqs_per_policy_replica:g}",
    ]
    if p.memory:
        out += ["", "Memory per GPU (GB = 1e9 bytes)"]
        for m in p.memory:
            out.append(f"  {m.title}")
            for t in m.terms:
                out.append(f"    {t.name:<22} {_gb(t.bytes):>7}  {t.formula}")
            out.append(
                f"    {'total':<22} {_gb(m.total):>7}  of {m.capacity / GB:g} ({m.total / m.capacity:.0%})"
            )
            out += [f"    {d}" for d in m.derived]
    if p.notes:
        out += ["", "Notes"] + [f"  - {n}" for n in p.notes]
    return "\n".join(out)


def _primary_from_exp(argv: list[str]) -> list[str]:
    """`+exp=NAME` without --config-name: the stage the experiment names on its '# primaries:' line."""
    if any(a in ("--config-name", "-cn") or a.startswith("--config-name=") for a in argv):
        return argv
    for a in argv:
        if m := re.fullmatch(r"\+exp=(\w+)", a):
            path = Path(CONFIG_DIR, "exp", f"{m.group(1)}.yaml")
            names = re.search(r"^# primaries: (.+)$", path.read_text(), re.M) if path.exists() else None
            stages = [s for s in (names.group(1).split() if names else []) if s in ("opd", "rl")]
            if len(stages) == 1:
                return ["--config-name", stages[0], *argv]
    return argv


@hydra.main(config_path=CONFIG_DIR, config_name="opd", version_base=None)
def main(dcfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    schema = {"opd": OpdConfig, "rl": RlConfig}.get(HydraConfig.get().job.config_name)
    if schema is None:
        raise SystemExit("plan: --config-name must be opd or rl")
    try:
        print(format_plan(make_plan(to_typed(dcfg, schema))))
    except ValueError as e:  # PlanError, or a config that does not validate: the reason, no traceback
        raise SystemExit(f"plan refused: {e}") from None


if __name__ == "__main__":
    # a preflight leaves nothing behind: no run directory, no .hydra/, no log file
    sys.argv = [sys.argv[0], *_primary_from_exp(sys.argv[1:])]
    sys.argv += [
        "hydra.run.dir=.",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]
    main()
