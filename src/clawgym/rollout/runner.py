"""The rollout runner: tasks × harnesses × n samples, each in its own sandbox against the proxy.

Each rollout runs in `one.py` (register, sandbox, harness, settle, verify; the failure policy).
Rollouts start harness by harness (every task's rollouts through the first harness, then the
second's): an engine batch pays for its widest row on every decode step, and harness prompts differ
widely in length, so rollouts running at once should come from one harness (bench/mixed_widths.py).
One rollout's failure never stops the others. Ctrl-C closes every open sandbox and keeps what finished. Rerunning into the same
`--out` skips rollouts already in `results.jsonl`, so a killed run resumes without losing or
duplicating a rollout; a rollout that had not finished, or ended as `infra_error` (a lost node, an
engine outage: nothing the policy did), is run again from scratch, and its new row supersedes the
old one (the last row of a rollout id in `results.jsonl` is the one kept).

At the end the runner writes `rollouts.parquet` and `calls.parquet` (prompts delta-encoded as
recorded, each call's role as its harness adapter read it from the proxy's conversation log, kept
in the rollout's row in `results.jsonl`) plus `rollout.config.json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from clawgym import artifacts as A
from clawgym.console import STDERR
from clawgym.errors import UserError, did_you_mean
from clawgym.layout import StepLayout
from clawgym.rollout.config import RolloutConfig
from clawgym.rollout.distributed import RayRollouts
from clawgym.rollout.harnesses import HARNESSES, Harness
from clawgym.rollout.harnesses.base import call_roles
from clawgym.rollout.one import RolloutPlan, run_one
from clawgym.rollout.proxy_client import ProxyClient, start_local_proxy
from clawgym.rollout.sandbox import Sandbox, announce, isolation
from clawgym.settings import fingerprints
from clawgym.tasks import Task, load_tasks


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

    def check_scored(self) -> None:
        """The exit-code rule (docs/reliability.md, "Exit codes"): a stage none of whose rollouts could be
        scored failed, whatever it wrote: a UserError naming the cause, after everything was written."""
        if not self.rollouts or any(r.status not in A.EXCLUDED_STATUSES for r in self.rollouts):
            return
        infra = [r for r in self.rollouts if r.status == "infra_error"]
        crashed = [r for r in self.rollouts if r.status == "check_error"]
        causes = sorted({r.error.split(":", 1)[0] for r in infra if r.error} or {"no error recorded"})
        what = [f"{len(infra)} infra_error ({', '.join(causes[:3])})"] if infra else []
        if crashed:
            first = crashed[0]  # a traceback's last line names the exception
            last = (first.error.strip().splitlines() or ["no error recorded"])[-1][:160]
            what.append(f"{len(crashed)} check_error (the task's check crashed; {first.task_id}: {last})")
        every = "every one is " + what[0].split(" ", 1)[1] if len(what) == 1 else " and ".join(what)
        fix = ("`clawgym tasks validate` runs the checks alone; fix them and rerun with --force" if crashed else
               "Fix the cause and rerun: rollouts that finished are kept")
        raise UserError(f"none of the {len(self.rollouts)} rollouts could be scored: {every}; their results are in "
                        f"{self.out / 'results.jsonl'}. {fix}")

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


def _load(config: RolloutConfig) -> tuple[list[Task], dict[str, Harness]]:
    unknown = [h for h in config.harnesses if h not in HARNESSES]
    if unknown:
        raise UserError(f"unknown harness '{unknown[0]}'; choose from: {', '.join(HARNESSES)}")
    if config.group_size < 1 or config.concurrency < 1:
        raise UserError(f"--group-size and --concurrency must be at least 1 (got {config.group_size}, {config.concurrency})")
    if config.timeout_s is not None and config.timeout_s <= 0:
        raise UserError(f"--rollout-timeout ([rollout] timeout_s) must be a positive number of seconds, got {config.timeout_s:g}")
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
        if hasattr(harnesses[name], "prepare"):
            harnesses[name].prepare()
    return select_tasks(config), harnesses


def select_tasks(config: RolloutConfig) -> list[Task]:
    """The tasks this rollout stage runs: `tasks`, narrowed by `task_filter`, then `tasks_per_step` of them."""
    if config.tasks_per_step < 0:
        raise UserError(f"--tasks-per-step must be 0 (every task) or more (got {config.tasks_per_step})")
    tasks = load_tasks(config.tasks)
    if not tasks:
        raise UserError(f"no tasks found in {config.tasks}")
    if config.task_filter:
        every = tasks
        tasks = [t for t in tasks if t.id in set(config.task_filter)]
        if not tasks:
            raise UserError(f"--task-filter {','.join(config.task_filter)} matches none of the {len(every)} tasks in "
                            f"{config.tasks}{did_you_mean(config.task_filter[0], [t.id for t in every])}")
    if 0 < config.tasks_per_step < len(tasks):
        # Seeded by the step alone: a resumed step draws the same tasks and finishes the rollouts it started.
        tasks = random.Random(f"tasks-per-step {config.step}").sample(tasks, config.tasks_per_step)
    return tasks


def start_order(plans: list[RolloutPlan], harnesses: list[str]) -> list[RolloutPlan]:
    """`plans` harness by harness, in the order of `harnesses`, each harness's in their own order:
    rollouts that run at once then share a harness, and so a prompt length (the module docstring)."""
    return sorted(plans, key=lambda p: harnesses.index(p.harness))


def run_rollouts(config: RolloutConfig, console: Console | None = None, proxy: ProxyClient | None = None) -> RolloutSummary:
    """Run every planned rollout (see the module docstring); `proxy` reuses a running proxy."""
    console = console or STDERR
    tasks, harnesses = _load(config)
    iso = isolation(config.sandbox, config.network)  # refuses a sandbox that would silently not isolate files
    announce(iso, console)
    out = StepLayout(Path(config.out))
    out.path.mkdir(parents=True, exist_ok=True)
    A.write_config(out.rollout_config, {**dataclasses.asdict(config), **fingerprints(config), "isolation": iso.record()})
    results_path = out.results
    done = {r["rollout_id"]: r for r in A.read_jsonl(results_path).records} if results_path.exists() else {}
    prefix = config.id_prefix or (f"s{config.step:04d}." if config.step else "")
    plans = [RolloutPlan(t, h, i, prefix) for t in tasks for h in config.harnesses for i in range(config.group_size)]
    todo = [p for p in plans if p.rollout_id not in done or done[p.rollout_id]["status"] == "infra_error"]
    todo = start_order(todo, config.harnesses)
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
        open_sandboxes: dict[str, Sandbox] = {}
        lock = threading.Lock()
        interrupted = threading.Event()
        remote = None
        if config.ray:
            remote = RayRollouts(config, proxy.url, proxy.admin_token)

        def one(plan: RolloutPlan) -> dict:
            state.started()
            if remote is not None:  # the rollout runs on a Ray worker; its row comes back here
                rec = remote.run(plan)
            else:
                rec = run_one(plan, harnesses[plan.harness], proxy, config, open_sandboxes)
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
    calls = _classify(calls, {p.rollout_id: harnesses[p.harness] for p in plans}, {rid: r.get("call_roles") for rid, r in done.items()})
    A.write_table(out.calls, calls, A.CallRecord)
    A.write_table(out.rollouts, rollouts, A.RolloutRecord)
    return RolloutSummary(out.path, rollouts, len(calls), time.monotonic() - t0)


def _classify(calls: list[A.CallRecord], harness_of: dict[str, Harness], roles_of: dict[str, dict | None]) -> list[A.CallRecord]:
    """Each call's role as its harness adapter read it from the proxy's conversation log (the row's
    "call_roles", `one.py`); a call outside that log (a proxy without the conversation route) gets
    the adapter's reading of its tools alone."""
    by_rollout: dict[str, list[A.CallRecord]] = {}
    for c in sorted(calls, key=lambda c: (c.rollout_id, c.seq)):
        by_rollout.setdefault(c.rollout_id, []).append(c)
    out = []
    for rid, cs in by_rollout.items():
        h = harness_of.get(rid)
        if h is None:
            out += cs
            continue
        logged = roles_of.get(rid) or {}
        by_tools = call_roles(h, [{"seq": c.seq, "tools": sorted(c.tool_names)} for c in cs])
        out += [dataclasses.replace(c, role=logged.get(str(c.seq), by_tools[c.seq])) for c in cs]
    return out


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
            if rec["status"] in ("infra_error", "harness_error", "check_error"):
                self.failed += 1
            if rec["reward"] is not None:
                self.rewards.append(rec["reward"])
            self._update()
