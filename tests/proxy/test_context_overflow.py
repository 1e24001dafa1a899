"""A prompt longer than the model's window: protocol-shaped errors through the real SDKs (streaming and
not), and an agentloop rollout that runs into it is a scored harness_error with that reason. And the
agentloop's limits (max_tokens, temperature, tool and request timeouts) set from `clawgym rollout`
and recipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import openai
import pytest

from clawgym import artifacts as A
from clawgym.run.recipe import load_recipe
from clawgym.errors import UserError
from clawgym.proxy import ProxyConfig, ProxyThread
from clawgym.rollout.harnesses.agentloop import SYSTEM_PROMPT, TOOLS, AgentLoop, agent_main
from clawgym.rollout.harnesses.base import Endpoint
from clawgym.rollout.runner import RolloutConfig, run_rollouts

from helpers import CHECK_HI, make_task, script, tool_call

WINDOW = 256
LONG = "word " * 2000


PROXY = {"max_context": WINDOW, "ping_interval_s": 0.05}
"""the module's proxy (conftest `proxy`): a small window"""


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_each_protocol_refuses_a_long_prompt_in_its_own_shape(proxy, stream: bool) -> None:
    reg = proxy.register(f"long-{stream}", script=["Short answer."])
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ea:
        kw = dict(model="m", max_tokens=5, messages=[{"role": "user", "content": LONG}])
        if stream:
            with a.messages.stream(**kw) as s:
                s.get_final_message()
        else:
            a.messages.create(**kw)
    assert ea.value.status_code == 400 and ea.value.body["error"]["type"] == "invalid_request_error"
    assert ea.value.body["error"]["message"].startswith("prompt is too long: ")  # what Claude Code compacts on
    with pytest.raises(openai.BadRequestError) as ec:
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG}], stream=stream)
    assert ec.value.code == "context_length_exceeded" and f"maximum context length is {WINDOW} tokens" in ec.value.message
    with pytest.raises(openai.BadRequestError) as er:
        o.responses.create(model="m", input=LONG, stream=stream)
    assert er.value.code == "context_length_exceeded" and er.value.param == "input"
    st = proxy.admin("GET", f"/admin/rollouts/{reg['rollout_id']}")
    assert st["calls_started"] == 0 and st["context_exceeded"].startswith("Your input exceeds the context window")
    # a later call that fits clears it: the refusal is no longer the rollout's last word
    assert o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "Short answer."
    assert proxy.settle(reg["rollout_id"])["context_exceeded"] == ""


def _first_prompt_tokens(tokenizer, instruction: str) -> int:
    text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}],
                                         tools=TOOLS, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.slow
def test_agentloop_overflow_is_a_scored_harness_error_with_the_reason(tmp_path: Path, tiny_model: Path, tiny_tokenizer) -> None:
    make_task(tmp_path / "tasks", "big", check=CHECK_HI)
    # the first call fits; the tool's 4,000-character output pushes the second past the window
    window = _first_prompt_tokens(tiny_tokenizer, "Write hi to out.txt.") + 120
    s = script(tmp_path / "script.jsonl", {"big.agentloop.0": [tool_call("python", code="print('word ' * 2000)"), "Done."]})
    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", model=tiny_model,
                        engine="scripted", engine_options={"script": str(s), "max_context": window})
    [rec] = run_rollouts(cfg).rollouts
    assert rec.status == "harness_error" and rec.reward == 0.0  # scored, not excluded like an infra_error
    assert rec.error.startswith(f"context_length_exceeded: This model's maximum context length is {window} tokens")
    assert "exit code 5: context window exceeded" in rec.error  # agentloop's own account
    assert rec.n_calls == 1  # the refused request is not a call: nothing was sampled


def test_agentloop_options_are_checked_and_reach_the_agent(tmp_path: Path) -> None:
    loop = AgentLoop(max_tokens=1024, temperature=0.2, tool_timeout=5, request_timeout=30)
    argv = loop.launch("do it", tmp_path, tmp_path, Endpoint("http://127.0.0.1:1/r/x", "k")).argv
    assert argv[argv.index("--max-tokens") + 1] == "1024" and argv[argv.index("--temperature") + 1] == "0.2"
    assert argv[argv.index("--tool-timeout") + 1] == "5.0" and argv[argv.index("--request-timeout") + 1] == "30.0"
    for bad, message in (({"max_tokens": 0}, "'max_tokens' must be an integer >= 1, got 0"),
                         ({"max_tokens": 2.5}, "'max_tokens' must be an integer >= 1"),
                         ({"temperature": "hot"}, "'temperature' must be a number >= 0"),
                         ({"tool_timeout": 0}, "'tool_timeout' must be a number > 0"),
                         ({"request_timeout": True}, "'request_timeout' must be a number > 0")):
        with pytest.raises(UserError, match=message):
            AgentLoop(**bad)
    (tmp_path / "tasks").mkdir()
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\n\n'
                      "[rollout.agentloop]\nmax_tokens = 2048\ntemperature = 0.7\ntool_timeout = 120\nrequest_timeout = 900\n")
    opts = load_recipe(recipe).rollout.harness_options["agentloop"]
    loop = AgentLoop(**opts)
    assert (loop.max_tokens, loop.temperature, loop.tool_timeout, loop.request_timeout) == (2048, 0.7, 120.0, 900.0)


@pytest.mark.slow
def test_rollout_harness_options_set_tokens_temperature_and_tool_timeout(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "slow", check=CHECK_HI)
    s = script(tmp_path / "script.jsonl", {"slow.agentloop.0": [tool_call("bash", command="sleep 20; echo late"), "Done."]})
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def rollout(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clawgym.cli", "rollout", "--tasks", str(tmp_path / "tasks"), "--model",
                               str(tiny_model), "--engine", "scripted", "--script", str(s), "--out", str(tmp_path / "out"), *extra],
                              capture_output=True, text=True, timeout=300, env=env)

    for extra, message in ((["--harness-option", "agentloop.max_tokens=0"], "agentloop option 'max_tokens' must be an integer >= 1"),
                           (["--harness-option", "agentlop.max_tokens=9"], "unknown harness 'agentlop'"),
                           (["--harness-option", "agentloop.bogus=1"], "bad options for harness 'agentloop'"),
                           (["--harness-option", "max_tokens=9"], "--harness-option expects HARNESS.KEY=VALUE")):
        out = rollout(*extra)
        assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = rollout("--harness-option", "agentloop.max_tokens=100", "--harness-option", "agentloop.temperature=0.5",
                  "--harness-option", "agentloop.tool_timeout=1")
    assert out.returncode == 0, out.stderr
    assert "tool parser hermes: detected from the chat template" in out.stderr
    calls = sorted(A.materialize_prompts(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)), key=lambda c: c.seq)
    assert len(calls) == 2
    assert all(json.loads(c.sampling_json) == {"max_tokens": 100, "temperature": 0.5} for c in calls)
    from transformers import AutoTokenizer

    second = AutoTokenizer.from_pretrained(tiny_model).decode(calls[1].prompt_ids)
    assert "error: bash timed out after 1 s" in second  # not 20 s of sleep, and not the default 60 s limit


@pytest.mark.slow
def test_agentloop_request_timeout_bounds_each_model_call(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    config = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=tmp_path / "records")
    with ProxyThread(config) as proxy:
        reg = proxy.register("slow-engine", script=[{"text": "late", "delay_s": 30}] * 4)
        monkeypatch.setenv("OPENAI_BASE_URL", reg["openai_base_url"])
        monkeypatch.setenv("OPENAI_API_KEY", reg["api_key"])
        monkeypatch.chdir(tmp_path)
        t0 = time.monotonic()
        code = agent_main(["--request-timeout", "0.5", "--", "hi"])
    assert code == 4  # the endpoint never answered in time: EXIT_ENDPOINT_FAILED after the SDK's 3 retries
    assert time.monotonic() - t0 < 60  # 4 tries of 0.5 s plus backoff, far from 4 x 30 s or the 600 s default
