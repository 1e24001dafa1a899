"""The rollout runner: tasks × harnesses × n samples, each in its own sandbox against the proxy.

One rollout, read top to bottom (`_run_one`):

1. register the rollout with the proxy → its own base URL and API key;
2. open a sandbox seeded with the task's workspace, reaching the proxy (and nothing else);
3. launch the harness with the task's instruction; wait for it to exit or for the wall-clock
   timeout (the sandbox kills the whole process group);
4. settle: wait until the proxy has no call of this rollout in flight and its record count holds;
5. build the rollout's transcript (its harness adapter, from the proxy's conversation log and the
   harness's output); copy the hidden tests in and run the verifier on the final workspace with it;
6. append the rollout's row to `results.jsonl` and its transcript to `transcripts.jsonl` (both
   fsync'd), close the rollout and the sandbox.

Failure policy (paper §3.4): a timeout is scored as is; a harness that fails on its own is
`harness_error` (scored as is: a crash is the policy's outcome too), and so is one whose last
request was refused as longer than the model's context window (`context_length_exceeded: ...` in
its error, docs/harnesses.md); a sandbox, proxy or start
failure is `infra_error` with a null reward, excluded from training, and so is a timeout or harness
error whose last model call failed in the engine (the harness gave up on it, or was still retrying
it). When several things fail at once, the root cause is judged by a fixed order of evidence
(`failure.py`), not by which symptom arrived first. One rollout's failure never stops the others. Ctrl-C closes every open sandbox and keeps what finished. Rerunning into the same
`--out` skips rollouts already in `results.jsonl`, so a killed run resumes without losing or
duplicating a rollout; a rollout that had not finished, or ended as `infra_error` (a lost node, an
engine outage: nothing the policy did), is run again from scratch, and its new row supersedes the
old one (the last row of a rollout id in `results.jsonl` is the one kept).

At the end the runner writes `rollouts.parquet` and `calls.parquet` (prompts delta-encoded as
recorded, each call's role classified by its harness adapter) plus `rollout.config.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from clawgym import artifacts as A
from clawgym.console import STDERR
from clawgym.errors import UserError
from clawgym.layout import StepLayout
from clawgym.rollout.failure import Evidence, root_cause
from clawgym.rollout.harnesses import HARNESSES, Endpoint, Harness
from clawgym.rollout.proxy_client import ProxyClient, ProxyUnavailable, start_local_proxy
from clawgym.rollout.sandbox import ProxyEndpoint, SandboxConfig, open_sandbox
from clawgym.rollout.verifier import VerifierConfig, verify
from clawgym.tasks import Task, load_tasks


@dataclass
class RolloutConfig:
    """Everything one `clawgym rollout` call needs; saved as rollout.config.json beside the output."""

    tasks: Path
    harnesses: list[str]
    out: Path
    n: int = 1
    concurrency: int = 4
    model: Path | None = None
    """start a proxy in process serving this model (else use `proxy_url`)"""
    engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    """the in-process proxy renders with this Jinja file or shipped template instead of the model's"""
    proxy_url: str | None = None
    admin_token: str | None = None
    records: Path | None = None
    """where an external proxy writes its records (it must be on this machine's filesystem)"""
    timeout_s: float | None = None
    """wall-clock limit per rollout; default: each task's [agent] timeout_sec"""
    sandbox: str = "local"
    network: str = "auto"
    step: int = 0
    policy_version: int = 0
    settle_timeout_s: float = 30.0
    harness_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """constructor arguments per harness name, e.g. {"agentloop": {"max_turns": 4}}"""
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    id_prefix: str = ""
    """prefix of every rollout id (default: s<step>. for a loop step, none otherwise)"""
    task_filter: list[str] = field(default_factory=list)
    """only these task ids (default: all)"""
    ray: str | None = None
    """run each rollout as a Ray task on this cluster: 'auto', 'local', HOST:PORT or ray://HOST:PORT (distributed.py)"""
    ray_num_cpus: float = 1.0
    """CPUs each rollout task asks Ray for"""
    proxy_host: str = "127.0.0.1"
    """where the in-process proxy (`model`) listens; 0.0.0.0 lets other nodes of a Ray cluster reach it"""
    tool_parser: str = "auto"
    """the in-process proxy's tool-call parser (a name in clawgym.proxy.toolparse.PARSERS, or auto)"""


@dataclass
class RolloutSummary:
    out: Path
    rollouts: list[A.RolloutRecord]
    n_calls: int
    wall_time_s: float

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.rollouts if r.reward is not None]
        return statistics.fmean(rewards) if rewards else None

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rollouts:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        """The figures a script needs (`clawgym rollout --json`): counts, the reward's mean and sample
        std over scored rollouts, the policy versions that answered the calls, and the tables written."""
        import pyarrow.parquet as pq

        rewards = [r.reward for r in self.rollouts if r.reward is not None]
        out = StepLayout(Path(self.out))
        calls = out.calls
        versions = sorted(set(pq.read_table(calls, columns=["policy_version"]).column(0).to_pylist())) if calls.exists() else []
        return {"out": Path(self.out).resolve(), "rollouts": len(self.rollouts), "status": self.status_counts(),
                "scored": len(rewards), "mean_reward": self.mean_reward,
                "reward_std": statistics.stdev(rewards) if len(rewards) > 1 else None, "calls": self.n_calls,
                "policy_versions": versions, "wall_time_s": round(self.wall_time_s, 3),
                "rollouts_parquet": out.rollouts.resolve(), "calls_parquet": calls.resolve()}


@dataclass(frozen=True)
class _Plan:
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


def _load(config: RolloutConfig) -> tuple[list[Task], dict[str, Harness]]:
    unknown = [h for h in config.harnesses if h not in HARNESSES]
    if unknown:
        raise UserError(f"unknown harness '{unknown[0]}'; choose from: {', '.join(HARNESSES)}")
    if config.n < 1 or config.concurrency < 1:
        raise UserError(f"--n and --concurrency must be at least 1 (got {config.n}, {config.concurrency})")
    if stray := sorted(set(config.harness_options) - set(HARNESSES)):
        raise UserError(f"options given for unknown harness '{stray[0]}'; choose from: {', '.join(HARNESSES)}")
    harnesses = {}
    for name in config.harnesses:
        try:
            harnesses[name] = HARNESSES[name](**config.harness_options.get(name, {}))
        except TypeError as e:
            raise UserError(f"bad options for harness '{name}': {e}") from None
        if (why := harnesses[name].missing()) is not None:
            raise UserError(why)
    tasks = load_tasks(config.tasks)
    if config.task_filter:
        tasks = [t for t in tasks if t.id in set(config.task_filter)]
    if not tasks:
        raise UserError(f"no tasks found in {config.tasks}")
    return tasks, harnesses


def run_rollouts(config: RolloutConfig, console: Console | None = None, proxy: ProxyClient | None = None) -> RolloutSummary:
    """Run every planned rollout (see the module docstring); `proxy` reuses a running proxy."""
    console = console or STDERR
    tasks, harnesses = _load(config)
    out = StepLayout(Path(config.out))
    out.path.mkdir(parents=True, exist_ok=True)
    A.write_config(out.rollout_config, config)
    results_path = out.results
    done = {r["rollout_id"]: r for r in A.read_jsonl(results_path).records} if results_path.exists() else {}
    prefix = config.id_prefix or (f"s{config.step:04d}." if config.step else "")
    plans = [_Plan(t, h, i, prefix) for t in tasks for h in config.harnesses for i in range(config.n)]
    todo = [p for p in plans if p.rollout_id not in done or done[p.rollout_id]["status"] == "infra_error"]
    done = {k: r for k, r in done.items() if r["status"] != "infra_error"}
    t0 = time.monotonic()

    if proxy is not None:
        context = contextlib.nullcontext(proxy)
    else:
        context = start_local_proxy(config, out.records) if config.model else ProxyClient.connect(config)
    with context as proxy:
        for p in todo:  # a rollout that did not finish last time starts from scratch
            proxy.discard_records(p.rollout_id)
        results = A.JsonlWriter(results_path)
        transcripts = A.JsonlWriter(out.transcripts)
        state = _Progress(console, len(plans), len(done))
        open_sandboxes: dict[str, Any] = {}
        lock = threading.Lock()
        interrupted = threading.Event()
        remote = None
        if config.ray:
            from clawgym.rollout.distributed import RayRollouts

            remote = RayRollouts(config, proxy.url, proxy.admin_token)

        def one(plan: _Plan) -> dict:
            state.started()
            if remote is not None:  # the rollout runs on a Ray worker; its row comes back here
                rec = remote.run(plan)
            else:
                rec = _run_one(plan, harnesses[plan.harness], proxy, config, open_sandboxes)
            transcript = rec.pop("transcript", None)  # travels with the row (from a Ray worker too), saved apart
            if interrupted.is_set():  # cut short by Ctrl-C (its sandbox closed): not finished, so a rerun runs it again
                return rec
            with lock:
                results.append(rec)
                if transcript is not None:
                    transcripts.append(transcript)
            state.finished(rec)
            return rec

        pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="rollout")
        try:
            with state.live():
                futures = [pool.submit(one, p) for p in todo]
                for f in as_completed(futures):
                    done[f.result()["rollout_id"]] = f.result()
        except KeyboardInterrupt:
            interrupted.set()
            console.print("[yellow]interrupted: closing sandboxes, keeping finished rollouts[/]")
            pool.shutdown(wait=False, cancel_futures=True)
            for sb in list(open_sandboxes.values()):
                sb.close()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            results.close()
            transcripts.close()
        rollouts = [A.rows_from_dicts([done[p.rollout_id]], A.RolloutRecord, results_path)[0] for p in plans if p.rollout_id in done]
        calls = proxy.collect_calls([r.rollout_id for r in rollouts], copy_to=out.records)
    calls = _classify(calls, {p.rollout_id: harnesses[p.harness] for p in plans}, config.model or proxy.model_dir)
    A.write_table(out.calls, calls, A.CallRecord)
    A.write_table(out.rollouts, rollouts, A.RolloutRecord)
    return RolloutSummary(out.path, rollouts, len(calls), time.monotonic() - t0)


def _record(plan: _Plan, config: RolloutConfig, **fields: Any) -> A.RolloutRecord:
    """The rollout's row before it ran: infra_error, no reward, until the run says otherwise."""
    return A.RolloutRecord(rollout_id=plan.rollout_id, task_id=plan.task.id, harness=plan.harness, group_id=plan.group_id,
                           sample_index=plan.sample_index, status="infra_error", reward=None, n_calls=0, wall_time_s=0.0,
                           policy_version=config.policy_version, category=plan.task.category, step=config.step, **fields)


def _run_one(plan: _Plan, harness: Harness, proxy: "ProxyClient", config: RolloutConfig, open_sandboxes: dict) -> dict:
    task, rid = plan.task, plan.rollout_id
    rec = _record(plan, config, node=this_node())
    t0 = time.monotonic()
    sb, transcript = None, None
    evidence = Evidence()  # every symptom first; the root cause is judged once, by a fixed order (failure.py)
    final = None
    try:
        try:
            # 1. register with the proxy
            reg = proxy.register(rid)
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
                final, transcript = _run_harness(plan, harness, proxy, config, sb, reg["api_key"], evidence, rec)
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
                rec = verify(task, sb, transcript=transcript, final_message=final, config=config.verifier).apply(rec)  # appends its error
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
    return dataclasses.asdict(rec) | ({"transcript": transcript.to_json()} if transcript is not None else {})


def _transcript(harness: Harness, proxy: "ProxyClient", plan: _Plan, stdout: str, api_key: str) -> A.Transcript:
    """The rollout's transcript, built by its harness adapter from the proxy's conversation log and its output,
    with the rollout's API key blanked: a tool that prints the environment must not put it into an artifact."""
    try:
        calls = proxy.conversation(plan.rollout_id)
    except ProxyUnavailable:  # a proxy without the conversation route: the harness's own output alone
        calls = []
    t = harness.transcript(stdout, calls)
    t.rollout_id, t.harness = plan.rollout_id, plan.harness
    text = orjson.dumps(t.to_json()).decode()
    if api_key and api_key in text:  # the key is letters, digits and '-': it never spans a JSON escape
        t = A.Transcript.from_json(orjson.loads(text.replace(api_key, "<redacted>")))
    return t


def _run_harness(plan: _Plan, harness: Harness, proxy: "ProxyClient", config: RolloutConfig, sb: Any, api_key: str,
                 evidence: Evidence, rec: A.RolloutRecord) -> tuple[str | None, A.Transcript]:
    """Steps 3-4 of a rollout: launch the harness, wait, settle the records; what went wrong goes to
    `evidence`. Returns the agent's final message and the rollout's transcript."""
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
    final, ended_ok, transcript = None, False, _transcript(harness, proxy, plan, run.stdout(), api_key)
    overflow = status.get("context_exceeded")  # its last request did not fit, and no call came after it
    if run.timed_out:
        evidence.add("timeout", f"killed after {timeout:.0f} s" + (f"; context_length_exceeded: {overflow}" if overflow else ""))
    else:
        outcome = harness.outcome(run.exit_code if run.exit_code is not None else -1, run.stdout(), run.stderr())
        final, ended_ok = outcome.final_message, outcome.status == "ok"
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
    return final, transcript


class _Skipped(Exception):
    """The sandbox is not opened: the proxy refused the rollout already."""


def _check_sandbox(sb: Any, evidence: Evidence) -> None:
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


def infra_error_row(plan: _Plan, config: RolloutConfig, error: str) -> dict:
    """The row of a rollout that could not run at all (e.g. its Ray worker died): excluded, not scored."""
    return dataclasses.asdict(_record(plan, config, error=error))


def _engine_failed_last(settled: dict) -> str:
    """The engine's error if the rollout's last answered call (abandoned ones aside) failed there, else ''.

    Read from the proxy's settled status rather than the records, which a Ray worker on another
    node cannot see."""
    return (settled.get("last_call_error") or "engine_error") if settled.get("last_call_status") == "engine_error" else ""


@functools.lru_cache(maxsize=2)
def _tokenizer(model: str):
    """Loaded once per model folder, not once per loop step."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _classify(calls: list[A.CallRecord], harness_of: dict[str, Harness], model: Path | None) -> list[A.CallRecord]:
    """Each call's role as its harness adapter reads it (main, subagent, compaction, aux)."""
    tokenizer = _tokenizer(str(model)) if model is not None else None
    full = {(c.rollout_id, c.call_id): c for c in A.materialize_prompts(calls)} if tokenizer is not None else {}
    out, main_tools = [], {}
    for c in sorted(calls, key=lambda c: (c.rollout_id, c.seq)):
        h = harness_of.get(c.rollout_id)
        if h is None:
            out.append(c)
            continue
        if c.tool_names:  # the main agent's tools are the first call's that has any (a title call may come first)
            main_tools.setdefault(c.rollout_id, list(c.tool_names))
        text = last_user_text(tokenizer, full[(c.rollout_id, c.call_id)].prompt_ids) if tokenizer is not None else ""
        out.append(dataclasses.replace(c, role=h.classify(list(c.tool_names), text, main_tools.get(c.rollout_id, []))))
    return out


def last_user_text(tokenizer, prompt_ids: list[int], window: int = 4096) -> str:
    """The text of the last user turn of a ChatML prompt (Qwen3/Hermes templates), or ''."""
    text = tokenizer.decode(prompt_ids[-window:], skip_special_tokens=False)
    start = text.rfind("<|im_start|>user\n")
    if start < 0:
        return ""
    body = text[start + len("<|im_start|>user\n"):]
    return body.split("<|im_end|>", 1)[0]


class _Progress:
    """Live counts: done, running, failed, mean reward."""

    def __init__(self, console: Console, total: int, already: int):
        self.total, self.done, self.running, self.failed, self.rewards = total, already, 0, 0, []
        self._lock = threading.Lock()
        self.progress = Progress(TextColumn("[bold]rollouts"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False)
        self.bar = self.progress.add_task("", total=total, completed=already)

    def live(self):
        return self.progress

    def _update(self) -> None:
        mean = f"{statistics.fmean(self.rewards):.3f}" if self.rewards else "-"
        self.progress.update(self.bar, completed=self.done,
                             description=f"running {self.running}  failed {self.failed}  mean reward {mean}")

    def started(self) -> None:
        with self._lock:
            self.running += 1
            self._update()

    def finished(self, rec: dict) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            if rec["status"] in ("infra_error", "harness_error"):
                self.failed += 1
            if rec["reward"] is not None:
                self.rewards.append(rec["reward"])
            self._update()
