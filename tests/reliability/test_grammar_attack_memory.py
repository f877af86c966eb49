"""The grammar-compile attack leaves the replica's memory where it was: two distinct JSON schemas of 4,676
one-character optional properties (32,764 characters, under the 32 KiB cap; far over the compile bound each) sent at
once are refused at the compile bound, their compile processes killed, and the replica's RSS after is within 10%
of its RSS after warm-up. Figures are printed as one JSON line."""

import concurrent.futures
import json

import psutil
import pytest
import requests

from runtime.engine.async_engine import GRAMMAR_TIMEOUT_S

pytestmark = pytest.mark.reliability
PROPERTIES = 4676


def _schema(first: int) -> str:
    """A compact schema of PROPERTIES optional properties named by one CJK character each, from `first`."""
    properties = {chr(first + i): {} for i in range(PROPERTIES)}
    return json.dumps({"type": "object", "properties": properties}, ensure_ascii=False, separators=(",", ":"))


def _chat(base_url: str, schema: str) -> requests.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "guided_json": schema}
    return requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=GRAMMAR_TIMEOUT_S * 4)


def _compile_processes(replica: psutil.Process) -> set[int]:
    return {p.pid for p in replica.children() if "grammar_process" in " ".join(p.cmdline())}


def _rss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.NoSuchProcess:  # killed at its bound
        return 0


def test_the_replica_returns_to_its_memory_after_the_grammar_compile_attack(server):
    attack = [_schema(0x4E00), _schema(0x4E00 + PROPERTIES)]
    assert [len(schema) for schema in attack] == [32_764, 32_764] and attack[0] != attack[1]
    warm = _chat(server.base_url, json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert warm.status_code == 200, warm.text  # a grammar compiled in both places: the replica's paths are warm
    replica = psutil.Process(server.engine_stats()["pid"])
    compiling = _compile_processes(replica)
    start = replica.memory_info().rss
    peak = 0  # the compile processes' memory while they ran: what the attack would have left in the replica
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(_chat, server.base_url, schema) for schema in attack]
        while concurrent.futures.wait(sent, timeout=0.5).not_done:
            peak = max(peak, sum(_rss(pid) for pid in compiling))
        replies = [future.result() for future in sent]
    after = replica.memory_info().rss
    for reply in replies:
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "guided_json", reply.text
        assert f"did not compile within {GRAMMAR_TIMEOUT_S:g} s" in reply.json()["error"]["message"]
    assert len(compiling) == 2 and not compiling & _compile_processes(replica)  # both killed (and replaced)
    print(json.dumps({"reliability": "grammar_attack_memory", "schema_chars": len(attack[0]),
                      "replica_rss_start_mb": round(start / 2**20, 1), "replica_rss_after_mb": round(after / 2**20, 1),
                      "change": round(after / start - 1, 4), "compile_processes_peak_mb": round(peak / 2**20, 1)}))
    assert abs(after - start) <= start // 10
