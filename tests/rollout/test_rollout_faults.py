"""Faults and load through the rollout runner (paper §3.4):

- a harness that crashes (an exception, a segfault) is a `harness_error`, scored as is;
- a proxy that goes away mid-run makes the rollouts it cut `infra_error` (no reward), while what
  finished before stays;
- 50 agentloop rollouts at concurrency 16 all finish with their records settled (each rollout's
  call count is exactly what the proxy recorded for it);
- a harness killed on timeout while it waits for the model is a `timeout` that settles at once
  (the proxy cancels the abandoned call), not an infra error;
- Ctrl-C closes every sandbox, keeps only the rollouts that finished, and a rerun completes the rest.

Everything is real except the model: sandboxes, harness processes and the proxy (scripted engine).
A harness hanging in a tool (→ `timeout`, no process left) is covered in test_rollout.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.proxy import ProxyConfig, ProxyThread
from clawgym.rollout.harnesses import HARNESSES, Endpoint, Launch
from clawgym.rollout.harnesses.agentloop import AgentLoop
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from clawgym.rollout.sandbox import SandboxConfig
from helpers import has_marker, make_task, script, scripted_config, tool_call

pytestmark = pytest.mark.slow

# A harness program that makes one model call and then dies: of an exception, or of a signal.
CRASH = """\
import os, signal, sys, openai
openai.OpenAI(max_retries=0).chat.completions.create(model="clawgym-policy", messages=[{"role": "user", "content": "hi"}])
if sys.argv[1] == "signal":
    os.kill(os.getpid(), signal.SIGSEGV)
raise RuntimeError("harness bug: lost its state")
"""


class Crashing(AgentLoop):
    """The agentloop adapter (its outcome rules), launching a program that crashes after one call."""

    how = "raise"

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        return Launch(argv=[sys.executable, "-c", CRASH, self.how], env=super().launch(instruction, workspace, home, endpoint).env)


class Segfaulting(Crashing):
    how = "signal"


def test_a_crashing_harness_is_a_harness_error_scored_as_is(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    monkeypatch.setitem(HARNESSES, "crash", Crashing)
    monkeypatch.setitem(HARNESSES, "segv", Segfaulting)
    make_task(tmp_path / "tasks", "hello")
    s = script(tmp_path / "script.jsonl", {"*": ["Hello."] * 2})
    summary = run_rollouts(dataclasses.replace(scripted_config(tmp_path, tiny_model, s, concurrency=2), harnesses=["crash", "segv"]))
    by_id = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert sorted(by_id) == ["hello.crash.0", "hello.segv.0"]
    crash, segv = by_id["hello.crash.0"], by_id["hello.segv.0"]
    # A crash is the policy's outcome too: scored as is (no out.txt → 0), not excluded.
    assert (crash.status, crash.reward, crash.n_calls) == ("harness_error", 0.0, 1)
    assert "exit code 1" in crash.error and "RuntimeError: harness bug" in crash.error, crash.error
    assert (segv.status, segv.reward, segv.n_calls) == ("harness_error", 0.0, 1)
    assert "killed by SIGSEGV" in segv.error, segv.error
    assert summary.status_counts() == {"harness_error": 2}
    assert summary.n_calls == 2


def test_the_proxy_stopped_mid_run_is_an_infra_error(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "quick")  # tasks run in id order at concurrency 1: quick first
    make_task(tmp_path / "tasks", "slow")
    s = script(tmp_path / "script.jsonl", {
        "quick.agentloop.0": [tool_call("write", path="out.txt", content="hi"), "Done."],
        # still being generated when the proxy stops (a graceful stop lets it finish; nothing after it is served)
        "slow.agentloop.0": [{"text": tool_call("write", path="out.txt", content="hi"), "delay_s": 4}, "Done."],
    })
    records = tmp_path / "records"
    proxy = ProxyThread(ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=records,
                                    engine_options={"script": str(s)}))
    proxy.__enter__()
    stopped = threading.Event()

    def stop_when_slow_is_in_flight() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if proxy.admin("GET", "/admin/rollouts/slow.agentloop.0")["in_flight"] > 0:
                    break
            except Exception:  # not registered yet
                pass
            time.sleep(0.02)
        proxy.__exit__(None, None, None)
        stopped.set()

    stopper = threading.Thread(target=stop_when_slow_is_in_flight, daemon=True)
    stopper.start()
    try:
        cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", concurrency=1,
                            proxy_url=proxy.url, admin_token=proxy.server.admin_token, records=records)
        summary = run_rollouts(cfg)
    finally:
        stopper.join(150)
        if not stopped.is_set():
            proxy.__exit__(None, None, None)
    by_id = {r.rollout_id: r for r in summary.rollouts}
    assert by_id["quick.agentloop.0"].status == "ok" and by_id["quick.agentloop.0"].reward == 1.0
    slow = by_id["slow.agentloop.0"]
    assert slow.status == "infra_error" and slow.reward is None, slow
    assert "proxy" in slow.error or "endpoint" in slow.error, slow.error
    # what finished is kept, and the failed rollout is there to be excluded
    rollouts = A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)
    assert sorted(r.rollout_id for r in rollouts) == ["quick.agentloop.0", "slow.agentloop.0"]
    assert [r.rollout_id for r in rollouts if r.trainable] == ["quick.agentloop.0"]
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert len([c for c in calls if c.rollout_id == "quick.agentloop.0"]) == 2


def test_fifty_rollouts_at_concurrency_16_all_settle(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    items, want_calls = {}, {}
    for i in range(50):
        rid = f"hello.agentloop.{i}"
        tools = 1 + i % 3  # 1-3 tool turns, then the final answer
        items[rid] = ([tool_call("bash", command="echo working")] * (tools - 1)
                      + [{"text": tool_call("write", path="out.txt", content="hi" if i % 2 == 0 else "bye"), "delay_s": 0.05 * (i % 4)},
                         "Done."])
        want_calls[rid] = tools + 1
    s = script(tmp_path / "script.jsonl", items)
    summary = run_rollouts(scripted_config(tmp_path, tiny_model, s, group_size=50, concurrency=16))

    rollouts = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert sorted(rollouts) == sorted(want_calls)
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    per_rollout: dict[str, list] = {}
    for c in calls:
        per_rollout.setdefault(c.rollout_id, []).append(c)
    for i in range(50):
        r = rollouts[f"hello.agentloop.{i}"]
        assert r.status == "ok" and r.reward == (1.0 if i % 2 == 0 else 0.5), r
        recorded = per_rollout.get(r.rollout_id, [])
        # settled: the count the runner read after the harness exited is every record there is
        assert r.n_calls == len(recorded) == want_calls[r.rollout_id], r
        assert sorted(c.seq for c in recorded) == list(range(r.n_calls))
        assert all(c.status == "ok" for c in recorded)
        raw = tmp_path / "out" / "records" / f"{r.rollout_id}.jsonl"
        assert len(raw.read_text().splitlines()) == r.n_calls
    assert summary.n_calls == sum(want_calls.values())
    assert len(A.read_jsonl(tmp_path / "out" / "results.jsonl").records) == 50


def test_a_timeout_during_a_model_call_is_scored_and_settles(tmp_path: Path, tiny_model: Path) -> None:
    # The harness is killed while the proxy is still generating its answer: the rollout is a
    # timeout scored as is (not an infra error), and the call it abandoned is recorded as cancelled.
    # The clock must outlast the harness's start and first tool call even on a busy machine (4 s did
    # not); the second answer is held back far longer, so the kill always lands inside that call.
    make_task(tmp_path / "tasks", "stuck", timeout=20)
    s = script(tmp_path / "script.jsonl", {
        "stuck.agentloop.0": [tool_call("write", path="out.txt", content="hi"), {"text": "Done.", "delay_s": 600}],
    })
    summary = run_rollouts(scripted_config(tmp_path, tiny_model, s, settle_timeout_s=20))
    (r,) = summary.rollouts
    assert (r.status, r.reward) == ("timeout", 1.0), r  # the file was written before the clock ran out
    calls = sorted(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord), key=lambda c: c.seq)
    assert r.n_calls == len(calls) == 2
    assert [c.status for c in calls] == ["ok", "cancelled"]


def test_ctrl_c_cleans_up_keeps_what_finished_and_a_rerun_completes(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "ctrlc")
    quick = [tool_call("write", path="out.txt", content="hi"), "Done."]
    s = script(tmp_path / "script.jsonl", {
        "ctrlc.agentloop.0": quick,
        "ctrlc.agentloop.1": [{"text": quick[0], "delay_s": 120}, "Done."],  # still running at Ctrl-C
        "ctrlc.agentloop.2": [{"text": quick[0], "delay_s": 120}, "Done."],
    })
    cfg = scripted_config(tmp_path, tiny_model, s, group_size=3, concurrency=3)
    results = tmp_path / "out" / "results.jsonl"
    base = SandboxConfig().base_dir
    returned = threading.Event()

    def interrupt_when_two_are_stuck() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not returned.is_set():
            stuck = list(base.glob("ctrlc.agentloop.[12]-*")) if base.exists() else []
            if len(stuck) == 2 and results.exists() and "ctrlc.agentloop.0" in results.read_text():
                time.sleep(1.5)  # the two stuck rollouts are waiting for their model call by now
                if not returned.is_set():
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_when_two_are_stuck, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_rollouts(cfg)
    finally:
        returned.set()
    # Every sandbox is gone (folders and processes), and only the finished rollout was kept.
    assert not base.exists() or not list(base.glob("ctrlc.agentloop.*"))
    assert [p for p in os.listdir("/proc") if p.isdigit() and has_marker(p, "ctrlc.agentloop.")] == []
    assert [r["rollout_id"] for r in A.read_jsonl(results).records] == ["ctrlc.agentloop.0"]

    # The rerun runs the two unfinished rollouts from scratch (their partial records dropped).
    script(tmp_path / "script.jsonl", {f"ctrlc.agentloop.{i}": quick for i in (1, 2)})
    summary = run_rollouts(cfg)
    assert sorted((r.rollout_id, r.status, r.reward) for r in summary.rollouts) == [
        (f"ctrlc.agentloop.{i}", "ok", 1.0) for i in range(3)]
    assert len(A.read_jsonl(results).records) == 3
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert sorted((c.rollout_id, c.seq) for c in calls) == [(f"ctrlc.agentloop.{i}", k) for i in range(3) for k in range(2)]
