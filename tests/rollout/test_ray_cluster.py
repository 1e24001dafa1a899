"""A local multi-node Ray cluster on 127.0.0.1: a head (no CPUs, as in docs/scale.md) and two worker
nodes, each its own raylet; `clawgym rollout --ray HEAD` joins it from another process, as a user
does, with the central proxy in that driver. Every rollout runs on a worker node, both workers
get some, and rows, records and tables land in the run directory. Killing a worker node's raylet
mid-step turns its rollouts into `infra_error` and a rerun resumes them on the node left. And
`clawgym run` with a `[ray]` section trains a step whose rollouts ran on the worker nodes.

Ray maps a 127.0.0.1 cluster address to the host's interface address unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (its single-machine mode), so the test sets it for every
process it starts: all traffic stays on loopback. Skipped with the reason when ray is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.rollout.distributed import ray_problem

from helpers import CHECK_HI, make_task, script, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ray_problem() is not None, reason=str(ray_problem()))]

SRC = str(Path(__file__).resolve().parents[2] / "src")
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def cluster(monkeypatch):
    """Head (0 CPUs) + 2 worker nodes (1 CPU each), all bound to 127.0.0.1."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    for k, v in LOOPBACK_ENV.items():  # inherited by the raylets and their workers
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # ray may be imported already
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                      "include_dashboard": False})
    try:
        workers = [c.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(2)]
        yield c, c.head_node, workers
    finally:
        c.shutdown()


def make_tasks(root: Path, ids: list[str]) -> None:
    for task_id in ids:
        make_task(root, task_id, check=CHECK_HI)


def write_script(path: Path, ids: list[str], n: int, *, delay_last: float = 0.0) -> Path:
    """Sample 0 of each task writes 'hi' (reward 1), the others 'bye' (0); each rollout ends with 'Done.'."""
    return script(path, {f"{t}.agentloop.{i}": [tool_call("write", path="out.txt", content="hi" if i == 0 else "bye"),
                                                {"text": "Done.", "delay_s": delay_last}] for t in ids for i in range(n)})


def rollout_cmd(c, tmp_path: Path, tiny_model: Path, n: int, concurrency: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "clawgym.cli", "rollout", "--tasks", str(tmp_path / "tasks"), "--harness", "agentloop",
            "--group-size", str(n), "--concurrency", str(concurrency), "--model", str(tiny_model), "--engine", "scripted",
            "--script", str(tmp_path / "script.jsonl"), "--out", str(tmp_path / "out"), "--ray", c.address, *extra]


def test_rollouts_spread_over_the_worker_nodes_of_a_local_cluster(cluster, tmp_path: Path, tiny_model: Path):
    c, head, workers = cluster
    ids = ["a", "b", "c", "d"]
    make_tasks(tmp_path / "tasks", ids)
    write_script(tmp_path / "script.jsonl", ids, 2)
    # The proxy listens on every interface, as on a real cluster, and is advertised at this node's
    # Ray address (here 127.0.0.1).
    r = subprocess.run(rollout_cmd(c, tmp_path, tiny_model, 2, 4, "--proxy-host", "0.0.0.0"), capture_output=True,
                       text=True, timeout=300, env={**os.environ, **LOOPBACK_ENV})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "8 rollouts (ok: 8)" in r.stdout
    out = tmp_path / "out"
    rows = A.read_table(out / "rollouts.parquet", A.RolloutRecord)
    assert {(x.rollout_id, x.reward) for x in rows} == {(f"{t}.agentloop.{i}", 1.0 - i) for t in ids for i in range(2)}
    nodes = {x.node.split("/ray:")[-1] for x in rows}
    assert nodes <= {w.node_id for w in workers} and len(nodes) == 2, nodes  # both workers, never the head
    assert head.node_id not in nodes
    calls = A.read_table(out / "calls.parquet", A.CallRecord)
    assert len(calls) == 16 and {x.rollout_id for x in calls} == {x.rollout_id for x in rows}
    assert len(list((out / "records").glob("*.jsonl"))) == 8
    shown = subprocess.run([sys.executable, "-m", "clawgym.cli", "inspect", str(out / "rollouts.parquet")],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert "per node" in shown.stdout and all(w.node_id[:8] in shown.stdout for w in workers), shown.stdout


def test_a_lost_worker_node_leaves_infra_errors_and_a_rerun_resumes_them(cluster, tmp_path: Path, tiny_model: Path):
    c, head, workers = cluster
    ids = ["a", "b"]
    make_tasks(tmp_path / "tasks", ids)
    write_script(tmp_path / "script.jsonl", ids, 2, delay_last=6.0)  # the first two are mid-call when the node dies
    env = {**os.environ, **LOOPBACK_ENV}
    proc = subprocess.Popen(rollout_cmd(c, tmp_path, tiny_model, 2, 2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    records = tmp_path / "out" / "records"
    deadline = time.monotonic() + 120
    while len(list(records.glob("*.jsonl"))) < 2 and time.monotonic() < deadline:  # a rollout on each worker
        time.sleep(0.2)                                                            # has made its first call
    time.sleep(0.5)
    c.remove_node(workers[1], allow_graceful=False)  # the node is lost: its raylet and workers die
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    rows = {x.rollout_id: x for x in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    lost = [x for x in rows.values() if x.status == "infra_error"]
    assert lost and all("ray task failed" in x.error and x.reward is None for x in lost), rows
    assert all(x.status == "ok" for x in rows.values() if x not in lost)
    # Rerun into the same --out: kept rollouts stay, the lost ones run again on the node left.
    r = subprocess.run(rollout_cmd(c, tmp_path, tiny_model, 2, 2), capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    again = {x.rollout_id: x for x in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert set(again) == set(rows) and {x.status for x in again.values()} == {"ok"}
    assert {again[k].reward for k in again} == {0.0, 1.0}
    assert all(again[k].node.endswith(workers[0].node_id) for k in (x.rollout_id for x in lost))


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_recipe_with_a_ray_section_trains_on_rollouts_from_the_worker_nodes(cluster, tmp_path: Path, max_staleness: int):
    """Synchronous, and asynchronous (step 2's Ray tasks run while step 1 trains)."""
    from toy import write_toy_recipe

    c, head, workers = cluster
    steps = 1 + max_staleness
    recipe = write_toy_recipe(tmp_path, "ray-run", steps=steps, n=4, tasks=2, concurrency=4)
    recipe.write_text(recipe.read_text().replace("[run]\n", f"[run]\nmax_staleness = {max_staleness}\n")
                      + f'\n[ray]\naddress = "{c.address}"\nproxy_host = "0.0.0.0"\n')
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(recipe)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env={**os.environ, **LOOPBACK_ENV})
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ray-run"
    for step in range(1, steps + 1):
        rows = A.read_table(run_dir / f"step-{step:04d}" / "rollouts.parquet", A.RolloutRecord)
        assert len(rows) == 8 and {x.status for x in rows} == {"ok"}
        assert {x.node.split("/ray:")[-1] for x in rows} <= {w.node_id for w in workers}
        assert (run_dir / "checkpoints" / f"step-{step:04d}" / "model.safetensors").exists()
    assert [m.step for m in A.read_metrics(run_dir / "metrics.jsonl")] == list(range(1, steps + 1))
