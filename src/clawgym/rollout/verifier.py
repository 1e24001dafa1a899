"""The verifier: scores a rollout's final workspace (paper §2.1, §4.1.1; docs/tasks.md).

1. Code checks, in the sandbox, with the task's timeout, after the hidden tests were copied in:
   `python3 <tests>/check.py <workspace>` prints a JSON dict of named sub-scores (or one number);
   the code score is their mean (PinchBench's and ClawGym's rule). A check that breaks that
   contract (a non-zero exit, output that is not such JSON, a Harbor test that writes no reward)
   crashed: the verifier's fault, not the policy's, so the result has no reward and `check_error`
   set, and the rollout is `check_error`, left out of training and Pass@1 (docs/tasks.md, "When a
   check crashes"). A check that runs out of time scores 0: the workspace the policy left can make
   it hang. Harbor tasks (`tests/test.sh`) write reward.txt / reward.json instead (docker only).
   The rollout's transcript is in $CLAWGYM_TRANSCRIPT, its final answer in $CLAWGYM_FINAL_MESSAGE.
2. Rubric, when the task has one and a judge is configured: an OpenAI-compatible endpoint gets the
   prompt of the paper's Appendix A (`judge.py`, with a summary of the transcript) and must end with `{"scores": {...}, "notes": ...}`.
3. reward = w_code·code + w_rubric·rubric (0.7/0.3 by default when both exist; configurable).
   No judge configured → the code score alone, and `notes` says so.

`VerifierResult.apply(record)` fills a RolloutRecord's reward fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from clawgym.artifacts import RolloutRecord, Transcript
from clawgym.rollout.config import JudgeConfig, VerifierConfig
from clawgym.rollout.judge import RubricResult, judge_rubric
from clawgym.rollout.sandbox import Sandbox, SandboxError
from clawgym.rollout.transcript import pinchbench_events
from clawgym.tasks.spec import Task

NO_JUDGE_NOTE = "no judge configured: code score only"
# Sub-score naming the rubric weight left out when no judge is configured (docs/tasks.md); outside
# the code/ and rubric/ namespaces so no check or criterion name can collide with it.
RUBRIC_SKIPPED = "rubric_skipped"


@dataclass
class CodeResult:
    score: float
    subscores: dict[str, float] = field(default_factory=dict)
    error: str = ""
    timed_out: bool = False
    crashed: bool = False
    """the check broke its contract (non-zero exit, no parsable score): nothing to score"""


@dataclass
class VerifierResult:
    """The reward of one rollout and how it was made; maps onto RolloutRecord's fields."""

    reward: float | None
    """None when it cannot be computed (a rubric-only task without a judge): excluded from training"""
    code_score: float | None
    rubric_score: float | None
    code_weight: float
    rubric_weight: float
    subscores: dict[str, float] = field(default_factory=dict)
    """code/<check> and rubric/<criterion> sub-scores"""
    judged: bool = False
    notes: list[str] = field(default_factory=list)
    error: str = ""
    judge_notes: str = ""
    check_error: str = ""
    """set when the code checks crashed: the rollout is `check_error`, its reward None"""

    def record_fields(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "code_score": self.code_score,
            "rubric_score": self.rubric_score,
            "code_weight": self.code_weight,
            "rubric_weight": self.rubric_weight,
            "subscores_json": orjson.dumps(self.subscores, option=orjson.OPT_SORT_KEYS).decode(),
        }

    def apply(self, record: RolloutRecord) -> RolloutRecord:
        """A copy of `record` with the reward fields filled (and the verifier's error appended)."""
        err = "; ".join(e for e in (record.error, self.error and f"verifier: {self.error}") if e)
        return dataclasses.replace(record, **self.record_fields(), error=err)


# ---------------------------------------------------------------------------------------------
# Code checks
# ---------------------------------------------------------------------------------------------


def parse_check_output(text: str) -> tuple[float, dict[str, float]]:
    """stdout of a check -> (mean score, sub-scores). Raises ValueError saying what was wrong.

    Accepts the whole output as JSON, or the last JSON value in it (checks often log first)."""
    text = text.strip()
    if not text:
        raise ValueError("the check printed nothing")
    obj: Any = None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        dec = json.JSONDecoder()
        for i in range(len(text) - 1, -1, -1):
            if text[i] in "{" and (i == 0 or text[i - 1] == "\n"):
                try:
                    obj, end = dec.raw_decode(text, i)
                    if text[end:].strip():
                        obj = None
                        continue
                    break
                except json.JSONDecodeError:
                    continue
        if obj is None:
            last = text.splitlines()[-1].strip()
            try:
                obj = float(last)
            except ValueError:
                raise ValueError(f"the check's output is not JSON: {text[-200:]!r}") from None
    if isinstance(obj, bool) or not isinstance(obj, (int, float, dict)):
        raise ValueError(f"the check printed {type(obj).__name__}, expected a dict of sub-scores or a number")
    if not isinstance(obj, dict):
        return _finite(float(obj), "score"), {}
    subs = {}
    for k, v in obj.items():
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise ValueError(f"sub-score {k!r} is {v!r}, not a number") from None
        if not isinstance(v, (int, float)):
            raise ValueError(f"sub-score {k!r} is {type(v).__name__}, not a number")
        subs[str(k)] = _finite(float(v), k)
    return (sum(subs.values()) / len(subs) if subs else 0.0), subs


def _finite(x: float, name: str) -> float:
    if not math.isfinite(x):
        raise ValueError(f"sub-score {name!r} is {x}")
    return x


def run_code_checks(task: Task, sandbox: Sandbox, *, transcript: list | None = None, final_message: str | None = None,
                    timeout: float | None = None) -> CodeResult:
    """Copy the hidden tests in and run the task's code checks on the sandbox's workspace."""
    timeout = timeout or task.verifier_timeout_s
    try:
        tests = sandbox.install_tests(task.tests_dir)
        env = {"CLAWGYM_TESTS": tests, "CLAWGYM_TASK_ID": task.id}
        if transcript is not None:
            env["CLAWGYM_TRANSCRIPT"] = sandbox.put_file("verifier/transcript.json", orjson.dumps(transcript))
        if final_message is not None:
            env["CLAWGYM_FINAL_MESSAGE"] = sandbox.put_file("verifier/final_message.txt", final_message.encode())
    except OSError as e:  # a full disk or a vanished folder: the sandbox's fault, not the rollout's
        raise SandboxError(f"cannot copy the verifier's files into sandbox {sandbox.id}: {e}") from None
    workspace = sandbox.path_inside(sandbox.workspace)
    if task.verifier_kind == "harbor":
        return _run_harbor(task, sandbox, tests, env, timeout)
    r = sandbox.run(["python3", f"{tests}/check.py", workspace], env=env, timeout=timeout, name="verifier")
    if r.timed_out:
        return CodeResult(0.0, {}, f"code checks timed out after {timeout:g}s", timed_out=True)
    if r.exit_code != 0:
        return CodeResult(0.0, {}, f"code checks exited {r.exit_code}: {r.stderr(2000).strip()[-500:]}", crashed=True)
    try:
        score, subs = parse_check_output(r.stdout())
    except ValueError as e:
        return CodeResult(0.0, {}, f"code checks: {e}", crashed=True)
    return CodeResult(min(1.0, max(0.0, score)), subs)


def _run_harbor(task: Task, sandbox: Sandbox, tests: str, env: dict, timeout: float) -> CodeResult:
    logs = getattr(sandbox, "harbor_logs", None)
    if logs is None:
        return CodeResult(0.0, {}, "Harbor verifiers (tests/test.sh) expect /tests, /logs and the task's workdir: run them with the docker sandbox",
                          crashed=True)
    r = sandbox.run(["bash", f"{tests}/test.sh"], env=env, timeout=timeout, name="verifier")
    if r.timed_out:
        return CodeResult(0.0, {}, f"tests/test.sh timed out after {timeout:g}s", timed_out=True)
    txt, js = Path(logs) / "verifier" / "reward.txt", Path(logs) / "verifier" / "reward.json"
    try:
        if txt.is_file():  # Harbor reads reward.txt first
            score, subs = parse_check_output(txt.read_text())
        elif js.is_file():
            score, subs = parse_check_output(js.read_text())
        else:
            return CodeResult(0.0, {}, f"tests/test.sh (exit {r.exit_code}) wrote neither reward.txt nor reward.json", crashed=True)
    except ValueError as e:
        return CodeResult(0.0, {}, f"Harbor reward: {e}", crashed=True)
    return CodeResult(min(1.0, max(0.0, score)), subs)


# ---------------------------------------------------------------------------------------------
# The whole verifier
# ---------------------------------------------------------------------------------------------


def _weights(task: Task, config: VerifierConfig) -> tuple[float, float]:
    if (config.code_weight is None) != (config.rubric_weight is None):
        raise ValueError("VerifierConfig: set both code_weight and rubric_weight, or neither")
    wc, wr = (task.code_weight, task.rubric_weight) if config.code_weight is None else (config.code_weight, config.rubric_weight)
    if wc < 0 or wr < 0 or wc + wr <= 0:
        raise ValueError(f"VerifierConfig: weights must be >= 0 with a positive sum (got {wc}, {wr})")
    return wc / (wc + wr), wr / (wc + wr)


def verify(task: Task, sandbox: Sandbox, *, transcript: Transcript | None = None, final_message: str | None = None,
           config: VerifierConfig | None = None) -> VerifierResult:
    """Score the final workspace of `sandbox` for `task`. Call after the harness has exited.

    The transcript reaches the checks ($CLAWGYM_TRANSCRIPT) and the judge as the OpenClaw-style
    events PinchBench's graders read (`transcript.pinchbench_events`).

    Raises SandboxError only when the sandbox itself fails (the runner's infra_error)."""
    config = config or VerifierConfig()
    events = pinchbench_events(transcript) if transcript is not None else None
    wc, wr = _weights(task, config)
    notes: list[str] = []
    errors: list[str] = []
    subs: dict[str, float] = {}

    code: CodeResult | None = None
    if task.has_code_checks and (wc > 0 or task.rubric is None or config.judge is None):
        code = run_code_checks(task, sandbox, transcript=events, final_message=final_message, timeout=config.timeout_s)
        subs.update({f"code/{k}": v for k, v in code.subscores.items()})
        if code.error:
            errors.append(code.error)

    rubric: RubricResult | None = None
    if task.rubric is not None and wr > 0:
        if config.judge is None:
            notes.append(NO_JUDGE_NOTE)
            subs[RUBRIC_SKIPPED] = wr  # the record keeps subscores, not notes: say the rubric part was left out
        else:
            rubric = judge_rubric(task, sandbox.workspace, config.judge, transcript=events,
                                  final_message=final_message, aggregate=config.rubric_aggregate)
            if rubric.error:
                errors.append(f"judge: {rubric.error}")
                notes.append("judge failed: code score only")
            else:
                subs.update({f"rubric/{k}": v for k, v in rubric.scores.items()})

    rubric_score = rubric.score if rubric is not None and not rubric.error else None
    code_score = code.score if code is not None else None
    if code is not None and code.crashed:  # no score to weigh: neither 0 nor the rubric alone
        return VerifierResult(reward=None, code_score=None, rubric_score=rubric_score, code_weight=wc, rubric_weight=wr,
                              subscores=subs, judged=rubric_score is not None, notes=notes, error="; ".join(errors),
                              judge_notes=rubric.notes if rubric is not None else "", check_error=code.error)
    if rubric_score is not None and code_score is not None:
        counted = rubric_score if code_score >= task.gate else 0.0
        if counted != rubric_score:
            notes.append(f"rubric not counted: code score {code_score:.3f} below the gate {task.gate:g}")
        reward: float | None = wc * code_score + wr * counted
    elif rubric_score is not None:
        reward, wc, wr = rubric_score, 0.0, 1.0
    elif code_score is not None:
        reward, wc, wr = code_score, 1.0, 0.0
    else:
        reward = None
        errors.append("the task is scored by its rubric alone and no judge " + ("answered" if config.judge else "is configured"))
    return VerifierResult(
        reward=None if reward is None else min(1.0, max(0.0, reward)),
        code_score=code_score,
        rubric_score=rubric_score,
        code_weight=wc,
        rubric_weight=wr,
        subscores=subs,
        judged=rubric_score is not None,
        notes=notes,
        error="; ".join(errors),
        judge_notes=rubric.notes if rubric is not None else "",
    )


__all__ = ["VerifierConfig", "VerifierResult", "CodeResult", "JudgeConfig", "verify", "run_code_checks",
           "parse_check_output", "SandboxError", "NO_JUDGE_NOTE", "RUBRIC_SKIPPED"]
