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


def signatures(split: str, seeds: range, n: int = 24) -> set[str]:
    return {d.signature for s in seeds for d in draw_tasks("lookup", n, s, split)}


def test_same_arguments_same_tasks_and_ids_name_the_split() -> None:
    a, b = draw_tasks("lookup", 12, 3, "train"), draw_tasks("lookup", 12, 3, "train")
    assert [d.signature for d in a] == [d.signature for d in b]
    assert len({d.signature for d in a}) == 12  # distinct within a call
    assert [d.draft.id for d in a][:2] == ["lookup-train-3-000", "lookup-train-3-001"]
    assert {d.draft.toml["metadata"]["category"] for d in a} == {"value", "file", "count"}


def test_train_and_heldout_are_disjoint_for_any_seeds() -> None:
    train, heldout = signatures("train", range(0, 12)), signatures("heldout", range(0, 12))
    assert train and heldout and not train & heldout
    # structural: the signature alone decides the split, so each side only holds its own
    assert {split_of(s) for s in train} == {"train"} and {split_of(s) for s in heldout} == {"heldout"}
    # and the split is part of the random stream: same seed, different draws
    assert draw_tasks("lookup", 1, 0, "train")[0].signature != draw_tasks("lookup", 1, 0, "heldout")[0].signature


def test_keys_are_not_substrings_of_each_other() -> None:
    assert not [(a, b) for a in KEYS for b in KEYS if a != b and a in b]


def check(task_dir: Path, workspace: Path) -> dict:
    r = subprocess.run([sys.executable, str(task_dir / "tests" / "check.py"), str(workspace)], cwd=workspace,
                       capture_output=True, text=True, env={**os.environ, "CLAWGYM_TESTS": str(task_dir / "tests")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_teacher_solves_every_category_through_real_tools_and_checks_give_partial_credit(tmp_path: Path, monkeypatch) -> None:
    made = make_tasks("lookup", tmp_path / "tasks", n=3, seed=5, split="heldout")  # one per category
    tasks = load_tasks(tmp_path / "tasks")
    assert len(made) == len(tasks) == 3
    family = FAMILIES["lookup"]
    for task in tasks:
        ws = tmp_path / "ws" / task.id
        ws.mkdir(parents=True)
        for f in (task.path / "workspace").iterdir():
            (ws / f.name).write_text(f.read_text())
        monkeypatch.chdir(ws)
        assert check(task.path, ws) == {"answered": False, "correct": False}  # no-op scores 0
        results: list[str] = []
        for _ in range(2):  # search, then write what the search showed
            (call,) = family.teach(task.instruction, results).calls
            results.append(run_tool(call.name, call.arguments))
        assert family.teach(task.instruction, results) == Reply(text="done")
        assert check(task.path, ws) == {"answered": True, "correct": True}, (task.id, results)
        (ws / "answer.txt").write_text("wrong\n")
        assert check(task.path, ws) == {"answered": True, "correct": False}


def test_teacher_refuses_a_foreign_instruction() -> None:
    assert parse_instruction("Write how many files hold key log to answer.txt.") == ("count", "log")
    with pytest.raises(ValueError, match="not a lookup instruction"):
        FAMILIES["lookup"].teach("What is 2+2?", [])


@pytest.mark.slow  # starts the CLI
def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown task family 'nope'"):
        make_tasks("nope", tmp_path, n=1, seed=0, split="train")
    with pytest.raises(UserError, match="--split must be one of train, heldout"):
        make_tasks("lookup", tmp_path, n=1, seed=0, split="test")
    with pytest.raises(UserError, match="--n must be at least 1"):
        make_tasks("lookup", tmp_path, n=0, seed=0, split="train")
    make_tasks("lookup", tmp_path, n=2, seed=0, split="train")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match="already exists"):
        make_tasks("lookup", tmp_path, n=3, seed=0, split="train")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written by the refused call
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "tasks", "make", "lookup", str(tmp_path / "x"), "--n", "2",
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
