"""Generated task families (`clawgym tasks make`): determinism, disjoint splits, the checks' partial credit, the teacher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym.errors import UserError
from clawgym.rollout.harnesses.agentloop import run_tool
from clawgym.tasks import load_tasks
from clawgym.tasks.families import FAMILIES, draw_tasks, make_tasks
from clawgym.tasks.generated import Reply, split_of
from clawgym.tasks.lookup import KEYS, parse_instruction


def signatures(split: str, seeds: range, n: int = 24, family: str = "lookup") -> set[str]:
    return {d.signature for s in seeds for d in draw_tasks(family, n, s, split)}


def test_same_arguments_same_tasks_and_ids_name_the_split() -> None:
    a, b = draw_tasks("lookup", 12, 3, "train"), draw_tasks("lookup", 12, 3, "train")
    assert [d.signature for d in a] == [d.signature for d in b]
    assert len({d.signature for d in a}) == 12  # distinct within a call
    assert [d.draft.id for d in a][:2] == ["lookup-train-3-000", "lookup-train-3-001"]
    assert {d.draft.toml["metadata"]["category"] for d in a} == {"value", "file", "count"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_train_and_heldout_are_disjoint_for_any_seeds(family: str) -> None:
    train, heldout = signatures("train", range(0, 12), family=family), signatures("heldout", range(0, 12), family=family)
    assert train and heldout and not train & heldout
    # structural: the signature alone decides the split, so each side only holds its own
    assert {split_of(s) for s in train} == {"train"} and {split_of(s) for s in heldout} == {"heldout"}
    # and the split is part of the random stream: same seed, different draws
    assert draw_tasks(family, 1, 0, "train")[0].signature != draw_tasks(family, 1, 0, "heldout")[0].signature


def test_keys_are_not_substrings_of_each_other() -> None:
    assert not [(a, b) for a in KEYS for b in KEYS if a != b and a in b]


def check(task_dir: Path, workspace: Path) -> dict:
    r = subprocess.run([sys.executable, str(task_dir / "tests" / "check.py"), str(workspace)], cwd=workspace,
                       capture_output=True, text=True, env={**os.environ, "CLAWGYM_TESTS": str(task_dir / "tests")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# The calls the teacher makes per category: lookup searches once then writes; scan reads until it
# has seen the error (or ruled out all but the last file), then writes.
TEACHER_CALLS = {"lookup": {"value": 2, "file": 2, "count": 2}, "scan": {"first": 2, "second": 3, "third": 3}}


@pytest.mark.slow
@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_the_teacher_solves_every_category_through_real_tools_and_checks_give_partial_credit(
        tmp_path: Path, monkeypatch, family_name: str) -> None:
    family = FAMILIES[family_name]
    made = make_tasks(family_name, tmp_path / "tasks", n=3, seed=5, split="heldout")  # one per category
    tasks = load_tasks(tmp_path / "tasks")
    assert len(made) == len(tasks) == 3
    assert {t.category for t in tasks} == set(family.categories)
    for task in tasks:
        ws = tmp_path / "ws" / task.id
        ws.mkdir(parents=True)
        for f in (task.path / "workspace").iterdir():
            (ws / f.name).write_text(f.read_text())
        monkeypatch.chdir(ws)
        assert check(task.path, ws) == {"answered": False, "correct": False}  # no-op scores 0
        results: list[str] = []
        while (reply := family.teach(task.instruction, results)).calls:
            (call,) = reply.calls
            results.append(run_tool(call.name, call.arguments))
            assert len(results) <= 3, (task.id, results)
        assert reply == Reply(text="done")
        assert len(results) == TEACHER_CALLS[family_name][task.category], (task.id, results)
        assert check(task.path, ws) == {"answered": True, "correct": True}, (task.id, results)
        (ws / "answer.txt").write_text("wrong\n")
        assert check(task.path, ws) == {"answered": True, "correct": False}


def test_teacher_refuses_a_foreign_instruction() -> None:
    assert parse_instruction("Write how many files hold key log to answer.txt.") == ("count", "log")
    for name in FAMILIES:
        with pytest.raises(ValueError, match=f"not a {name} instruction"):
            FAMILIES[name].teach("What is 2+2?", [])


def test_scan_decides_from_what_each_read_showed() -> None:
    scan = FAMILIES["scan"]
    instruction = draw_tasks("scan", 1, 0, "train")[0].draft.instruction

    def next_call(*results: str) -> tuple[str, dict]:
        (call,) = scan.teach(instruction, list(results)).calls
        return call.name, call.arguments

    assert next_call() == ("bash", {"command": "cat a.txt"})
    assert next_call("exit code 0\nlog=3\nerror\n") == ("write", {"path": "answer.txt", "content": "a.txt"})
    assert next_call("exit code 0\nlog=3\nrow=1\n") == ("bash", {"command": "cat b.txt"})
    assert next_call("exit code 0\nlog=3\n", "exit code 0\nerror\nrow=1\n") == ("write", {"path": "answer.txt", "content": "b.txt"})
    # neither a nor b had it: the error is in c, no need to read it
    assert next_call("exit code 0\nlog=3\n", "exit code 0\nrow=1\n") == ("write", {"path": "answer.txt", "content": "c.txt"})
    # a line that merely mentions the word is not an error line
    assert next_call("exit code 0\nno error=1\n")[0] == "bash"
    assert scan.teach(instruction, ["exit code 0\nerror\n", "wrote 5 characters to answer.txt"]) == Reply(text="done")


@pytest.mark.slow  # starts the CLI
def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown task family 'nope'"):
        make_tasks("nope", tmp_path, n=1, seed=0, split="train")
    with pytest.raises(UserError, match="--split must be one of train, heldout"):
        make_tasks("lookup", tmp_path, n=1, seed=0, split="test")
    with pytest.raises(UserError, match="--count must be at least 1"):
        make_tasks("lookup", tmp_path, n=0, seed=0, split="train")
    make_tasks("lookup", tmp_path, n=2, seed=0, split="train")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match="already exists"):
        make_tasks("lookup", tmp_path, n=3, seed=0, split="train")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written by the refused call
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "tasks", "make", "lookup", str(tmp_path / "x"), "--count", "2",
                        "--split", "dev"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == "error: --split must be one of train, heldout, got 'dev'"


def test_agentloop_offers_a_subset_of_its_tools_and_refuses_unknown_names(tmp_path: Path) -> None:
    from clawgym.rollout.harnesses.agentloop import AgentLoop
    from clawgym.rollout.harnesses.base import Endpoint

    launch = AgentLoop(tools=["bash", "write"]).launch("x", tmp_path, tmp_path, Endpoint("http://h/r/1", "k", "m"))
    assert launch.argv[launch.argv.index("--tools") + 1] == "bash,write"
    assert "--tools" not in AgentLoop().launch("x", tmp_path, tmp_path, Endpoint("http://h/r/1", "k", "m")).argv
    for bad in (["bash", "curl"], []):
        with pytest.raises(UserError, match="tools' must name some of bash, read, write, edit, python"):
            AgentLoop(tools=bad)
