"""Fork cost per harness: 8 forks of a 1,000-entry bank, and read_all on it.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_harness_fork.py [--frameworks native mem0] [--entries 1000]

The bank is written through each harness's real write path (scripted policy replies from the
stand-in OpenAI server `tests.doubles.openai_server.StandInServer`, a test double this benchmark
reuses; 100 entries per chunk). Baseline measured in the same run: a plain
`shutil.copytree` of the same bank 8 times; the ratio says what fork adds on top of a file copy.
Frameworks whose venv is missing are reported and skipped. Aim: 8 forks in under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harnesses.base import ConfigurationError, Endpoint  # noqa: E402
from harnesses.registry import HarnessConfig, make_harness  # noqa: E402
from tests.doubles.openai_server import StandInServer  # noqa: E402

NUM_FORKS = 8
PER_CHUNK = 100


def _replies(framework: str, start: int) -> str:
    facts = [
        f"Fact {i}: the user mentioned item {i} on day {i % 31}" for i in range(start, start + PER_CHUNK)
    ]
    if framework == "mem0":
        return json.dumps({"memory": [{"id": str(j), "text": t} for j, t in enumerate(facts)]})
    if framework == "hy_memory":
        body = {
            "memory": [{"content": t, "tags": [], "owner": "user"} for t in facts],
            "intentions": [],
            "basic_info": {},
        }
        return "```json\n" + json.dumps(body) + "\n```"
    if framework == "memoryos":
        items = [
            {"key": f"k{j}", "memory_type": "UserMemory", "value": t, "tags": []} for j, t in enumerate(facts)
        ]
        return json.dumps({"memory list": items, "summary": ""})
    return json.dumps({"ops": [{"op": "ADD", "text": t} for t in facts]})


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def bench(framework: str, num_entries: int, work: Path) -> dict | None:
    counter = {"i": 0}

    def reply(body):
        system = body["messages"][0]["content"] if body["messages"] else ""
        if framework == "hy_memory" and "Memory Extractor" not in system:
            return "{}"  # hy-memory's reconcile calls: no decision, the framework keeps its default
        r = _replies(framework, counter["i"])
        counter["i"] += PER_CHUNK
        return r

    with StandInServer(reply) as srv:
        llm = Endpoint(srv.base_url, "bench", "policy", timeout_s=120)
        try:
            scene = {"hy_memory": "chat", "memoryos": "general_text"}.get(framework, "default")
            cfg = HarnessConfig(framework=framework, scene=scene, num_retries=0, rpc_timeout_s=1800)
            h = make_harness(cfg, llm, llm, sandbox_root=work, sandbox_id="bench")
        except ConfigurationError as e:
            print(f"{framework:10s} skipped: {e}")
            return None
        try:
            bank = work / "parent"
            h.open(bank, create=True)
            t0 = time.perf_counter()
            for c in range(num_entries // PER_CHUNK):
                res = h.write_chunk([{"role": "user", "content": f"chunk {c}"}], f"s{c}", "2024-01-01")
                assert res.ok, res
            t_write = time.perf_counter() - t0
            num_stored = h.count()  # hy-memory may merge near-duplicates; report what is really there
            t0 = time.perf_counter()
            entries = h.read_all()  # raises unless it equals count()
            t_read = time.perf_counter() - t0
            h.close()
            size = _dir_bytes(bank)
            t0 = time.perf_counter()
            for i in range(NUM_FORKS):
                shutil.copytree(bank, work / f"copy{i}")
            t_copy = time.perf_counter() - t0
            t0 = time.perf_counter()
            h.fork(bank, [work / f"fork{i}" for i in range(NUM_FORKS)])
            t_fork = time.perf_counter() - t0
            h.open(work / "fork3")
            assert h.count() == num_stored and len(entries) == num_stored
            h.close()
        finally:
            shutdown = getattr(h, "shutdown", None)
            if shutdown:
                shutdown()
    return {
        "framework": framework,
        "entries": num_stored,
        "bank_bytes": size,
        "write_s": t_write,
        "read_all_s": t_read,
        "copytree_x8_s": t_copy,
        "fork_x8_s": t_fork,
        "fork_vs_copytree": t_fork / t_copy if t_copy > 0 else float("nan"),
        "under_2s": t_fork < 2.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", nargs="+", default=["native", "mem0", "hy_memory", "memoryos"])
    ap.add_argument("--entries", type=int, default=1000)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for fw in args.frameworks:
        with tempfile.TemporaryDirectory(prefix=f"bench-fork-{fw}-") as d:
            row = bench(fw, args.entries, Path(d))
        if row:
            rows.append(row)
            print(
                f"{fw:10s} entries={row['entries']} bank_bytes={row['bank_bytes']:,} write={row['write_s']:.2f}s "
                f"read_all={row['read_all_s'] * 1000:.0f}ms copytree_x8={row['copytree_x8_s']:.3f}s "
                f"fork_x8={row['fork_x8_s']:.3f}s ratio_fork/copytree={row['fork_vs_copytree']:.2f} "
                f"under_2s={row['under_2s']}"
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
