"""The rollout runner end to end: real sandboxes, the real proxy (scripted engine), real harness processes."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.rollout.one import RolloutPlan
from clawgym.rollout.runner import RolloutConfig, run_rollouts, select_tasks, start_order
from helpers import has_marker, make_task, script, scripted_config, tool_call

@pytest.mark.slow
def test_agentloop_rollouts_are_scored_recorded_and_classified(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    s = script(tmp_path / "script.jsonl", {
        "hello.agentloop.0": [tool_call("write", path="out.txt", content="hi"), "Done."],   # right file
        "hello.agentloop.1": [tool_call("bash", command="echo bye > out.txt"), "Done."],    # wrong content
    })
    summary = run_rollouts(scripted_config(tmp_path, tiny_model, s, group_size=2, concurrency=2))
    by_id = {r.rollout_id: r for r in summary.rollouts}
    assert by_id["hello.agentloop.0"].status == "ok" and by_id["hello.agentloop.0"].reward == 1.0
    assert by_id["hello.agentloop.1"].status == "ok" and by_id["hello.agentloop.1"].reward == 0.5
    assert all(r.group_id == "hello/agentloop" and r.n_calls == 2 and r.category == "files" for r in summary.rollouts)

    rollouts = A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)
    calls = A.materialize_prompts(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord))
    assert sorted(r.rollout_id for r in rollouts) == sorted(by_id)
    assert len(calls) == 4 and {c.role for c in calls} == {"main"}
    # the roles the adapter read from the proxy's conversation log, kept in the rows a resumed run reads
    rows = A.read_jsonl(tmp_path / "out" / "results.jsonl").records
    assert [r["call_roles"] for r in rows] == [{"0": "main", "1": "main"}] * 2
    first, second = sorted((c for c in calls if c.rollout_id == "hello.agentloop.0"), key=lambda c: c.seq)
    # the second prompt extends the first prompt and its sampled tokens, token for token
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids
    assert json.loads((tmp_path / "out" / "rollout.config.json").read_text())["harnesses"] == ["agentloop"]


@pytest.mark.slow
def test_failures_are_classified_and_never_stop_the_others(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    make_task(tmp_path / "tasks", "hang", timeout=3)
    s = script(tmp_path / "script.jsonl", {
        "hello.agentloop.0": [tool_call("write", path="out.txt", content="hi"), "Done."],
        "hang.agentloop.0": [tool_call("bash", command="sleep 300"), "Done."],
    })
    summary = run_rollouts(scripted_config(tmp_path, tiny_model, s, concurrency=2))
    by_id = {r.rollout_id: r for r in summary.rollouts}
    assert by_id["hello.agentloop.0"].reward == 1.0
    hang = by_id["hang.agentloop.0"]
    assert hang.status == "timeout" and hang.reward == 0.0 and "killed after 3 s" in hang.error
    # no process of the hung rollout is left
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and has_marker(p, "hang.agentloop.0")]
    assert leftovers == []




@pytest.mark.slow
def test_engine_failure_is_an_infra_error_and_a_rerun_resumes(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    s = script(tmp_path / "script.jsonl", {
        "hello.agentloop.0": [tool_call("write", path="out.txt", content="hi"), "Done."],
        "hello.agentloop.1": [{"error": "engine down"}] * 8,
    })
    cfg = scripted_config(tmp_path, tiny_model, s, group_size=2, concurrency=1)
    summary = run_rollouts(cfg)
    by_id = {r.rollout_id: r for r in summary.rollouts}
    assert by_id["hello.agentloop.1"].status == "infra_error" and by_id["hello.agentloop.1"].reward is None
    failed_calls = [c for c in A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord) if c.rollout_id == "hello.agentloop.1"]
    assert failed_calls and {c.status for c in failed_calls} == {"engine_error"}  # the harness's retries are recorded

    # A rerun into the same folder keeps what finished, runs the infra_error one again (here it fails
    # again: the script still errs), and keeps every rollout once.
    again = run_rollouts(cfg)
    assert sorted(r.rollout_id for r in again.rollouts) == ["hello.agentloop.0", "hello.agentloop.1"]
    lines = [r["rollout_id"] for r in A.read_jsonl(tmp_path / "out" / "results.jsonl").records]
    assert sorted(lines) == ["hello.agentloop.0", "hello.agentloop.1", "hello.agentloop.1"]
    assert {r.rollout_id: r for r in again.rollouts}["hello.agentloop.0"] == by_id["hello.agentloop.0"]


def test_bad_input_is_one_clear_error(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "tasks").mkdir()
    with pytest.raises(UserError, match="unknown harness 'nope'"):
        run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", harnesses=["nope"], out=tmp_path / "o", model=tiny_model))
    with pytest.raises(UserError, match="holds no task folders"):
        run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "o", model=tiny_model))
    make_task(tmp_path / "tasks", "hello")
    with pytest.raises(UserError, match="--proxy URL with --admin-token and --records"):
        run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "o"))


def test_a_proxy_on_every_interface_is_advertised_at_a_reachable_address() -> None:
    import socket

    from clawgym.rollout.proxy_client import reachable_host

    assert reachable_host("127.0.0.1") == "127.0.0.1" and reachable_host("10.1.2.3") == "10.1.2.3"
    with socket.create_server(("0.0.0.0", 0)) as server:
        host = reachable_host("0.0.0.0")
        assert host not in ("0.0.0.0", "::", "")
        with socket.create_connection((host, server.getsockname()[1]), timeout=5):
            pass


def test_connecting_to_a_proxy_checks_its_url_and_token_before_any_rollout(tmp_path: Path, tiny_model: Path) -> None:
    """--proxy URL: a wrong admin token fails at connect, not in the middle of the rollouts."""
    from clawgym.proxy import ProxyConfig, ProxyThread
    from clawgym.rollout.proxy_client import ProxyClient, ProxyUnavailable

    pc = ProxyConfig(model_dir=tiny_model, engine="scripted", port=0, records_dir=tmp_path / "records")
    with ProxyThread(pc) as thread:
        cfg = RolloutConfig(tasks=tmp_path, harnesses=["agentloop"], out=tmp_path / "out", proxy_url=thread.url,
                            admin_token=thread.server.admin_token, records=tmp_path / "records")
        with ProxyClient.connect(cfg) as client:
            assert client.records == tmp_path / "records"
        with pytest.raises(ProxyUnavailable):
            with ProxyClient.connect(dataclasses.replace(cfg, admin_token="wrong")):
                pass


def test_tasks_per_step_draws_a_different_subset_each_step_and_the_same_on_a_rerun(tmp_path: Path) -> None:
    pool = Path(__file__).parents[2] / "recipes" / "tasks" / "lookup" / "train"

    def ids(step: int, k: int = 8) -> list[str]:
        return [t.id for t in select_tasks(RolloutConfig(tasks=pool, out=tmp_path, step=step, tasks_per_step=k))]

    all_ids = ids(0, 0)
    assert len(all_ids) == 96
    draws = [ids(step) for step in (1, 2, 3)]
    for d in draws:
        assert len(d) == len(set(d)) == 8 and set(d) <= set(all_ids)
    assert ids(2) == draws[1]                      # a resumed step reruns the tasks it started
    assert len({tuple(sorted(d)) for d in draws}) == 3   # steps go through the pool
    assert len(ids(1, 500)) == 96                  # more than the pool: every task
    with pytest.raises(UserError, match="tasks-per-step"):
        ids(1, -1)


def test_rollouts_start_harness_by_harness_so_those_running_at_once_share_a_prompt_length(tmp_path: Path) -> None:
    tasks = [select_tasks(RolloutConfig(tasks=Path(__file__).parents[2] / "recipes" / "tasks" / "lookup" / "heldout",
                                        out=tmp_path))[i] for i in range(3)]
    plans = [RolloutPlan(t, h, i) for t in tasks for h in ("codex", "agentloop") for i in range(2)]
    started = start_order(plans, ["agentloop", "codex"])
    assert sorted(started, key=lambda p: p.rollout_id) == sorted(plans, key=lambda p: p.rollout_id)  # every plan, once
    assert [p.harness for p in started] == ["agentloop"] * 6 + ["codex"] * 6
    # within a harness, the plans keep their order (task by task, sample by sample)
    assert [p.rollout_id for p in started[:6]] == [p.rollout_id for p in plans if p.harness == "agentloop"]
