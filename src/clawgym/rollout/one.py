"""One rollout, read top to bottom (`run_one`): used by the runner's threads and by Ray workers alike.

1. register the rollout with the proxy → its own base URL and API key;
2. open a sandbox seeded with the task's workspace, reaching the proxy (and nothing else);
3. launch the harness with the task's instruction; wait for it to exit or for the wall-clock
   timeout (the sandbox kills the whole process group);
4. settle: wait until the proxy has no call of this rollout in flight and its record count holds;
5. build the rollout's transcript (its harness adapter, from the proxy's conversation log and the
   harness's output) and read each call's role from that log (`call_roles`); copy the hidden tests
   in and run the verifier on the final workspace with it; close the rollout and the sandbox. The
   caller (runner.py) appends the row (with the roles under "call_roles") and the transcript.

Failure policy (paper §3.4): a timeout is scored as is, and so is a rollout that asked for more
model calls than `[rollout] max_calls` allows (the proxy refuses that call, the harness ends on
the refusal; status `timeout`, its error says which bound); a harness that fails on its own is
`harness_error` (scored as is: a crash is the policy's outcome too), and so is one whose last
request was refused as longer than the model's context window (`context_length_exceeded: ...` in
its error, docs/harnesses.md); a sandbox, proxy or start failure is `infra_error` with a null
reward, excluded from training, and so is a timeout or harness error whose last model call failed
in the engine (the harness gave up on it, or was still retrying it). A task whose check crashed
(verifier.py) is `check_error`, its reward null: excluded like an infra error, since the rollout
cannot be read from a broken check. When several things fail at
once, the root cause is judged by a fixed order of evidence (`failure.py`), not by which symptom
arrived first.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from clawgym import artifacts as A
from clawgym.rollout.config import RolloutConfig
from clawgym.rollout.failure import Evidence, root_cause
from clawgym.rollout.harnesses import Endpoint, Harness
from clawgym.rollout.harnesses.base import call_roles
from clawgym.rollout.proxy_client import ProxyClient, ProxyUnavailable
from clawgym.rollout.sandbox import ProxyEndpoint, Sandbox, SandboxConfig, open_sandbox
from clawgym.rollout.verifier import verify
from clawgym.tasks import Task


@dataclass(frozen=True)
class RolloutPlan:
    """One rollout to run: a task, a harness, which sample of the group."""

    task: Task
    harness: str
    sample_index: int

    prefix: str = ""
    """keeps ids unique across the rollout runs that share one proxy (a run's steps and evals)"""

    @property
    def rollout_id(self) -> str:
        return f"{self.prefix}{self.task.id}.{self.harness}.{self.sample_index}"

    @property
    def group_id(self) -> str:
        return f"{self.task.id}/{self.harness}"



def _record(plan: RolloutPlan, config: RolloutConfig, **fields: Any) -> A.RolloutRecord:
    """The rollout's row before it ran: infra_error, no reward, until the run says otherwise."""
    return A.RolloutRecord(rollout_id=plan.rollout_id, task_id=plan.task.id, harness=plan.harness, group_id=plan.group_id,
                           sample_index=plan.sample_index, status="infra_error", reward=None, n_calls=0, wall_time_s=0.0,
                           policy_version=config.policy_version, category=plan.task.category, step=config.step, **fields)


def run_one(plan: RolloutPlan, harness: Harness, proxy: ProxyClient, config: RolloutConfig,
            open_sandboxes: dict[str, Sandbox]) -> dict:
    """Run one rollout start to finish (steps 1-5 of the module docstring) and return its row as a dict,
    its calls' roles under "call_roles" ({seq as a string: role}), its transcript under "transcript";
    `open_sandboxes` holds its sandbox while it runs (Ctrl-C closes them)."""
    task, rid = plan.task, plan.rollout_id
    rec = _record(plan, config, node=this_node())
    t0 = time.monotonic()
    sb, transcript, roles = None, None, {}
    evidence = Evidence()  # every symptom first; the root cause is judged once, by a fixed order (failure.py)
    final = None
    try:
        try:
            # 1. register with the proxy
            reg = proxy.register(rid, max_calls=config.max_calls)
        except Exception as e:
            evidence.add("infra", f"{type(e).__name__}: {e}")
        try:
            if evidence.found:
                raise _Skipped
            # 2. a fresh sandbox seeded from the task's workspace
            sb_config = SandboxConfig(network=config.network, proxy=ProxyEndpoint(proxy.port, host=proxy.host),
                                      hide=[Path(config.tasks).resolve()])
            sb = open_sandbox(config.sandbox, task.workspace_dir, sb_config, sandbox_id=rid.replace("/", "_"))
            open_sandboxes[rid] = sb
        except _Skipped:
            pass
        except Exception as e:
            evidence.add("sandbox_setup", f"{type(e).__name__}: {e}")
        if sb is not None:
            try:
                final, transcript, roles = _run_harness(plan, harness, proxy, config, sb, reg["api_key"], evidence, rec)
            except Exception as e:  # a proxy or disk failure, or one rollout's bug: excluded and reported
                evidence.add("infra", f"{type(e).__name__}: {e}")
            _check_sandbox(sb, evidence)
        # 5. the root cause decides the status; only what the policy did (ok, its crash, its timeout) is scored
        cause = root_cause(evidence)
        rec.status, rec.error = (cause[1], cause[2]) if cause else ("ok", "")
        blocked = sb.blocked_attempts() if sb is not None else []
        if blocked:
            rec.error = (rec.error + "; " if rec.error else "") + f"{len(blocked)} outside connection(s) refused"
        if rec.status != "infra_error":
            try:
                result = verify(task, sb, transcript=transcript, final_message=final, config=config.verifier)
                rec = result.apply(rec)  # appends its error
                if result.check_error:  # the task's check crashed: nothing the policy did can be read from it
                    rec.status = "check_error"
            except Exception as e:
                evidence.add("infra", f"verifier: {type(e).__name__}: {e}")
                _check_sandbox(sb, evidence)
                _, rec.status, rec.error = root_cause(evidence)
                rec.reward = None
    finally:
        if sb is not None:
            open_sandboxes.pop(rid, None)
            sb.close()
        proxy.close_rollout(rid)
    rec.wall_time_s = time.monotonic() - t0
    row = dataclasses.asdict(rec) | {"call_roles": {str(seq): role for seq, role in roles.items()}}
    return row | ({"transcript": transcript.to_json()} if transcript is not None else {})


def _transcript(harness: Harness, proxy: ProxyClient, plan: RolloutPlan, stdout: str, api_key: str) -> tuple[A.Transcript, dict[int, str]]:
    """The rollout's transcript, built by its harness adapter from the proxy's conversation log and its output,
    with the rollout's API key blanked (a tool that prints the environment must not put it into an artifact);
    and the role of each call (seq -> role) its adapter reads from that log."""
    try:
        calls = proxy.conversation(plan.rollout_id)
    except ProxyUnavailable:  # a proxy without the conversation route: the harness's own output alone
        calls = []
    t = harness.transcript(stdout, calls)
    t.rollout_id, t.harness = plan.rollout_id, plan.harness
    text = orjson.dumps(t.to_json()).decode()
    if api_key and api_key in text:  # the key is letters, digits and '-': it never spans a JSON escape
        t = A.Transcript.from_json(orjson.loads(text.replace(api_key, "<redacted>")))
    return t, call_roles(harness, calls)


def _run_harness(plan: RolloutPlan, harness: Harness, proxy: ProxyClient, config: RolloutConfig, sb: Sandbox, api_key: str,
                 evidence: Evidence, rec: A.RolloutRecord) -> tuple[str | None, A.Transcript, dict[int, str]]:
    """Steps 3-4 of a rollout: launch the harness, wait, settle the records; what went wrong goes to
    `evidence`. Returns the agent's final message, the rollout's transcript and its calls' roles."""
    # a namespaced sandbox reaches the proxy at 127.0.0.1 through its relay; others (and a proxy
    # on another node, with Ray) at the proxy's own address
    host = proxy.host if sb.network in ("host", "blackhole") else "127.0.0.1"
    endpoint = Endpoint(base_url=f"http://{host}:{proxy.port}/r/{plan.rollout_id}", api_key=api_key)
    # 3. the harness, until it exits or the clock runs out
    launch = harness.launch(plan.task.instruction, Path(sb.path_inside(sb.workspace)), Path(sb.path_inside(sb.home)), endpoint)
    launch.write_files(Path(sb.home))
    timeout = config.timeout_s or plan.task.agent_timeout_s
    run = sb.run(launch.argv, env=launch.env, timeout=timeout, name="harness")
    # 4. settle the proxy's records of this rollout
    status = proxy.settle(plan.rollout_id, timeout=config.settle_timeout_s)
    rec.n_calls = status["calls_recorded"]
    if status["calls_recorded"] < status["calls_started"]:  # e.g. the records disk is full
        evidence.add("infra", f"{status['calls_started'] - status['calls_recorded']} of {status['calls_started']} "
                              "calls could not be recorded (see the proxy's log)")
    final, ended_ok = None, False
    transcript, roles = _transcript(harness, proxy, plan, run.stdout(), api_key)
    overflow = status.get("context_exceeded")  # its last request did not fit, and no call came after it
    budget = f"{config.max_calls} model calls ([rollout] max_calls)" if status.get("call_budget_spent") else ""
    if run.timed_out:
        evidence.add("timeout", f"killed after {timeout:.0f} s" + (f"; context_length_exceeded: {overflow}" if overflow else "")
                     + (f"; call budget spent: {budget}" if budget else ""))
    else:
        outcome = harness.outcome(run.exit_code if run.exit_code is not None else -1, run.stdout(), run.stderr())
        final, ended_ok = outcome.final_message, outcome.status == "ok"
        if budget:  # it ended on the proxy's refusal of one call too many: the policy's ending, scored as it stands
            evidence.add("budget", budget)
            ended_ok = False
        else:
            if overflow:  # the policy's own ending, scored, whatever the harness called the refusal
                evidence.add("context", overflow)
                ended_ok = False
            if outcome.status == "harness_error":
                evidence.add("harness", outcome.message)
            elif outcome.status == "infra_error":  # the harness's word that its endpoint failed: a symptom
                evidence.add("endpoint", outcome.message)
    if not ended_ok and (failed := _engine_failed_last(status)):
        # it gave up on (or was still retrying) a failing engine: the infrastructure's fault, not the policy's
        evidence.add("engine", f"the last call failed there ({failed})")
    return final, transcript, roles


class _Skipped(Exception):
    """The sandbox is not opened: the proxy refused the rollout already."""


def _check_sandbox(sb: Sandbox, evidence: Evidence) -> None:
    """Evidence that the sandbox's own folders vanished under the rollout (deleted by hand, a cleaner, a full reset)."""
    missing = [name for name in ("workspace", "home", "logs") if not Path(getattr(sb, name)).is_dir()]
    if missing:
        evidence.add("sandbox_gone", f"its {' and '.join(missing)} folder{'s' if len(missing) > 1 else ''} "
                                     f"({Path(sb.workspace).parent}) disappeared while the rollout ran")


def this_node() -> str:
    """Where this process runs, for the rollout row: the host name, plus the Ray node id inside a Ray worker."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # imported only by --ray runs
    if ray is not None and ray.is_initialized():
        return f"{host}/ray:{ray.get_runtime_context().get_node_id()}"
    return host


def infra_error_row(plan: RolloutPlan, config: RolloutConfig, error: str) -> dict:
    """The row of a rollout that could not run at all (e.g. its Ray worker died): excluded, not scored."""
    return dataclasses.asdict(_record(plan, config, error=error))


def _engine_failed_last(settled: dict) -> str:
    """The engine's error if the rollout's last answered call (abandoned ones aside) failed there, else ''.

    Read from the proxy's settled status rather than the records, which a Ray worker on another
    node cannot see."""
    return (settled.get("last_call_error") or "engine_error") if settled.get("last_call_status") == "engine_error" else ""
