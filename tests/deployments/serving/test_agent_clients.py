"""Coding agents as their users run them, against the served app: Claude Code (`claude -p --output-format
stream-json`) over /v1/messages, and Codex CLI (`codex exec --json`, streaming Responses with its namespace and
web_search tools) over /v1/responses, installed from npm by the test setup; and Claude Code recovering by itself
from a context that its prompt plus its 32,000 output tokens overflows. Each is given only the base URL, a key
and the model name.

The model is tiny and random, built to end its answers within a few tokens (testing.model_factory's
end_answers_early), so a turn asked for tens of thousands of tokens completes on a CPU; what is judged is the
protocol, not the text."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testing.model_factory import build_model_dir, end_answers_early
from tests.conftest import MODEL_ID, another_app, app_args

CLIENTS = {"@anthropic-ai/claude-code": "2.1.332", "@openai/codex": "0.169.0"}
CONTEXT = 131072  # above any agent's prompt plus its 32,000-token answer
TURN_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def agents_bin() -> Path:
    """The agents' executables, installed once per machine from npm; skipped only where npm cannot be reached."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the agents cannot be installed")
    prefix = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rayllm-engine-tests" / "agents"
    bin_dir = prefix / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in ("claude", "codex")):
        ping = subprocess.run([npm, "ping"], capture_output=True, text=True, timeout=120)
        if ping.returncode != 0:
            pytest.skip(f"the npm registry is unreachable: {ping.stderr.strip()[-300:]}")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                        *(f"{name}@{version}" for name, version in CLIENTS.items())],
                       check=True, capture_output=True, timeout=900)
    return bin_dir


def serve_agent_model(server, tmp_path_factory, name: str, max_model_len: int):
    model_dir = build_model_dir(tmp_path_factory.mktemp(name), "qwen2", max_positions=CONTEXT)
    end_answers_early(model_dir, stop_logit=0.5)
    args = app_args(model_dir, f"file://{tmp_path_factory.mktemp(name + '-storage')}")
    args["llm_configs"][0]["engine_kwargs"] = {"max_model_len": max_model_len, "kv_cache_bytes": 256 << 20}
    return another_app(server, name, args)


@pytest.fixture(scope="module")
def agent_app(server, tmp_path_factory):
    with serve_agent_model(server, tmp_path_factory, "agents", CONTEXT) as url:
        yield url


def claude(bin_dir: Path, base_url: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": base_url,
           "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_MODEL": MODEL_ID}
    return subprocess.run([str(bin_dir / "claude"), "-p", "say hi", *args], env=env, capture_output=True,
                          text=True, timeout=TURN_TIMEOUT_S, cwd=home)


def codex(bin_dir: Path, base_url: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
           "LOCAL_API_KEY": "sk-test"}
    (home / ".codex").mkdir(exist_ok=True)
    provider = f'{{name="local", base_url="{base_url}/v1", env_key="LOCAL_API_KEY", wire_api="responses"}}'
    return subprocess.run([str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "-m", MODEL_ID,
                           "-c", "model_provider=local", "-c", f"model_providers.local={provider}", *args, "say hi"],
                          env=env, capture_output=True, text=True, timeout=TURN_TIMEOUT_S, cwd=home)


def stream_json(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def claude_turn(agents_bin, agent_app, tmp_path_factory) -> dict:
    """`claude -p --output-format stream-json --verbose`: its result event."""
    streamed = claude(agents_bin, agent_app, tmp_path_factory.mktemp("claude"), "--output-format", "stream-json",
                      "--verbose")
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    events = stream_json(streamed.stdout)
    assert any(e["type"] == "assistant" for e in events), events
    (result,) = [e for e in events if e["type"] == "result"]
    return result


def test_claude_code_answers(claude_turn):
    """One streamed turn (the API calls are the same whatever output format the CLI prints in)."""
    assert claude_turn["subtype"] == "success" and not claude_turn["is_error"], claude_turn


def test_claude_code_recovers_from_a_context_its_prompt_and_32000_overflow(agents_bin, claude_turn, server,
                                                                           tmp_path_factory, tmp_path):
    """Over a context below the prompt plus the 32,000 output tokens Claude Code asks for, its first request is
    refused in Anthropic's words, and it asks again with fewer output tokens by itself."""
    usage = claude_turn["usage"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    assert claude_turn["modelUsage"][MODEL_ID]["maxOutputTokens"] == 32000
    with serve_agent_model(server, tmp_path_factory, "agents-short", prompt + 16000) as short:
        recovered = claude(agents_bin, short, tmp_path, "--output-format", "stream-json", "--verbose")
    assert recovered.returncode == 0, recovered.stderr[-2000:]
    (result,) = [e for e in stream_json(recovered.stdout) if e["type"] == "result"]
    assert result["subtype"] == "success" and not result["is_error"], result
    assert result["usage"]["output_tokens"] < 16000


def test_codex_exec_answers(agents_bin, agent_app, tmp_path):
    streamed = codex(agents_bin, agent_app, tmp_path, "--json")
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    events = stream_json(streamed.stdout)
    assert events[-1]["type"] == "turn.completed", events[-3:]
