"""The verifier: code checks in the sandbox, the rubric judge (a fake one on 127.0.0.1 standing for
an outside LLM), the weighted combination and the mapping onto RolloutRecord."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from clawgym.artifacts import RolloutRecord, Transcript, TranscriptMessage, TranscriptToolCall, read_table, write_table
from clawgym.rollout.judge import JudgeConfig, parse_judge_output
from clawgym.rollout.sandbox import SandboxConfig, open_sandbox
from clawgym.rollout.verifier import NO_JUDGE_NOTE, RUBRIC_SKIPPED, VerifierConfig, parse_check_output, verify
from clawgym.tasks import load_task
from clawgym.tasks.rubric import parse_rubric

CHECK = '''import json, sys
from pathlib import Path
ws = Path(sys.argv[1])
out = ws / "report.md"
print("checking", ws)  # checks often log before their JSON
print(json.dumps({"exists": out.is_file(), "has_total": out.is_file() and "total: 42" in out.read_text()}))
'''
RUBRIC = """Good reports are short.

### Criterion 1: Clarity
Is the report clear?
Files: report.md
**Score 1.0**: very
**Score 0.5**: somewhat
**Score 0.0**: no

### Criterion 2: Tone
Polite and factual.
"""


class FakeJudge:
    """A stand-in for an outside LLM judge: an OpenAI-compatible /v1/chat/completions on 127.0.0.1
    that answers from a script and records every request."""

    def __init__(self, answers: list[str]):
        self.answers, self.requests = list(answers), []
        judge = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append(body)
                text = judge.answers.pop(0) if len(judge.answers) > 1 else judge.answers[0]
                resp = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.config = JudgeConfig(base_url=f"http://127.0.0.1:{self.server.server_address[1]}/v1", model="fake-judge", api_key="k", max_retries=1)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    d = tmp_path / "report_task"
    (d / "workspace").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text("[verifier]\ntimeout_sec = 20\n")
    (d / "instruction.md").write_text("Write report.md with the line 'total: 42'.\n")
    (d / "workspace" / "data.csv").write_text("x\n40\n2\n")
    (d / "tests" / "check.py").write_text(CHECK)
    (d / "tests" / "rubric.md").write_text(RUBRIC)
    return d


@pytest.fixture
def sandbox(tmp_path: Path, task_dir: Path):
    with open_sandbox("local", task_dir / "workspace", SandboxConfig(base_dir=tmp_path / "sb", network="blackhole")) as sb:
        yield sb


def test_parse_check_output() -> None:
    assert parse_check_output('{"a": 1, "b": false}') == (0.5, {"a": 1.0, "b": 0.0})
    assert parse_check_output('log line\n{\n  "a": 1,\n  "b": "0.5"\n}\n') == (0.75, {"a": 1.0, "b": 0.5})
    assert parse_check_output("noise\n0.25\n") == (0.25, {})
    assert parse_check_output("{}") == (0.0, {})  # ClawGym: an empty dict scores 0
    for bad, msg in (("", "printed nothing"), ("hello", "not JSON"), ('{"a": "yes"}', "not a number"), ("[1]", "expected a dict")):
        with pytest.raises(ValueError, match=msg):
            parse_check_output(bad)


def test_code_only_without_judge(task_dir: Path, sandbox) -> None:
    task = load_task(task_dir)
    r = verify(task, sandbox)
    assert (r.reward, r.code_score, r.rubric_score, r.judged) == (0.0, 0.0, None, False)
    assert NO_JUDGE_NOTE in r.notes and (r.code_weight, r.rubric_weight) == (1.0, 0.0)
    (sandbox.workspace / "report.md").write_text("total: 41\n")
    assert verify(task, sandbox).reward == 0.5
    (sandbox.workspace / "report.md").write_text("total: 42\n")
    r = verify(task, sandbox)
    # the skipped rubric part is in the reward detail: its weight, under a key no check can have
    assert r.reward == 1.0 and r.subscores == {"code/exists": 1.0, "code/has_total": 1.0, RUBRIC_SKIPPED: pytest.approx(0.3)}


def test_judge_combines_07_03(task_dir: Path, sandbox) -> None:
    judge = FakeJudge(['Clarity is fine; tone ok.\n```json\n{"scores": {"criterion_1": 0.5, "criterion_2": "0.8"}, "notes": "decent"}\n```'])
    try:
        (sandbox.workspace / "report.md").write_text("total: 42\n")
        (sandbox.workspace / "scratch.txt").write_text("side file")
        r = verify(load_task(task_dir), sandbox, transcript=Transcript(messages=[TranscriptMessage("assistant", "", [TranscriptToolCall("c1", "write", {"path": "report.md"})])]),
                   config=VerifierConfig(judge=judge.config))
    finally:
        judge.close()
    # 0.8 is snapped to the nearest default anchor 0.75; rubric = mean(0.5, 0.75)
    assert r.rubric_score == pytest.approx(0.625) and r.judged and r.error == ""
    assert r.reward == pytest.approx(0.7 * 1.0 + 0.3 * 0.625)
    assert r.subscores["rubric/Clarity"] == 0.5 and r.subscores["rubric/Tone"] == 0.75 and r.judge_notes == "decent"
    req = judge.requests[0]
    system, user = req["messages"][0]["content"], req["messages"][1]["content"]
    assert req["model"] == "fake-judge" and system.startswith("You are a strict rubric-based evaluator.")
    assert "You are grading an OpenClaw agent result." in user and "Write report.md with the line" in user
    final, rest = user.split("## Final Output Files")[1].split("## Additional Changed Workspace Files")
    assert "### report.md" in final and "total: 42" in final and "scratch.txt" not in final
    assert "### scratch.txt" in rest and "data.csv" not in rest  # unchanged seed files are left out
    assert "tool call write" in user and "### criterion_2: Tone" in user and "Allowed scores: 0, 0.5, 1" in user


def test_judge_contract_violation_is_retried(task_dir: Path, sandbox) -> None:
    judge = FakeJudge(['{"scores": {"criterion_1": 1}}', 'Analysis...\n{"scores": {"criterion_1": 1, "criterion_2": 0}, "notes": ""}'])
    try:
        r = verify(load_task(task_dir), sandbox, config=VerifierConfig(judge=judge.config))
    finally:
        judge.close()
    assert len(judge.requests) == 2 and r.rubric_score == 0.5 and r.reward == pytest.approx(0.3 * 0.5)


def test_judge_that_never_complies_falls_back_to_code(task_dir: Path, sandbox) -> None:
    judge = FakeJudge(["I think it is great!"])
    try:
        (sandbox.workspace / "report.md").write_text("total: 42\n")
        r = verify(load_task(task_dir), sandbox, config=VerifierConfig(judge=judge.config))
    finally:
        judge.close()
    assert len(judge.requests) == 2  # max_retries=1
    assert r.reward == 1.0 and r.rubric_score is None and not r.judged
    assert "JSON contract" in r.error and "judge failed: code score only" in r.notes


def test_unreachable_judge(task_dir: Path, sandbox) -> None:
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0, timeout_s=5)
    r = verify(load_task(task_dir), sandbox, config=VerifierConfig(judge=cfg))
    assert "failed" in r.error and r.reward == 0.0 and r.rubric_score is None


def test_rubric_only_task_without_judge_has_no_reward(task_dir: Path, sandbox) -> None:
    (task_dir / "tests" / "check.py").unlink()
    r = verify(load_task(task_dir), sandbox)
    assert r.reward is None and "no judge is configured" in r.error


def test_gate_and_weight_override(task_dir: Path, sandbox) -> None:
    (task_dir / "task.toml").write_text("[verifier.weights]\ncode = 1\nrubric = 1\ngate = 0.9\n")
    judge = FakeJudge(['{"scores": {"criterion_1": 1, "criterion_2": 1}, "notes": "n"}'])
    try:
        r = verify(load_task(task_dir), sandbox, config=VerifierConfig(judge=judge.config))
        assert r.reward == 0.0 and any("gate" in n for n in r.notes)  # code 0 < gate: the rubric does not count
        r = verify(load_task(task_dir), sandbox, config=VerifierConfig(judge=judge.config, code_weight=0.0, rubric_weight=1.0))
        assert r.reward == 1.0 and r.code_score is None
    finally:
        judge.close()


def test_a_crashing_check_has_no_reward_and_a_timeout_scores_zero(task_dir: Path, sandbox) -> None:
    (task_dir / "tests" / "check.py").write_text("import sys\nprint('{\"a\": 1}')\nsys.exit(2)\n")
    r = verify(load_task(task_dir), sandbox)
    assert r.reward is None and r.code_score is None and "exited 2" in r.check_error and "exited 2" in r.error
    (task_dir / "tests" / "check.py").write_text("print('all good')\n")  # exits 0 but breaks the output contract
    r = verify(load_task(task_dir), sandbox)
    assert r.reward is None and "not JSON" in r.check_error
    (task_dir / "tests" / "check.py").write_text("import time\ntime.sleep(60)\n")
    r = verify(load_task(task_dir), sandbox, config=VerifierConfig(timeout_s=1))
    assert r.reward == 0.0 and "timed out" in r.error and not r.check_error


def test_transcript_and_final_message_reach_the_check(task_dir: Path, sandbox) -> None:
    (task_dir / "tests" / "check.py").write_text(
        "import json, os\nt = json.load(open(os.environ['CLAWGYM_TRANSCRIPT']))\nm = open(os.environ['CLAWGYM_FINAL_MESSAGE']).read()\n"
        "print(json.dumps({'events': len(t) == 2, 'final': m == 'done'}))\n"
    )
    r = verify(load_task(task_dir), sandbox, transcript=Transcript(messages=[TranscriptMessage("user", "go"), TranscriptMessage("assistant", "done")]),
               final_message="done")
    assert r.code_score == 1.0


def test_result_maps_onto_rollout_record(task_dir: Path, sandbox, tmp_path: Path) -> None:
    (sandbox.workspace / "report.md").write_text("total: 42\n")
    r = verify(load_task(task_dir), sandbox)
    rec = RolloutRecord(rollout_id="r1", task_id="report_task", harness="agentloop", group_id="report_task/agentloop",
                        sample_index=0, status="ok", reward=None, n_calls=3, wall_time_s=1.0, policy_version=0)
    rec = r.apply(rec)
    assert (rec.reward, rec.code_score, rec.rubric_score, rec.code_weight, rec.rubric_weight) == (1.0, 1.0, None, 1.0, 0.0)
    assert json.loads(rec.subscores_json) == {"code/exists": 1.0, "code/has_total": 1.0, RUBRIC_SKIPPED: pytest.approx(0.3)}
    write_table(tmp_path / "rollouts.parquet", [rec], RolloutRecord)
    assert read_table(tmp_path / "rollouts.parquet", RolloutRecord)[0].reward == 1.0


def test_parse_judge_output_variants() -> None:
    rub = parse_rubric("### A\nx\n### B\ny\n", "r")
    assert parse_judge_output('{"scores": {"criterion_1": 0.3, "criterion_2": {"score": 1}}, "notes": "n"}', rub)[0] == {"A": 0.25, "B": 1.0}
    assert parse_judge_output('x {"scores": {"A": 1, "b": 0}, "notes": ["list"]}', rub) == ({"A": 1.0, "B": 0.0}, '["list"]')
    first = '{"scores": {"criterion_1": 0, "criterion_2": 0}, "notes": ""} then {"scores": {"criterion_1": 1, "criterion_2": 1}, "notes": ""}'
    assert parse_judge_output(first, rub)[0] == {"A": 1.0, "B": 1.0}  # the last object wins
    with pytest.raises(ValueError, match="criterion_2"):
        parse_judge_output('{"scores": {"criterion_1": 1, "criterion_2": "high"}}', rub)
