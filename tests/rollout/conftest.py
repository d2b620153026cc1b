import json
import re

import pytest

from data_pipeline.build import build, load_config
from data_pipeline.store import BuiltDataset
from harnesses.registry import HarnessConfig
from hymem_train.engines.scripted import ScriptedEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.models.tokenizer import default_tokenizer


@pytest.fixture(scope="session")
def synth_ds(tmp_path_factory) -> BuiltDataset:
    """2 sequences x 4 chunks, windows of 2 chunks (synthetic: gold known by construction)."""
    out = tmp_path_factory.mktemp("synth")
    cfg = load_config(
        [
            f"out_dir={out}",
            "data.synthetic.num_sequences=2",
            "data.synthetic.num_chunks_per_sequence=4",
            "data.synthetic.num_chunks_per_window=2",
            "data.profiles.hy_memory.num_chunks_per_window=2",
        ]
    )
    outs, _ = build(cfg)
    return BuiltDataset(outs["hy_memory"])


def store_first_fact(prompt: str) -> str:
    """A well-behaved scripted writer: ADD every 'Alice:' line of the new conversation."""
    new = prompt.split("New conversation:")[-1]
    facts = re.findall(r"user: Alice: ([^\n<]+)", new)
    return json.dumps({"ops": [{"op": "ADD", "text": f} for f in facts] or [{"op": "NONE"}]})


@pytest.fixture()
def scripted_gateway():
    tok = default_tokenizer()
    gw = Gateway(ScriptedEngine(tok, store_first_fact), tok, GatewayConfig(embeddings=False))
    with GatewayServer(gw) as srv:
        yield srv


@pytest.fixture()
def native_cfgs():
    return {"native": HarnessConfig(framework="native", in_process=True)}
