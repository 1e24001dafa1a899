"""`clawgym compare`: policies × evaluation harnesses in one Pass@1 table with standard errors."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from clawgym import artifacts as A
from clawgym.run.compare import cells_of, compare, markdown, parse_policies, standard_error
from clawgym.errors import UserError
from clawgym.rollout.runner import RolloutConfig
from clawgym.tasks.families import make_tasks


def rollout(task: str, harness: str, reward: float | None, i: int = 0) -> A.RolloutRecord:
    return A.RolloutRecord(rollout_id=f"{task}.{harness}.{i}", task_id=task, harness=harness, group_id=f"{task}.{harness}",
                           sample_index=i, status="ok" if reward is not None else "infra_error", reward=reward,
                           n_calls=1, wall_time_s=1.0, policy_version=0)


def test_cells_split_by_harness_with_the_standard_error_over_tasks() -> None:
    rows = [rollout("t1", "agentloop", 1.0), rollout("t1", "agentloop", 0.0, 1), rollout("t2", "agentloop", 1.0),
            rollout("t2", "agentloop", 1.0, 1), rollout("t3", "agentloop", 0.0), rollout("t3", "agentloop", None, 1),
            rollout("t1", "codex", 0.0), rollout("t2", "codex", 0.0)]
    loop, codex = cells_of("sft", rows, ["agentloop", "codex"])
    # per-task means 0.5, 1.0, 0.0 (t3's infra error is not a sample)
    assert loop.pass1 == pytest.approx(0.5) and loop.tasks == 3 and loop.samples == 5 and loop.excluded == 1
    assert loop.se == pytest.approx(0.5 / math.sqrt(3))
    assert (codex.pass1, codex.se, codex.tasks, codex.samples) == (0.0, 0.0, 2, 2)
    assert standard_error([1.0]) == 0.0 and standard_error([]) == 0.0
    table = markdown([loop, codex])
    assert table.splitlines()[:3] == ["| policy | agentloop | codex |", "|---|---|---|", "| sft | 50.0 ± 28.9 | 0.0 ± 0.0 |"]
    assert "1 rollout(s) excluded" in table


def test_policies_are_name_equals_model_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert parse_policies([f"base={tmp_path}", f"sft.1={tmp_path}"]) == {"base": tmp_path, "sft.1": tmp_path}
    for bad, msg in ([f"{tmp_path}"], "expected NAME=MODEL_DIR"), ([f"a/b={tmp_path}"], "expected NAME=MODEL_DIR"), \
                    ([f"a={tmp_path}", f"a={tmp_path}"], "given twice"), ([f"a={tmp_path}/nope"], "not a model directory"), \
                    ([], "at least one"):
        with pytest.raises(UserError, match=msg):
            parse_policies(bad)


def test_an_evaluation_rerun_may_add_harnesses_and_samples_but_a_training_step_may_not(tmp_path: Path) -> None:
    """A rollout's id is its task, harness and sample index, so more harnesses or a larger n add rollouts
    to an evaluation's folder and keep the scored ones; fewer, other or a step's own are refused."""
    import io

    from clawgym.layout import StepLayout
    from clawgym.settings import rollout_rerun

    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop", "claude-code"], out=tmp_path / "p", group_size=2)
    A.write_config(StepLayout(cfg.out).rollout_config, dataclasses.asdict(cfg))  # as run_rollouts records it
    said = io.StringIO()
    grown = dataclasses.replace(cfg, harnesses=["agentloop", "codex", "claude-code"], group_size=3)
    rollout_rerun(grown, force=False, console=Console(file=said, width=400), evaluation=True)
    assert said.getvalue().strip() == (f'{cfg.out}: same settings as its rollouts; resuming (finished rollouts kept; adding the '
                                       f'rollouts of group_size: 2 → 3; harnesses: ["agentloop","claude-code"] → ["agentloop","codex","claude-code"])')
    for other, diff in ((dict(harnesses=["agentloop"]), "harnesses: "), (dict(harnesses=["agentloop", "codex"]), "harnesses: "),
                        (dict(group_size=1), "group_size: 2 → 1"), (dict(group_size=3, timeout_s=5.0), "timeout_s: ")):
        with pytest.raises(UserError, match=f"was made with other settings \\({diff}"):
            rollout_rerun(dataclasses.replace(cfg, **other), force=False, console=Console(file=io.StringIO()), evaluation=True)
    with pytest.raises(UserError, match=r"other settings \(group_size: 2 → 3; harnesses: .*\)"):  # a training step's rollouts never grow
        rollout_rerun(grown, force=False, console=Console(file=io.StringIO()))
    # a record written before the group size had its name says `n`: compared as the group size
    old = {("n" if k == "group_size" else k): v for k, v in dataclasses.asdict(cfg).items()}
    A.write_config(StepLayout(cfg.out).rollout_config, old)
    with pytest.raises(UserError, match=r"other settings \(group_size: 2 → 1\)"):
        rollout_rerun(dataclasses.replace(cfg, group_size=1), force=False, console=Console(file=io.StringIO()))


def test_the_compare_command_refuses_a_bad_policy_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "clawgym.cli", "compare", "--policy", f"base={tmp_path}", "--tasks", str(tmp_path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: --policy base: {tmp_path} is not a model directory (no config.json)"], proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compare_evaluates_every_policy_in_every_harness_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    """Through agentloop and the real Codex binary (served by the teacher, which solves every task):
    one folder per policy, one cell per (policy, harness), the table and its plot; a rerun adds no rollout."""
    from clawgym.rollout.harnesses import HARNESSES

    harnesses = ["agentloop"] + (["codex"] if HARNESSES["codex"]().missing() is None else [])
    make_tasks("lookup", tmp_path / "tasks", n=2, seed=0, split="heldout")
    cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=harnesses, out=tmp_path / "unused", group_size=2, concurrency=4,
                        engine="teacher", engine_options={"family": "lookup", "max_context": 65536}, timeout_s=300)
    out = tmp_path / "cmp"
    cells = compare({"a": tiny_model, "b": tiny_model}, cfg, out, Console(stderr=True))
    assert [(c.policy, c.harness) for c in cells] == [(p, h) for p in ("a", "b") for h in harnesses]
    assert all((c.pass1, c.se, c.tasks, c.samples, c.excluded) == (1.0, 0.0, 2, 4, 0) for c in cells)
    assert json.loads((out / "table.json").read_text())[0]["policy"] == "a"
    assert (out / "table.md").read_text().startswith("| policy | " + " | ".join(harnesses) + " |")
    assert (out / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = len(A.read_table(out / "a" / "rollouts.parquet", A.RolloutRecord))
    assert rows == 2 * 2 * len(harnesses)
    compare({"a": tiny_model}, cfg, out, Console(stderr=True))
    assert len(A.read_table(out / "a" / "rollouts.parquet", A.RolloutRecord)) == rows
    with pytest.raises(UserError, match=r"was made with other settings \(group_size: 2 → 1\)"):
        compare({"a": tiny_model}, dataclasses.replace(cfg, group_size=1), out, Console(stderr=True))
