"""The gateway with a real `openai` client, a real HF engine on a tiny HYV3 and the real MiniLM."""

import concurrent.futures as cf
import json
import socket
import time

import httpx
import numpy as np
import openai
import pytest
import torch

from hymem_train.engines.hf import HFEngine
from hymem_train.gateway import Gateway, GatewayConfig, GatewayServer
from hymem_train.gateway.client import GatewayAdmin
from hymem_train.gateway.runner import KEEP_ALIVE_S
from hymem_train.models import build_model
from hymem_train.models.tokenizer import default_tokenizer

MSG = [{"role": "system", "content": "You store memories."}, {"role": "user", "content": "My dog is Rex."}]


@pytest.fixture(scope="module")
def server():
    torch.manual_seed(0)
    tok = default_tokenizer()
    engine = HFEngine(build_model("tiny", seed=0), [tok.eos_token_id], tok.pad_token_id, max_model_len=200)
    gw = Gateway(engine, tok, GatewayConfig(batch_wait_ms=20))
    with GatewayServer(gw) as srv:
        yield srv


@pytest.fixture()
def gw(server):
    return server.gateway


def _client(server, cred):
    return openai.OpenAI(base_url=server.base_url, api_key=cred, max_retries=0)


_n = iter(range(10_000))


def _traj(gw, chunk=0):
    tid = f"traj-{next(_n)}"
    cred = gw.register(tid, f"bank-{tid}")
    if chunk is not None:
        gw.set_chunk(tid, chunk)
    return tid, cred


def test_openai_client_roundtrip_is_token_exact(server, gw):
    tid, cred = _traj(gw, chunk=2)
    r = _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=24, seed=5)
    text = r.choices[0].message.content
    (seg,) = gw.store.get(tid)
    tok = gw.tok
    # exact ids in: the chat template of the messages, as the engine saw them
    assert seg.prompt_ids == tok.apply_chat_template(
        MSG, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = seg.response_ids[:-1] if seg.finish_reason == "stop" else seg.response_ids
    assert tok.decode(ids, skip_special_tokens=False) == text  # exact ids out decode to what the client got
    assert (
        r.usage.completion_tokens == len(seg.response_ids) and r.choices[0].finish_reason == seg.finish_reason
    )
    assert (seg.chunk_index, seg.call_index, seg.bank_id) == (2, 0, f"bank-{tid}")
    assert len(seg.logprobs) == len(seg.response_ids) and all(lp <= 0 for lp in seg.logprobs)
    assert seg.routed_experts_TLK.shape == (seg.num_tokens, 2, 2)
    # a second call in the same chunk gets the next call index; a new chunk restarts at 0
    _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=4)
    gw.set_chunk(tid, 3)
    _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=4)
    assert [(s.chunk_index, s.call_index) for s in gw.store.get(tid)] == [(2, 0), (2, 1), (3, 0)]


def test_concurrent_clients_are_batched_and_kept_apart(server, gw):
    trajs = [_traj(gw) for _ in range(8)]

    def call(i):
        tid, cred = trajs[i]
        msgs = [{"role": "user", "content": f"Request number {i}: my favourite colour is blue."}]
        r = _client(server, cred).chat.completions.create(
            model="policy", messages=msgs, max_tokens=16, seed=i
        )
        return tid, msgs, r.choices[0].message.content

    before = len(gw.batcher.batch_sizes)
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(call, range(8)))
    assert max(gw.batcher.batch_sizes[before:]) > 1  # requests shared forwards
    for tid, msgs, text in results:
        (seg,) = gw.store.get(tid)
        assert gw.tok.decode(seg.prompt_ids).endswith(
            msgs[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
        )
        ids = seg.response_ids[:-1] if seg.finish_reason == "stop" else seg.response_ids
        assert gw.tok.decode(ids) == text


def test_embeddings_from_local_minilm(server, gw):
    _, cred = _traj(gw, chunk=None)  # embeddings need identity, not a chunk
    e = _client(server, cred).embeddings.create(
        model="all-MiniLM-L6-v2", input=["Alice's dog is Rex", "dog named Rex"]
    )
    a, b = (np.array(d.embedding) for d in e.data)
    assert a.shape == (384,) and abs(np.linalg.norm(a) - 1) < 1e-4
    far = np.array(
        _client(server, cred).embeddings.create(model="all-MiniLM-L6-v2", input="tax law").data[0].embedding
    )
    assert a @ b > a @ far


def _post(server, path, body, cred=None, headers=None, raw=None):
    h = {"content-type": "application/json", **(headers or {})}
    if cred:
        h["authorization"] = f"Bearer {cred}"
    return httpx.post(
        server.url + path, content=raw if raw is not None else json.dumps(body), headers=h, timeout=30
    )


BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    "case,status,code",
    [
        ("malformed_json", 400, "malformed_json"),
        ("unknown_model", 404, "model_not_found"),
        ("too_long", 400, "context_length_exceeded"),
        ("missing_credential", 401, "invalid_api_key"),
        ("unknown_credential", 401, "invalid_api_key"),
        ("other_trajectory_in_path", 403, "identity_mismatch"),
        ("other_bank_in_header", 403, "identity_mismatch"),
        ("no_chunk", 409, "no_chunk_index"),
        ("other_chunk_in_header", 403, "identity_mismatch"),
        ("stream", 400, "unsupported_stream"),
        ("n2", 400, "unsupported_n"),
        ("stop", 400, "unsupported_stop"),
        ("bad_temperature", 400, "invalid_sampling"),
        ("unknown_field", 400, "unsupported_field"),
        ("empty_messages", 400, "invalid_messages"),
    ],
)
def test_bad_requests_get_clear_errors_and_record_nothing(server, gw, case, status, code):
    tid, cred = _traj(gw, chunk=None if case == "no_chunk" else 0)
    other_tid, _ = _traj(gw)
    n_before = len(gw.store)
    body, path, headers, raw = dict(BODY), "/v1/chat/completions", {}, None
    if case == "malformed_json":
        raw = b'{"model": "policy", "messages": ['
    elif case == "unknown_model":
        body["model"] = "gpt-4o"
    elif case == "too_long":
        body["messages"] = [{"role": "user", "content": "word " * 400}]
    elif case == "missing_credential":
        cred = None
    elif case == "unknown_credential":
        cred = "hm-not-a-key"
    elif case == "other_trajectory_in_path":
        path = f"/t/{other_tid}/v1/chat/completions"
    elif case == "other_bank_in_header":
        headers = {"x-hymem-bank": f"bank-{other_tid}"}
    elif case == "other_chunk_in_header":
        headers = {"x-hymem-chunk-index": "7"}
    elif case == "stream":
        body["stream"] = True
    elif case == "n2":
        body["n"] = 2
    elif case == "stop":
        body["stop"] = ["\n"]
    elif case == "bad_temperature":
        body["temperature"] = -1
    elif case == "unknown_field":
        body["functions"] = []
    elif case == "empty_messages":
        body["messages"] = []
    r = _post(server, path, body, cred, headers, raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert len(gw.store) == n_before and gw.store.get(tid) == []


def test_rejections_are_counted(server, gw):
    m0 = gw.metrics()
    _post(server, "/v1/chat/completions", BODY, "hm-nope")
    tid, cred = _traj(gw)
    other, _ = _traj(gw)
    _post(server, f"/t/{other}/v1/chat/completions", BODY, cred)
    m1 = gw.metrics()
    assert m1["gateway/rejected_unknown"] == m0["gateway/rejected_unknown"] + 1
    assert m1["gateway/rejected_mismatch"] == m0["gateway/rejected_mismatch"] + 1


def test_scoped_path_with_own_identity_works(server, gw):
    tid, cred = _traj(gw, chunk=5)
    c = openai.OpenAI(base_url=f"{server.url}/t/{tid}/v1", api_key=cred, max_retries=0)
    c.chat.completions.create(model="policy", messages=MSG, max_tokens=3)
    c.chat.completions.create(
        model="policy", messages=MSG, max_tokens=3, extra_headers={"X-Hymem-Chunk-Index": "5"}
    )
    assert [s.chunk_index for s in gw.store.get(tid)] == [5, 5]


def test_admin_endpoints_over_http(server, gw):
    adm = {"x-admin-token": gw.admin_token}
    assert _post(server, "/admin/trajectories", {"trajectory_id": "h1", "bank_id": "b1"}).status_code == 401
    cred = _post(server, "/admin/trajectories", {"trajectory_id": "h1", "bank_id": "b1"}, headers=adm).json()[
        "credential"
    ]
    assert (
        _post(
            server, "/admin/trajectories", {"trajectory_id": "h1", "bank_id": "b1"}, headers=adm
        ).status_code
        == 409
    )
    assert _post(server, "/admin/trajectories/h1/chunk", {"chunk_index": 4}, headers=adm).status_code == 200
    _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=3)
    segs = httpx.get(f"{server.url}/admin/segments/h1?drain=true", headers=adm).json()["segments"]
    assert len(segs) == 1 and segs[0]["chunk_index"] == 4 and segs[0]["trajectory_id"] == "h1"
    assert gw.store.get("h1") == []
    assert httpx.delete(f"{server.url}/admin/trajectories/h1", headers=adm).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=3)
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"] == "policy"


def test_unseeded_calls_are_reproducible_per_trajectory_chunk_and_call(server, gw):
    """A resumed run re-samples what the killed run sampled: the seed comes from (run, trajectory, chunk, call)."""

    def sample(tid):
        cred = gw.register(tid, "bank")
        gw.set_chunk(tid, 1)
        c = _client(server, cred)
        texts = [
            c.chat.completions.create(model="policy", messages=MSG, max_tokens=12).choices[0].message.content
            for _ in range(2)
        ]
        gw.registry.unregister(tid)
        gw.store.drain(tid)
        return texts

    a, b = sample("replay-a"), sample("replay-a")
    assert a == b and a[0] != a[1]  # same trajectory/chunk/call -> same sample; the next call differs
    assert sample("replay-b") != a


def test_idle_connections_outlive_the_clients_keep_alive(server, gw):
    """The server keeps an idle connection longer than httpx / the openai SDK keep theirs (5 s), so a
    client never sends on a connection the server is closing. With uvicorn's 5 s default, the demo's
    RL died on "Server disconnected without sending a response" after a 5 s idle (session 6)."""
    assert httpx.Limits().keepalive_expiry < KEEP_ALIVE_S
    req = f"GET /health HTTP/1.1\r\nHost: {server.host}\r\n\r\n".encode()

    def response(s) -> bytes:  # one whole HTTP/1.1 response (headers, then content-length bytes)
        buf = b""
        while b"\r\n\r\n" not in buf:
            part = s.recv(4096)
            assert part, "the server closed the idle connection"
            buf += part
        head, body = buf.split(b"\r\n\r\n", 1)
        n = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(body) < n:
            body += s.recv(4096)
        return head

    with socket.create_connection((server.host, server.port), timeout=5) as s:
        s.sendall(req)
        assert response(s).startswith(b"HTTP/1.1 200")
        time.sleep(6.0)  # idle past the old 5 s: the server must still hold the connection open
        s.sendall(req)
        assert response(s).startswith(b"HTTP/1.1 200")
    # the admin channel reuses no connection at all (its calls cannot be blindly retried)
    admin = GatewayAdmin(server.url, gw.admin_token)
    admin.register("keepalive-probe", bank_id="b")
    admin.unregister("keepalive-probe")
    assert admin._http._transport._pool.connections == []
    admin.close()


def test_forget_drops_a_lost_trajectorys_identity_and_segments(server, gw):
    """A rollout whose worker died (rollout/pool.py): its recorded calls must not linger to be drained by
    anyone, and its credential must stop working."""
    tid, cred = _traj(gw)
    _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=4)
    keep, keep_cred = _traj(gw)
    _client(server, keep_cred).chat.completions.create(model="policy", messages=MSG, max_tokens=4)
    assert gw.forget(tid) == 1
    assert gw.store.get(tid) == [] and len(gw.store.get(keep)) == 1  # only the lost trajectory's
    with pytest.raises(openai.AuthenticationError):
        _client(server, cred).chat.completions.create(model="policy", messages=MSG, max_tokens=4)
