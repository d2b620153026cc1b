"""vLLM engine on a GPU machine (marker `gpu`; skipped on CPU boxes and when vLLM is absent).

Saves a tiny HYV3 + the shipped tokenizer as a local checkpoint and checks the same contract the HF
engine meets: token ids out, one raw logprob per token, routes [P+R, L, K] with a NOT_ROUTED last row,
teacher top-k per position, bucketed weight updates.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from hymem_train.models import build_model
    from hymem_train.models.tokenizer import default_tokenizer

    d = tmp_path_factory.mktemp("tiny_ckpt")
    build_model("tiny", seed=0).save_pretrained(d)
    default_tokenizer().save_pretrained(d)
    return d


def test_vllm_generate_routes_topk_and_weight_sync(ckpt):
    pytest.importorskip("vllm")
    from hymem_train.engines.base import SamplingParams
    from hymem_train.engines.vllm_engine import VLLMEngine
    from hymem_train.models import NOT_ROUTED, build_model
    from hymem_train.models.tokenizer import default_tokenizer

    tok = default_tokenizer()
    eng = VLLMEngine(
        str(ckpt), [tok.eos_token_id], max_model_len=512, gpu_memory_utilization=0.3, dtype="float32"
    )
    prompt = tok.encode("Alice's dog is named Rex.")
    (out,) = eng.generate([prompt], [SamplingParams(max_tokens=8, temperature=0)])
    assert len(out.logprobs) == len(out.response_ids) > 0
    r = out.routed_experts_TLE
    assert r.shape == (len(prompt) + len(out.response_ids), 2, 2)
    assert (r[-1] == NOT_ROUTED).all() and (r[:-1] >= 0).all()
    (tk,) = eng.topk_logprobs([prompt + out.response_ids], k=5)
    assert tk.ids_TK.shape == (len(prompt) + len(out.response_ids), 5)
    assert np.all(np.diff(tk.logprobs_TK.numpy(), axis=1) <= 1e-6)  # sorted best-first
    other = build_model("tiny", seed=1)
    named = list(other.state_dict().items())
    eng.update_weights(named, version=1)
    assert eng.policy_version == 1
