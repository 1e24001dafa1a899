"""Rollouts as Ray tasks (`clawgym rollout --ray ADDRESS`, `RolloutConfig.ray`): one task per rollout.

The design (docs/scale.md): one **central proxy** in front of the engine, and rollouts fanned out
to the Ray cluster's nodes. Each task runs `one.run_one` on its node — register with the
proxy, open a sandbox there, run the harness, settle, verify — and returns the rollout's row to the
driver, which appends it to `results.jsonl` exactly as for a local rollout. The call records stay
where the proxy writes them (one folder, on the proxy's machine), so the driver collects them as
usual: nothing is copied between nodes, and a lost node only loses rollouts that had not finished
(`infra_error`, rerun by a resumed run).

Why central: records, TITO state and settling all live in one process, so attribution and resume
need no cross-node coordination; the proxy is light next to the engine (bench/soak.py: 100-165
streaming calls/s on two cores, 200 concurrent rollouts), and when one engine is not enough, the `remote` engine spreads
a rollout's calls over several vLLM/SGLang replicas with rollout-sticky routing.

The driver's thread pool still bounds how many rollouts are in flight (`--concurrency`); each
thread waits on its task. Tasks ask Ray for `ray_num_cpus` CPUs (default 1), so Ray places them on
nodes with room.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from clawgym.errors import UserError
from clawgym.rollout.config import RolloutConfig
from clawgym.rollout.harnesses import HARNESSES
from clawgym.rollout.one import RolloutPlan, infra_error_row, run_one
from clawgym.rollout.proxy_client import ProxyClient

_lock = threading.Lock()
_remote: Any = None


def ray_problem() -> str | None:
    """None if ray can be imported, else how to get it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed: pip install 'clawgym[ray]' (or 'ray[default]>=2.40,<3')"
    return None


def connect(address: str) -> None:
    """Join the cluster at `address` ('auto', 'local', HOST:PORT or ray://HOST:PORT), once per process."""
    problem = ray_problem()
    if problem:
        raise UserError(problem)
    import ray

    if ray.is_initialized():
        return
    try:
        if address == "local":  # a private instance on this machine (tests, a laptop)
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"cannot connect to the Ray cluster at {address!r}: {e}") from None


def _task(plan: RolloutPlan, proxy_url: str, admin_token: str, config: RolloutConfig) -> dict:
    """Runs on a Ray worker: one rollout, start to finish, against the central proxy."""
    harness = HARNESSES[plan.harness](**config.harness_options.get(plan.harness, {}))
    proxy = ProxyClient(proxy_url, admin_token, Path("."))  # the worker never reads records
    return run_one(plan, harness, proxy, config, {})


class RayRollouts:
    """Submit rollouts to Ray and wait for their rows (see the module docstring)."""

    def __init__(self, config: RolloutConfig, proxy_url: str, admin_token: str):
        global _remote
        connect(config.ray)
        import ray

        with _lock:
            if _remote is None:
                _remote = ray.remote(max_retries=0)(_task)  # a rerun is the runner's job (resume), not Ray's
        self.ray, self.config = ray, config
        self.proxy_url, self.admin_token = proxy_url, admin_token
        self.options = {"num_cpus": config.ray_num_cpus}

    def run(self, plan: RolloutPlan) -> dict:
        """Run one rollout as a Ray task; blocks the calling thread until its row is back."""
        ref = _remote.options(**self.options).remote(plan, self.proxy_url, self.admin_token, self.config)
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as e:  # the node or worker died: the rollout is not scored
            return infra_error_row(plan, self.config, f"ray task failed: {type(e).__name__}: {str(e)[:300]}")
