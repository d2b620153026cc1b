"""The stages' held-out evaluations, on the first window of every held-out sequence from an empty bank
(nothing is promoted): OPD's full-vocabulary reverse KL, RL's mean per-chunk reward terms.

Legend: T positions of a segment's prompt + response, V vocabulary, P prompt, R response tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np


def opd_reverse_kl(
    collector, dataset, harness: str, student, teacher, step: int, vocab_size: int
) -> dict[str, float]:
    """Reverse KL(student || teacher) over the full vocabulary (`vocab_size`, the model config's: an
    engine may be a pool of remote replicas) at the student's sampled positions; with an engine that
    cannot return a whole vocabulary (vLLM), the sampled estimate `eval/reverse_kl_sampled`."""
    groups = collector.collect_heldout(dataset, harness, 1, step)
    segs = [s for g in groups for r in g.results for s in r.segments]
    if not segs:
        return {}
    ids = [s.input_ids for s in segs]
    if not all(getattr(e, "full_vocab_logprobs", True) for e in (student, teacher)):
        return sampled_reverse_kl(segs, teacher.token_logprobs(ids))
    V = vocab_size
    kls = []
    for s, st, tt in zip(segs, student.topk_logprobs(ids, V), teacher.topk_logprobs(ids, V), strict=True):
        P, R = len(s.prompt_ids), len(s.response_ids)
        # top-V answers sorted by token id: column v is token v (position P-1+j predicts response token j)
        ls_TV = np.take_along_axis(st.logprobs_TK.numpy(), np.argsort(st.ids_TK.numpy(), 1), 1)[
            P - 1 : P + R - 1
        ]
        lt_TV = np.take_along_axis(tt.logprobs_TK.numpy(), np.argsort(tt.ids_TK.numpy(), 1), 1)[
            P - 1 : P + R - 1
        ]
        kls.append((np.exp(ls_TV) * (ls_TV - lt_TV)).sum(-1))
    kl = np.concatenate(kls)
    return {"eval/reverse_kl": float(kl.mean()), "eval/num_positions": float(kl.size)}


def sampled_reverse_kl(segs: list[Any], teacher_token_lps: list[np.ndarray]) -> dict[str, float]:
    """Reverse KL(student || teacher) estimated at the student's own samples: the mean over sampled
    response tokens y of log pi_s(y) - log pi_t(y), unbiased because the harnesses sample at
    temperature 1 with no top-p (configs/harness). For engines that cannot return a whole vocabulary
    (vLLM); logged under its own name, since its per-step noise differs from the exact sum."""
    diffs = []
    for s, lt in zip(segs, teacher_token_lps, strict=True):
        P, R = len(s.prompt_ids), len(s.response_ids)
        diffs.append(np.asarray(s.logprobs, np.float32) - lt[P - 1 : P + R - 1])
    d = np.concatenate(diffs)
    return {"eval/reverse_kl_sampled": float(d.mean()), "eval/num_positions": float(d.size)}


def rl_chunk_reward(
    collector, dataset, harness: str, reward: Any, num_rollouts: int, step: int, scoring: Any = None
) -> dict[str, float]:
    """Mean per-chunk reward terms (prm, orm, pen, s) over the valid cells of `num_rollouts`
    rollouts per first window, scored with `scoring` (the stage passes the report's protocol, so an
    ablation of the training reward does not change its own yardstick)."""
    groups = collector.collect_heldout(dataset, harness, num_rollouts, step)
    scored = reward.score_groups([g.reward_group(dataset) for g in groups], scoring)
    vals: dict[str, list[float]] = defaultdict(list)
    for g in scored:
        s = g.scores
        valid = np.asarray(s.valid_GC, dtype=bool)
        for name in ("prm", "orm", "pen", "s"):
            vals[name] += list(np.asarray(getattr(s, f"{name}_GC"), dtype=float)[valid])
    return {f"eval/{k}": float(np.mean(v)) for k, v in vals.items() if v}
