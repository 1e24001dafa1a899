"""Rollouts fanned out as Ray tasks (`RolloutConfig.ray`, `clawgym rollout --ray`) on a local Ray instance.

The proxy is central (in the driver, on 127.0.0.1); each rollout runs in a Ray worker process with
its own sandbox and harness; rows come back to the driver's results.jsonl and the records are
collected from the proxy's folder, as for a local run. Skipped with the reason when ray is absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.rollout.distributed import ray_problem

from helpers import CHECK_HI, make_task, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ray_problem() is not None, reason=str(ray_problem()))]



@pytest.fixture(scope="module")
def ray_local():
    import ray

    # Workers must import the clawgym under test (not another install on this machine).
    src = str(Path(__file__).resolve().parents[2] / "src")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,  # a new private instance
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}})
    try:
        yield ray
    finally:
        ray.shutdown()


def setup(tmp_path: Path, tiny_model: Path, **kw):
    from clawgym.rollout.runner import RolloutConfig

    for t in ("a", "b"):
        make_task(tmp_path / "tasks", t, check=CHECK_HI)
    items = {}
    for t in ("a", "b"):
        for i in range(2):
            text = "hi" if i == 0 else "bye"
            items[f"{t}.agentloop.{i}"] = [tool_call("write", path="out.txt", content=text), "Done."]
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": r, "text": x}) + "\n" for r, xs in items.items() for x in xs))
    return RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", group_size=2, concurrency=4,
                         model=tiny_model, engine="scripted", engine_options={"script": str(script)}, ray="local", **kw)


def test_rollouts_run_as_ray_tasks_and_gather_into_the_run_dir(ray_local, tmp_path: Path, tiny_model: Path, monkeypatch):
    from clawgym.rollout import distributed
    from clawgym.rollout.runner import run_rollouts

    submitted = []
    real = distributed.RayRollouts.run
    monkeypatch.setattr(distributed.RayRollouts, "run", lambda self, plan: submitted.append(plan.rollout_id) or real(self, plan))
    summary = run_rollouts(setup(tmp_path, tiny_model))
    assert sorted(submitted) == ["a.agentloop.0", "a.agentloop.1", "b.agentloop.0", "b.agentloop.1"]
    by_id = {r.rollout_id: r for r in summary.rollouts}
    assert {k: (r.status, r.reward) for k, r in by_id.items()} == {
        "a.agentloop.0": ("ok", 1.0), "a.agentloop.1": ("ok", 0.0), "b.agentloop.0": ("ok", 1.0), "b.agentloop.1": ("ok", 0.0)}
    # gathered into the run directory: rows, records, tables
    out = tmp_path / "out"
    assert len(A.read_jsonl(out / "results.jsonl").records) == 4
    calls = A.read_table(out / "calls.parquet", A.CallRecord)
    assert len(calls) == 8 and {c.rollout_id for c in calls} == set(by_id)
    assert sorted(p.name for p in (out / "records").glob("*.jsonl")) == sorted(f"{r}.jsonl" for r in by_id)
    assert len(A.read_table(out / "rollouts.parquet", A.RolloutRecord)) == 4
    assert json.loads((out / "rollout.config.json").read_text())["ray"] == "local"
    assert all("/ray:" in r.node for r in summary.rollouts)  # each row says which Ray node ran it


def test_a_dead_worker_is_an_infra_error_and_the_others_are_kept(ray_local, tmp_path: Path, tiny_model: Path, monkeypatch):
    """A node or worker lost mid-rollout: that rollout is infra_error (excluded); the rest are kept."""
    from clawgym.rollout import distributed
    from clawgym.rollout.runner import run_rollouts

    def crash_one(plan, *args):
        if plan.rollout_id == "a.agentloop.1":
            os._exit(1)  # the worker process dies, as on a lost node
        return distributed._task(plan, *args)

    monkeypatch.setattr(distributed, "_remote", ray_local.remote(max_retries=0)(crash_one))
    cfg = setup(tmp_path, tiny_model)
    summary = run_rollouts(cfg)
    by_id = {r.rollout_id: r for r in summary.rollouts}
    dead = by_id["a.agentloop.1"]
    assert dead.status == "infra_error" and dead.reward is None and "ray task failed" in dead.error
    assert all(r.status == "ok" for k, r in by_id.items() if k != "a.agentloop.1")

