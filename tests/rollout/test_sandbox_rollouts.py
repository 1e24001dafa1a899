"""Sandboxes as rollouts use them: `clawgym rollout` refuses a sandbox that would silently run agent
commands among the host's files, says once what its sandboxes isolate and records it in
rollout.config.json; real rollouts (agentloop, Claude Code) run inside docker containers, and the
fixed /workspace path gives two rollouts of a task the same first prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.rollout.harnesses import HARNESSES
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from clawgym.rollout.sandbox import SandboxConfig
from clawgym.rollout.sandbox_docker import prepare_engine
from clawgym.rollout.sandbox_local import namespace_problem
from helpers import make_task, script, tool_call

DOCKER_PROBLEM = prepare_engine(SandboxConfig().image)
needs_docker = pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"docker: {DOCKER_PROBLEM}")


def clawgym(*args: str, path_first: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return subprocess.run([sys.executable, "-c", "from clawgym.cli import main; main()", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def no_bwrap(tmp_path: Path) -> Path:
    """A folder to put first on PATH whose `bwrap` fails as it does where user namespaces are not
    permitted (the sandbox probes the real command, so this stands for a machine without it)."""
    d = tmp_path / "fakebin"
    d.mkdir()
    (d / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (d / "bwrap").chmod(0o755)
    return d


def test_rollout_without_file_isolation_is_refused_in_one_line(tmp_path: Path, no_bwrap: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    out = tmp_path / "out"
    r = clawgym("rollout", "--tasks", str(tmp_path / "tasks"), "--out", str(out), "--proxy", "http://127.0.0.1:9", "--admin-token", "t", "--records", str(tmp_path / "rec"), path_first=no_bwrap)
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    from clawgym.rollout.sandbox import CONTAINER_FLAGS, in_container

    if in_container():  # a bwrap that is there but refused: the container's doing, and the flags that fix it
        assert "cannot isolate files here: bubblewrap is installed, but this container" in line and CONTAINER_FLAGS in line
    else:
        assert "cannot isolate files" in line and "install bubblewrap" in line and "--sandbox docker" in line
    assert "--sandbox local-unisolated" in line
    assert not out.exists()  # refused before anything was written


def test_the_refusal_names_the_container_only_where_bwrap_is_installed_in_one(monkeypatch) -> None:
    from clawgym.rollout import sandbox

    monkeypatch.setattr(sandbox, "in_container", lambda: True)
    assert sandbox.CONTAINER_FLAGS in sandbox.isolation_refusal("bwrap is not permitted here: No permissions")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)  # not installed: that is the fix, container or not
    assert "install bubblewrap" in sandbox.isolation_refusal("bwrap is not installed")
    monkeypatch.undo()
    monkeypatch.setattr(sandbox, "in_container", lambda: False)
    text = sandbox.isolation_refusal("bwrap is not permitted here")
    assert "install bubblewrap" in text and sandbox.CONTAINER_FLAGS not in text


def test_a_network_mode_without_file_isolation_needs_the_explicit_opt_in(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    r = clawgym("rollout", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "out"), "--proxy", "http://127.0.0.1:9", "--admin-token", "t", "--records", str(tmp_path / "rec"),
                "--network", "blackhole")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "local-unisolated" in r.stderr, r.stderr


@pytest.mark.skipif(namespace_problem("unshare") is not None, reason=f"unshare: {namespace_problem('unshare')}")
def test_the_explicit_opt_in_runs_and_says_what_is_lost(tmp_path: Path, no_bwrap: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    r = clawgym("rollout", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "out"), "--proxy", "http://127.0.0.1:9", "--admin-token", "t", "--records", str(tmp_path / "rec"),
                "--sandbox", "local-unisolated", path_first=no_bwrap)
    # past the sandbox check, the run stops at the next thing missing (the proxy's admin token)
    assert "sandbox: local-unisolated (unshare): network only" in r.stderr and "NOT files" in r.stderr, r.stderr


def test_an_unknown_sandbox_and_a_docker_without_image_are_one_line_errors(tmp_path: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    base = ["rollout", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "out"), "--proxy", "http://127.0.0.1:9", "--admin-token", "t", "--records", str(tmp_path / "rec")]
    for sandbox, want in (("podman", "unknown sandbox 'podman'"), ("docker:", "unknown sandbox 'docker:'"),
                          ("docker:clawgym-no-such-image:1", "--sandbox docker:")):
        r = clawgym(*base, "--sandbox", sandbox)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and want in r.stderr, (sandbox, r.stderr)


@pytest.mark.slow
@pytest.mark.skipif(namespace_problem("bwrap") is not None, reason=f"bubblewrap: {namespace_problem('bwrap')}")
def test_the_step_config_records_what_the_sandbox_isolates(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    s = script(tmp_path / "script.jsonl", {"hello.agentloop.0": [tool_call("write", path="out.txt", content="hi"), "Done."]})
    run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", out=tmp_path / "out", model=tiny_model, engine="scripted",
                               engine_options={"script": str(s)}))
    iso = json.loads((tmp_path / "out" / "rollout.config.json").read_text())["isolation"]
    assert (iso["sandbox"], iso["network"], iso["files"]) == ("local", "bwrap", True) and "/workspace" in iso["summary"]


def first_prompts(out: Path) -> dict[str, list[int]]:
    calls = A.materialize_prompts(A.read_table(out / "calls.parquet", A.CallRecord))
    first: dict[str, A.CallRecord] = {}
    for c in sorted(calls, key=lambda c: c.seq):
        first.setdefault(c.rollout_id, c)
    return {rid: list(c.prompt_ids) for rid, c in first.items()}


@pytest.mark.slow
@needs_docker
def test_agentloop_rollouts_in_docker_share_their_first_prompt(tmp_path: Path, tiny_model: Path) -> None:
    make_task(tmp_path / "tasks", "hello")
    s = script(tmp_path / "script.jsonl", {
        "hello.agentloop.0": [tool_call("bash", command="echo hi > out.txt"), "Done."],
        "hello.agentloop.1": [tool_call("bash", command="echo bye > out.txt"), "Done."],
    })
    run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", out=tmp_path / "out", model=tiny_model, engine="scripted", group_size=2,
                               concurrency=2, sandbox="docker", engine_options={"script": str(s)}))
    rows = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert [(rows[k].status, rows[k].reward) for k in sorted(rows)] == [("ok", 1.0), ("ok", 0.5)], rows
    prompts = first_prompts(tmp_path / "out")
    assert len(prompts) == 2 and prompts["hello.agentloop.0"] == prompts["hello.agentloop.1"]
    iso = json.loads((tmp_path / "out" / "rollout.config.json").read_text())["isolation"]
    assert (iso["sandbox"], iso["network"], iso["files"], iso["image"]) == ("docker", "none", True, SandboxConfig().image)


@pytest.mark.slow
@pytest.mark.harness
@needs_docker
def test_claude_code_rollouts_in_docker_share_their_first_prompt(tmp_path: Path, tiny_model: Path) -> None:
    if (why := HARNESSES["claude-code"]().missing()) is not None:
        pytest.skip(why)
    make_task(tmp_path / "tasks", "hello", timeout=180)
    bash = lambda cmd: tool_call("Bash", command=cmd, description="write out.txt")  # noqa: E731
    s = script(tmp_path / "script.jsonl", {
        "hello.claude-code.0": [{"text": bash("echo hi > out.txt"), "delay_s": 0.3}, "Done: wrote out.txt"],
        "hello.claude-code.1": [{"text": bash("echo bye > out.txt"), "delay_s": 0.3}, "Done: wrote out.txt"],
    })
    run_rollouts(RolloutConfig(tasks=tmp_path / "tasks", harnesses=["claude-code"], out=tmp_path / "out", model=tiny_model,
                               engine="scripted", group_size=2, concurrency=2, sandbox="docker", engine_options={"script": str(s)}))
    rows = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert [(rows[k].status, rows[k].reward, rows[k].n_calls) for k in sorted(rows)] == [("ok", 1.0, 2), ("ok", 0.5, 2)], rows
    prompts = first_prompts(tmp_path / "out")
    assert len(prompts) == 2 and prompts["hello.claude-code.0"] == prompts["hello.claude-code.1"]


def test_run_refuses_before_writing_anything(tmp_path: Path, no_bwrap: Path) -> None:
    """README command 1's `clawgym run recipes/quickstart.toml` on a machine without bubblewrap."""
    recipes = Path(__file__).resolve().parents[2] / "recipes"
    text = (recipes / "quickstart.toml").read_text().replace('"tasks/', f'"{recipes}/tasks/')
    run_dir = tmp_path / "run"
    recipe = tmp_path / "quickstart.toml"
    recipe.write_text(text.replace("[run]\n", f'[run]\ndir = "{run_dir}"\n', 1))
    r = clawgym("run", str(recipe), path_first=no_bwrap)
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "cannot isolate files" in line and "--sandbox local-unisolated" in line
    assert not run_dir.exists()
