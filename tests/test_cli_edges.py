"""The command line at its edges, through real `clawgym` subprocesses: errors printed as written with
the section, the extra and the closest key; recipe values checked at load, before any file is
written; `--model` checked as a path; overrides typed by their field; secrets redacted by name;
SIGTERM → 143 and SIGINT → 130 with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from clawgym import artifacts as A
from toy import write_toy_recipe

CLI = [sys.executable, "-m", "clawgym.cli"]
SAMPLES = {"rollout": "--group-size", "eval": "--samples-per-task"}  # rollouts per task and harness, as each command names it
TOY = Path(__file__).resolve().parents[1] / "recipes" / "tasks" / "toy"


def clawgym(*args: str, cwd: Path, timeout: float = 120, prelude: str = "") -> subprocess.CompletedProcess:
    """`clawgym ARGS` in a subprocess; `prelude` runs first in that process (e.g. to hide a package)."""
    cmd = CLI + list(args) if not prelude else [sys.executable, "-c", f"{prelude}\nimport sys\nfrom clawgym.cli import main\n"
                                                f"sys.argv = ['clawgym', *{list(args)!r}]\nmain()"]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def small_recipe(tmp: Path, body: str = "") -> Path:
    """A recipe on one toy task; `body` is appended (it may repeat no table the base has)."""
    return _recipe(tmp, body)


def _recipe(tmp: Path, body: str) -> Path:
    path = write_toy_recipe(tmp, "edge", steps=1, n=2, tasks=1, max_tokens=4, concurrency=2)
    path.write_text(path.read_text() + "\n" + body)
    return path


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


# --- 1. errors as written, checked at load, nothing written ------------------------------------


@pytest.mark.parametrize("body,message", [
    ("[trian]\nlr = 0.1\n", "unknown section [trian] (did you mean 'train'?); known: engine,"),
    ("[eval]\nevrey = 2\n", "[eval]: unknown key 'evrey' (did you mean 'every'?); known:"),
    ("[rollout.agentlop]\nmax_tokens = 8\n", "[rollout]: unknown key 'agentlop' (did you mean 'agentloop'?)"),
    ("[sft]\ndemonstrations = -1\n", "[sft] key 'demonstrations' must be >= 0, got -1"),
])
def test_recipe_errors_print_brackets_and_suggest_the_closest_key(tmp_path: Path, body: str, message: str) -> None:
    line = one_line_error(clawgym("run", str(small_recipe(tmp_path, body)), cwd=tmp_path))
    assert message in line, line
    assert not (tmp_path / "runs").exists()  # refused before any file


@pytest.mark.parametrize("override,message", [
    ("train.lrr=0.1", "override 'train.lrr=0.1': unknown key 'lrr' in [train] (did you mean 'lr'?)"),
    ("train.algo=gpro", "[train] key 'algo': unknown 'gpro' (did you mean 'grpo'?); choose one of: grpo, ppo, sft"),
    ("train.tis=tokn", "[train] key 'tis': unknown 'tokn' (did you mean 'token'?)"),
    ("train.epochs=0", "[train] key 'epochs' must be at least 1, got 0"),
    ("train.kl_coef=0.1", "[train] key 'kl_coef' > 0 needs 'ref_model'"),
    ("rollout.agentloop.max_tokns=8", "[rollout.agentloop]: unknown key 'max_tokns' (did you mean 'max_tokens'?)"),
    ("rollout.agentloop.max_tokens=0", "[rollout.agentloop]: agentloop option 'max_tokens' must be an integer >= 1, got 0"),
    ("rollout.group_size=many", "[rollout] key 'group_size' must be int, got str 'many'"),
    ("run.max_staleness=-1", "[run] key 'max_staleness' must be >= 0, got -1"),
    ("run.max_staleness=one", "[run] key 'max_staleness' must be int, got str 'one'"),
    ("trian.lr=1", "override 'trian.lr=1': unknown section [trian] (did you mean 'train'?)"),
    ("lr=1", "override 'lr=1': expected SECTION.KEY=VALUE"),
])
def test_bad_values_and_overrides_fail_at_load_before_any_file(tmp_path: Path, override: str, message: str) -> None:
    line = one_line_error(clawgym("run", str(small_recipe(tmp_path)), override, cwd=tmp_path))
    assert message in line, line
    assert not (tmp_path / "runs").exists()


def test_a_missing_extra_is_named_and_leaves_no_recipe_behind(tmp_path: Path) -> None:
    recipe = small_recipe(tmp_path, "[log]\ntensorboard = true\n")
    proc = clawgym("run", str(recipe), cwd=tmp_path, prelude="import sys; sys.modules['tensorboard'] = None")
    line = one_line_error(proc)
    assert line.endswith("[log] key 'tensorboard' needs the tensorboard package: pip install 'clawgym[tensorboard]'"), line
    assert not (tmp_path / "runs" / "edge" / "recipe.toml").exists()  # the rerun after the install is not refused


def test_an_empty_task_folder_stops_the_run_before_it_writes(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    line = one_line_error(clawgym("run", str(small_recipe(tmp_path)), f"rollout.tasks={tmp_path / 'none'}", cwd=tmp_path))
    assert "[rollout] key 'tasks'" in line and "holds no task folders" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("override,message", [
    ("rollout.group_size=-3", "[rollout] key 'group_size' must be >= 1, got -3"),
    ("engine.name=nope", "[engine] key 'name': unknown engine 'nope'"),
    ("rollout.concurrency=0", "[rollout] key 'concurrency' must be >= 1, got 0"),
])
def test_a_late_recipe_error_is_caught_at_load_and_blocks_no_run_name(tmp_path: Path, override: str, message: str) -> None:
    line = one_line_error(clawgym("run", str(small_recipe(tmp_path)), override, cwd=tmp_path))
    assert message in line and line.count("error:") == 1, line
    assert not (tmp_path / "runs").exists()  # no folder, no model-init, no recipe.toml: the corrected command is a new run


def test_resume_of_a_run_that_does_not_exist_says_so(tmp_path: Path) -> None:
    line = one_line_error(clawgym("run", str(small_recipe(tmp_path)), "--resume", cwd=tmp_path))
    assert line == f"error: {tmp_path / 'runs' / 'edge'}: no run to resume there; drop --resume to start it"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_force_starts_a_refused_run_anew(tmp_path: Path) -> None:
    recipe = small_recipe(tmp_path)
    assert clawgym("run", str(recipe), cwd=tmp_path, timeout=600).returncode == 0
    line = one_line_error(clawgym("run", str(recipe), "train.lr=0.01", "--resume", cwd=tmp_path))
    assert "differs from" in line and "--force starts it anew" in line
    again = clawgym("run", str(recipe), "train.lr=0.01", "--force", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "lr = 0.01" in (tmp_path / "runs" / "edge" / "recipe.toml").read_text()
    assert one_line_error(clawgym("run", str(recipe), "--force", "--resume", cwd=tmp_path)).endswith("give one")


# --- 2. --model is a path ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_a_wrong_model_path_is_one_line_and_leaves_no_config(tmp_path: Path, command: str) -> None:
    t0 = time.monotonic()
    proc = clawgym(command, "--tasks", str(TOY), "--harness", "agentloop", "--model", "Qwen/not-here", "--out", "out", cwd=tmp_path)
    line = one_line_error(proc)
    assert line == ("error: --model Qwen/not-here is not a model directory (no config.json); give an HF model directory "
                    "(make one with `clawgym init-model`)")
    assert not (tmp_path / "out").exists()  # no stray rollout.config.json
    assert time.monotonic() - t0 < 60  # no hub retries


# --- 5. overrides --------------------------------------------------------------------------------


def test_overrides_are_typed_by_their_field(tmp_path: Path) -> None:
    from clawgym.run.recipe import load_recipe, recipe_to_toml

    recipe = small_recipe(tmp_path)
    (tmp_path / "held").mkdir()
    r = load_recipe(recipe, ["train.lr=0.5", "run.name=123", "run.steps=3", "rollout.harnesses=agentloop",
                             "rollout.agentloop.max_tokens=16", "eval.tasks=held", "engine.dtype=float32",
                             "train.share_prefixes=false", "rollout.timeout=30"])
    assert r.train["lr"] == 0.5 and isinstance(r.train["lr"], float)
    assert r.run.name == "123" and r.run.steps == 3 and r.rollout.harnesses == ["agentloop"]
    assert r.rollout.harness_options["agentloop"]["max_tokens"] == 16
    assert r.eval.tasks == Path.cwd() / "held"  # a path on the command line is from the working directory
    assert r.engine.options == {"dtype": "float32"} and r.train["share_prefixes"] is False and r.rollout.timeout_s == 30
    text = recipe_to_toml(r)
    assert "lr = 0.5" in text and 'name = "123"' in text and "max_tokens = 16" in text


@pytest.mark.slow
def test_a_run_records_its_overrides_and_resume_counts_them(tmp_path: Path) -> None:
    recipe = small_recipe(tmp_path)
    proc = clawgym("run", str(recipe), "rollout.group_size=2", "train.lr=0.01", "run.name=over", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = (tmp_path / "runs" / "over" / "recipe.toml").read_text()
    assert "lr = 0.01" in saved and "group_size = 2" in saved
    config = orjson.loads((tmp_path / "runs" / "over" / "step-0001" / "rollout.config.json").read_bytes())
    assert config["harness_options"]["agentloop"]["max_tokens"] == 4  # a setting named *tokens* is not a secret
    # the same overrides resume; a changed one is the changed recipe a resume refuses
    again = clawgym("run", str(recipe), "rollout.group_size=2", "train.lr=0.01", "run.name=over", "--resume", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    line = one_line_error(clawgym("run", str(recipe), "rollout.group_size=2", "train.lr=0.02", "run.name=over", "--resume", cwd=tmp_path))
    assert line.endswith("and its overrides (train.lr): a run resumes with the recipe it started with (--force starts it anew)"), line


# --- 4. secrets by name --------------------------------------------------------------------------


def test_secrets_are_redacted_by_name_and_token_settings_survive(tmp_path: Path) -> None:
    from clawgym.train.config import TrainConfig

    A.write_config(tmp_path / "c.json", {"admin_token": "adm", "api_key": "sk", "max_tokens": 8, "token_budget": 4096,
                                         "engine_options": {"hf_token": "hf_x", "max_tokens": 8}})
    saved = orjson.loads((tmp_path / "c.json").read_bytes())
    assert saved == {"admin_token": "<redacted>", "api_key": "<redacted>", "max_tokens": 8, "token_budget": 4096,
                     "engine_options": {"hf_token": "<redacted>", "max_tokens": 8}}
    A.write_config(tmp_path / "t.json", TrainConfig(trees=Path("t"), rollouts=Path("r"), model=Path("m"), out=Path("o"), token_budget=1234))
    assert orjson.loads((tmp_path / "t.json").read_bytes())["token_budget"] == 1234


# --- 4. stop signals -----------------------------------------------------------------------------


def _one_task(tmp: Path) -> Path:
    import shutil

    dest = tmp / "tasks"
    if not dest.exists():
        shutil.copytree(sorted(TOY.iterdir())[0], dest / "t0")
    return dest


def _script(path: Path, delay: float, n: int = 64) -> Path:
    path.write_text("".join(orjson.dumps({"rollout_id": "*", "text": "42", "delay_s": delay}).decode() + "\n" for _ in range(n)))
    return path


@pytest.fixture(scope="module")
def step_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A step directory with rollouts, calls and trees of two scripted rollouts on one toy task."""
    tmp = tmp_path_factory.mktemp("step")
    out = tmp / "step-0001"
    proc = clawgym("rollout", "--tasks", str(_one_task(tmp)), "--harness", "agentloop", "--group-size", "2", "--model", str(tiny_model),
                   "--engine", "scripted", "--script", str(_script(tmp / "s.jsonl", 0.0)), "--out", str(out), cwd=tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = clawgym("build-trees", str(out), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _stop_when(proc: subprocess.Popen, ready, sig: int, timeout: float = 240, settle: float = 1.0) -> tuple[int, str]:
    """Send `sig` `settle` seconds after ready() holds (while the process still runs); the exit status and stderr."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.2)
    time.sleep(settle)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _assert_stopped(code: int, err: str, sig: int, then: str = "") -> None:
    assert "Traceback" not in err, err[-3000:]
    if sig == signal.SIGTERM:
        assert code == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)" + then, (code, err[-2000:])
    else:
        assert code == 130 and err.strip().splitlines()[-1] == "interrupted (SIGINT)" + then, (code, err[-2000:])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_rollout_stops_on_a_signal_with_the_shells_status(tmp_path: Path, tiny_model: Path, sig: int) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(CLI + ["rollout", "--tasks", str(_one_task(tmp_path)), "--harness", "agentloop", "--group-size", "2",
                                   "--model", str(tiny_model), "--engine", "scripted", "--script",
                                   str(_script(tmp_path / "s.jsonl", 60.0)), "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a few seconds after the proxy started, both rollouts wait on the scripted 60 s delay
    code, err = _stop_when(proc, (out / "records").exists, sig, settle=8.0)
    _assert_stopped(code, err, sig)


@pytest.mark.slow
def test_train_stops_on_sigterm_with_143(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    metrics = tmp_path / "train.jsonl"
    proc = subprocess.Popen(CLI + ["train", str(step_dir), "--model", str(tiny_model), "--out", str(tmp_path / "ck"),
                                   "--algo", "ppo", "--epochs", "1000", "--metrics", str(metrics)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, err = _stop_when(proc, metrics.exists, signal.SIGTERM)
    _assert_stopped(code, err, signal.SIGTERM)


@pytest.mark.slow
def test_run_stops_on_sigterm_with_143(tmp_path: Path) -> None:
    recipe = small_recipe(tmp_path)
    proc = subprocess.Popen(CLI + ["run", str(recipe), "rollout.group_size=2"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    code, err = _stop_when(proc, (tmp_path / "runs" / "edge" / "recipe.toml").exists, signal.SIGTERM)
    _assert_stopped(code, err, signal.SIGTERM, f"; continue with: clawgym run {recipe} rollout.group_size=2 --resume")


def test_a_sigterm_that_the_interrupted_code_wraps_still_stops_with_143(monkeypatch) -> None:
    # The signal lands in a class body's __set_name__, as during an import; Python 3.11 wraps the
    # interrupt raised there in a RuntimeError, which must still read as the stop, not a crash.
    import clawgym.cli as cli

    def app() -> None:
        class Field:
            def __set_name__(self, owner, name):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here, at the next bytecode

        class Owner:  # noqa: F841 (its creation calls __set_name__)
            name = Field()

    monkeypatch.setattr(cli, "app", app)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before  # main() put the handler back


# --- 3. reruns: same settings resume, other settings are refused -------------------------------


def _copy_step(step_dir: Path, tmp: Path) -> Path:
    import shutil

    dest = tmp / "run" / "step-0001"
    shutil.copytree(step_dir, dest)
    return dest


def test_a_rollout_rerun_with_other_settings_is_refused_naming_the_keys(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    out = _copy_step(step_dir, tmp_path)
    before = (out / "rollouts.parquet").read_bytes()
    proc = clawgym("rollout", "--tasks", str(step_dir.parent / "tasks"), "--harness", "agentloop", "--group-size", "1", "--model",
                   str(tiny_model), "--engine", "scripted", "--script", str(step_dir.parent / "s.jsonl"), "--rollout-timeout", "90",
                   "--out", str(out), cwd=tmp_path)
    line = one_line_error(proc)
    assert "was made with other settings (group_size: 2 → 1; timeout_s: " in line and "or pass --force to start over" in line, line
    assert (out / "rollouts.parquet").read_bytes() == before


def test_an_eval_rerun_with_other_settings_is_refused_naming_the_keys(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    """eval writes a folder of rollouts as rollout does, under the same rerun rule."""
    out = _copy_step(step_dir, tmp_path)
    (out / "trees.parquet").unlink()  # a folder of rollouts alone (eval refuses a training step's folder outright)
    before = (out / "rollouts.parquet").read_bytes()
    proc = clawgym("eval", "--tasks", str(step_dir.parent / "tasks"), "--harness", "agentloop", "--samples-per-task", "1", "--model",
                   str(tiny_model), "--engine", "scripted", "--script", str(step_dir.parent / "s.jsonl"), "--out", str(out),
                   cwd=tmp_path)
    line = one_line_error(proc)
    assert "was made with other settings (group_size: 2 → 1" in line and "or pass --force to start over" in line, line
    assert (out / "rollouts.parquet").read_bytes() == before


@pytest.mark.slow
def test_a_rollout_rerun_with_the_same_settings_resumes_and_force_starts_over(tmp_path: Path, tiny_model: Path,
                                                                             step_dir: Path) -> None:
    out = _copy_step(step_dir, tmp_path)
    args = ["rollout", "--tasks", str(step_dir.parent / "tasks"), "--harness", "agentloop", "--model", str(tiny_model),
            "--engine", "scripted", "--script", str(step_dir.parent / "s.jsonl"), "--out", str(out)]
    proc = clawgym(*args, "--group-size", "2", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{out}: same settings as its rollouts; resuming (finished rollouts kept)" in proc.stderr
    assert len(A.read_table(out / "rollouts.parquet", A.RolloutRecord)) == 2
    proc = clawgym(*args, "--group-size", "1", "--force", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(A.read_table(out / "rollouts.parquet", A.RolloutRecord)) == 1
    assert not (out / "trees.parquet").exists()  # made from the old rollouts: gone with them


def test_a_build_trees_rerun_appends_no_second_metrics_line(tmp_path: Path, step_dir: Path) -> None:
    out = _copy_step(step_dir, tmp_path)
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    first = clawgym("build-trees", str(out), "--force", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = clawgym("build-trees", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{out / 'trees.parquet'}: same settings as its trees; rebuilding (its metrics line is already in {metrics})" in again.stderr
    assert [m.step for m in A.read_metrics(metrics)] == [1]
    line = one_line_error(clawgym("build-trees", str(out), "--max-leaves", "3", cwd=tmp_path))
    assert "was made with other settings (max_leaves: 64 → 3)" in line, line


@pytest.mark.slow
def test_a_train_rerun_resumes_with_the_same_settings_and_refuses_others(tmp_path: Path, tiny_model: Path,
                                                                        step_dir: Path) -> None:
    args = ["train", str(step_dir), "--model", str(tiny_model), "--out", str(tmp_path / "ck"), "--algo", "ppo",
            "--metrics", str(tmp_path / "train.jsonl")]
    assert (proc := clawgym(*args, cwd=tmp_path, timeout=300)).returncode == 0, proc.stderr[-3000:]
    again = clawgym(*args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{tmp_path / 'ck'}: same settings as its checkpoint; resuming (a complete one is kept)" in again.stderr
    line = one_line_error(clawgym(*args, "--lr", "0.5", cwd=tmp_path))
    assert "was made with other settings (lr: " in line and "--force" in line, line
    assert (proc := clawgym(*args, "--lr", "0.5", "--force", cwd=tmp_path, timeout=300)).returncode == 0, proc.stderr[-3000:]


# --- 6. tables whole, --json, the proxy's ready file ---------------------------------------------


def test_tables_keep_every_digit_at_80_columns_and_in_a_pipe(tmp_path: Path, step_dir: Path) -> None:
    from rich.table import Table

    from clawgym.console import TableConsole

    def shown(console_class: type, width: int) -> str:
        table = Table("k3 KL", box=None, show_header=False)
        table.add_row("2.841234e-14")
        out = console_class(width=width, record=True, file=open(os.devnull, "w"))
        out.print(table)
        return out.export_text()

    from rich.console import Console

    assert "…" in shown(Console, 10)  # what rich does by default in a column too narrow for a number
    text = shown(TableConsole, 10)
    assert "…" not in text and "".join(text.split()) == "2.841234e-14"  # folded onto two lines, every digit kept
    # a real command into a pipe: the table is laid out wide, nothing cut
    proc = clawgym("inspect", str(step_dir / "trees.parquet"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "…" not in proc.stdout and proc.stdout.strip()


def test_inspect_and_mismatch_print_json(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    proc = clawgym("inspect", str(step_dir / "rollouts.parquet"), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = orjson.loads(proc.stdout)
    summary = {row["key"]: row["value"] for row in data["tables"][0]["rows"]}
    assert summary["rollouts"] == 2 and data["path"] == str(step_dir / "rollouts.parquet")
    proc = clawgym("mismatch", "--calls", str(step_dir / "calls.parquet"), "--model", str(tiny_model), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = orjson.loads(proc.stdout)["files"]
    calls = A.read_table(step_dir / "calls.parquet", A.CallRecord)
    assert row["calls"] == len(calls) and row["tokens"] == sum(len(c.output_ids) for c in calls)
    assert isinstance(row["mean_abs"], float) and row["mean_abs"] >= 0


@pytest.mark.slow
def test_serve_proxy_writes_a_ready_file_and_a_json_line(tmp_path: Path, tiny_model: Path) -> None:
    import urllib.request

    ready = tmp_path / "proxy.json"
    proc = subprocess.Popen(CLI + ["serve-proxy", "--model", str(tiny_model), "--engine", "scripted", "--port", "0", "--records",
                                   str(tmp_path / "rec"), "--ready-file", str(ready), "--json"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = orjson.loads(proc.stdout.readline())
        info = orjson.loads(ready.read_bytes())
        assert info == line and info["url"] == f"http://127.0.0.1:{info['port']}" and info["admin_url"] == info["url"] + "/admin"
        assert ready.stat().st_mode & 0o777 == 0o600  # it holds the admin token
        req = urllib.request.Request(f"{info['admin_url']}/rollouts", data=b'{"rollout_id": "r"}', method="POST",
                                     headers={"Authorization": f"Bearer {info['admin_token']}"})
        assert orjson.loads(urllib.request.urlopen(req, timeout=30).read())["base_url"].startswith(info["url"])
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 143
    assert not ready.exists()  # it named a proxy that listened: it goes with the proxy

    # the same port again, while another process holds it: one line naming the port and the way out
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = clawgym("serve-proxy", "--model", str(tiny_model), "--engine", "scripted", "--port", str(port), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: " + r.stderr.split(f"127.0.0.1:{port}: ", 1)[1].strip()], r.stderr
    assert "address already in use" in r.stderr and "--port 0" in r.stderr


@pytest.mark.parametrize("flag,value,message", [
    ("--out", "afile", "--out afile is a file, not a directory"),
    ("--out", "afile/x", "--out afile/x: afile is a file, so no directory can be made under it"),
])
def test_an_output_folder_that_cannot_be_one_is_refused_before_anything_runs(tmp_path: Path, tiny_model: Path,
                                                                              step_dir: Path, flag, value, message) -> None:
    (tmp_path / "afile").write_text("mine")
    for args in (["train", str(step_dir), "--model", str(tiny_model)],
                 ["rollout", "--tasks", str(TOY), "--harness", "agentloop", "--model", str(tiny_model)],
                 ["eval", "--tasks", str(TOY), "--harness", "agentloop", "--model", str(tiny_model)]):
        r = clawgym(*args, flag, value, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), (args, r.stderr)
        assert "Traceback" not in r.stderr and (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("value,message", [("nope/r.json", "its folder nope does not exist"), (".", "is a directory")])
def test_a_ready_file_that_cannot_be_written_is_refused_before_the_proxy_starts(tmp_path: Path, tiny_model: Path,
                                                                                 value, message) -> None:
    r = clawgym("serve-proxy", "--model", str(tiny_model), "--engine", "scripted", "--port", "0", "--ready-file", value,
                cwd=tmp_path, timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert "serving" not in r.stdout


def test_a_parquet_file_with_damaged_data_is_one_line_for_inspect_and_train(tmp_path: Path, tiny_model: Path,
                                                                            step_dir: Path) -> None:
    import shutil

    step = tmp_path / "step"
    shutil.copytree(step_dir, step)
    data = bytearray((step / "trees.parquet").read_bytes())
    for i in range(8, len(data) // 2, 7):  # the pages, not the footer at the end
        data[i] ^= 0xFF
    (step / "trees.parquet").write_bytes(bytes(data))
    for args in (["inspect", str(step / "trees.parquet")], ["train", str(step), "--model", str(tiny_model), "--out", "o"]):
        r = clawgym(*args, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and lines[-1].startswith("error: ") and not any(ln.startswith("  ") for ln in lines), r.stderr
        assert "damaged" in r.stderr or "not a readable Parquet file" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


# --- 7. modes and retention ----------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_output_files_take_the_umask(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        A.atomic_write_bytes(tmp_path / "a.json", b"{}")
        A.write_table(tmp_path / "r.parquet", [], A.RolloutRecord)
        A.umask_modes(_tree(tmp_path / "ckpt"))
    finally:
        os.umask(old)
    for f in ("a.json", "r.parquet", "ckpt/model.safetensors"):
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o666 & ~mask, f
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o777 & ~mask


def _tree(path: Path) -> Path:
    import tempfile

    tmp = Path(tempfile.mkdtemp(dir=path.parent))  # 0700, as save_checkpoint's staging folder
    fd, name = tempfile.mkstemp(dir=tmp)  # 0600
    os.close(fd)
    os.replace(name, tmp / "model.safetensors")
    os.replace(tmp, path)
    return path


@pytest.mark.slow
def test_a_checkpoint_takes_the_umask(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    proc = clawgym("train", str(step_dir), "--model", str(tiny_model), "--out", str(tmp_path / "ck"), "--algo", "ppo",
                   "--metrics", str(tmp_path / "t.jsonl"), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mask = A.process_umask()
    assert (tmp_path / "ck").stat().st_mode & 0o777 == 0o777 & ~mask
    for name in ("model.safetensors", "optimizer.pt", "train_config.json", "trainer_state.json"):
        assert (tmp_path / "ck" / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_keep_last_keeps_the_last_n_the_latest_and_the_best_eval(tmp_path: Path) -> None:
    from clawgym.layout import RunLayout
    from clawgym.run.loop import prune_checkpoints

    run = RunLayout(tmp_path)
    for step in range(1, 7):
        run.step(step).checkpoint.mkdir(parents=True)
        values = {"rollout/reward_mean": 0.1 * step, **({"eval/pass@1": {2: 0.9, 4: 0.5, 6: 0.7}[step]} if step % 2 == 0 else {})}
        A.append_metrics(run.metrics, A.MetricsLine(step, values, time=0.0))
        prune_checkpoints(run, step, keep_last=2)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-0002", "step-0005", "step-0006"]


def test_keep_last_is_a_run_key_left_out_of_old_recipes(tmp_path: Path) -> None:
    from clawgym.run.recipe import load_recipe, recipe_to_toml

    recipe = small_recipe(tmp_path)
    assert "keep_last =" not in recipe_to_toml(load_recipe(recipe))  # a run saved before the key still resumes
    assert "keep_last = 3" in recipe_to_toml(load_recipe(recipe, ["run.keep_last=3"]))
    line = one_line_error(clawgym("run", str(recipe), "run.keep_last=-1", cwd=tmp_path))
    assert "[run] key 'keep_last' must be 0 (keep all) or more, got -1" in line


# --- 8. metric names, lengths and turns, units -----------------------------------------------


def test_a_steps_rollout_metrics_have_lengths_turns_and_a_sample_std(step_dir: Path) -> None:
    import statistics

    from clawgym.run import metrics as M
    from clawgym.layout import StepLayout
    from clawgym.train.step_metrics import REDUCTIONS

    values = M.rollout_values(StepLayout(step_dir))
    rollouts = A.read_table(step_dir / "rollouts.parquet", A.RolloutRecord)
    calls = A.read_table(step_dir / "calls.parquet", A.CallRecord)
    lengths = [sum(len(c.output_ids) for c in calls if c.rollout_id == r.rollout_id) for r in rollouts]
    assert values[M.RESPONSE_LENGTH_MEAN] == statistics.fmean(lengths) > 0 and values[M.RESPONSE_LENGTH_MAX] == max(lengths)
    assert values[M.TURNS_MEAN] == statistics.fmean(r.n_calls for r in rollouts) >= 1
    assert values[M.REWARD_STD] == statistics.stdev(r.reward for r in rollouts)
    written = [*values, *M.trees_values(StepLayout(step_dir)), *REDUCTIONS, "eval/pass@1", "eval/pass@1/numbers", "time/step_s"]
    assert [k for k in written if not M.is_known(k)] == []
    assert not M.is_known("rollout/new_thing") and not M.is_known("stuff/x")
    from clawgym.run.progress import FIELDS, TOKENS_SAVED, TREE_RATIO

    shown = [*(key for key, _ in FIELDS), TREE_RATIO, TOKENS_SAVED, *M.COLD_START_KEYS, *(p.key for p in M.PHASES)]
    assert [k for k in shown if not M.is_known(k)] == []  # what the step lines read is a key a step writes


def test_every_peer_name_is_in_the_docs() -> None:
    from clawgym.run import metrics as M

    text = (Path(__file__).resolve().parents[1] / "docs" / "recipes.md").read_text(encoding="utf-8")
    for key, (trl, verl) in M.PEERS.items():
        assert f"| `{key}` | {trl} | {verl} |" in text, key


def test_the_run_summary_counts_rl_steps_not_the_cold_start(monkeypatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import clawgym.run.loop
    from clawgym.cli import app

    lines = [A.MetricsLine(s, {"rollout/reward_mean": 0.5}, time=0.0) for s in range(0, 7)]  # step 0: the [sft] line
    monkeypatch.setattr(clawgym.run.loop, "run", lambda *a, **k: lines)
    result = CliRunner().invoke(app, ["run", str(tmp_path / "r.toml")])
    assert result.exit_code == 0 and result.stdout.strip() == "6 steps; last mean reward 0.500", result.stdout


@pytest.mark.parametrize("typo,message", [
    (["--engine", "nope"], "unknown engine 'nope'"),
    (["--engine", "scripted"], "--engine scripted answers from a script: give --script FILE"),
    (["--engine", "scripted", "--script", "nope.jsonl"], "--script "),  # the path resolved: .../nope.jsonl: no such file
    (["--tool-parser", "nope"], "unknown tool parser 'nope'"),
    (["--chat-template", "nope.jinja"], "--chat-template nope.jinja: no such file"),
    (["--script", "answers.jsonl"], "--script is the scripted engine's; this command's engine is 'hf'"),
    (["--proxy", "http://127.0.0.1:1"], "give --model DIR (a proxy in this process) or --proxy URL (a running one), not both"),
])
def test_a_typo_is_refused_before_the_output_folder_exists_so_the_corrected_command_runs(
        tmp_path: Path, tiny_model: Path, typo: list[str], message: str) -> None:
    from helpers import script

    script(tmp_path / "answers.jsonl", {"*": ["42"] * 4})
    base = ["rollout", "--tasks", str(TOY), "--task-filter", "numbers-0", "--harness", "agentloop", "--group-size", "1",
            "--model", str(tiny_model), "--out", "step"]
    r = clawgym(*base, *typo, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines == [lines[-1]] and lines[-1].startswith(f"error: {message}"), r.stderr
    assert not (tmp_path / "step").exists()  # nothing written: the corrected command is not a rerun with "other settings"
    fixed = clawgym(*base, "--engine", "scripted", "--script", "answers.jsonl", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr


def test_neither_model_nor_proxy_is_refused_before_the_output_folder_exists(tmp_path: Path) -> None:
    r = clawgym("rollout", "--tasks", str(TOY), "--harness", "agentloop", "--out", "step", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == ("error: give --model DIR (a proxy in this process), or --proxy URL "
                                                      "with --admin-token and --records DIR"), r.stderr
    assert not (tmp_path / "step").exists()


def test_a_stage_whose_rollouts_all_failed_for_infrastructure_exits_1_naming_the_cause(tmp_path: Path,
                                                                                        tiny_model: Path) -> None:
    from helpers import script

    script(tmp_path / "down.jsonl", {"*": [{"error": "the engine is down"}] * 8})
    base = ["--tasks", str(TOY), "--task-filter", "numbers-0", "--harness", "agentloop", "--model", str(tiny_model),
            "--engine", "scripted", "--script", "down.jsonl"]
    for command in ("rollout", "eval"):
        r = clawgym(command, *base, SAMPLES[command], "2", "--out", command, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and lines[-1].startswith("error: none of the 2 rollouts could be scored: every one is "
                                                          "infra_error (model engine failed)"), r.stderr[-2000:]
        assert (tmp_path / command / "rollouts.parquet").exists()  # nothing already written is lost
        assert (tmp_path / command / "results.jsonl").read_text().count("infra_error") == 2


def test_a_negative_timeout_is_refused_before_anything_runs(tmp_path: Path, tiny_model: Path) -> None:
    r = clawgym("rollout", "--tasks", str(TOY), "--harness", "agentloop", "--model", str(tiny_model), "--rollout-timeout", "-5",
                "--out", "step", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        "error: --rollout-timeout ([rollout] timeout_s) must be a positive number of seconds, got -5"), r.stderr
    assert not (tmp_path / "step" / "rollouts.parquet").exists()


def test_eval_into_a_training_step_is_refused(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    import shutil

    step = tmp_path / "step"
    shutil.copytree(step_dir, step)
    before = {p.name: p.stat().st_mtime_ns for p in step.iterdir()}
    r = clawgym("eval", "--tasks", str(TOY), "--harness", "agentloop", "--model", str(tiny_model), "--out", str(step), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == (
        f"error: --out {step} is a training step (it holds trees.parquet): evaluate into a folder of its own (e.g. {step / 'eval'})")
    assert {p.name: p.stat().st_mtime_ns for p in step.iterdir()} == before


def test_messages_say_what_was_wrong(tmp_path: Path, tiny_model: Path) -> None:
    r = clawgym("rollout", "--tasks", str(TOY), "--task-filter", "numbers-00", "--harness", "agentloop", "--model", str(tiny_model),
                "--out", "step", cwd=tmp_path)
    assert r.stderr.strip().splitlines()[-1] == (f"error: --task-filter numbers-00 matches none of the 8 tasks in {TOY} "
                                                 f"(did you mean 'numbers-0'?)")
    assert not (tmp_path / "step").exists()
    r = clawgym("sync", "--proxy", "localhost:1", "--checkpoint", str(tiny_model), "--admin-token", "t", cwd=tmp_path)
    assert r.returncode == 1 and "must start with http:// (or https://)" in r.stderr, r.stderr


def test_nothing_to_learn_says_why(tmp_path: Path, tiny_model: Path) -> None:
    nodes = [A.TreeNode(f"r{i}", n, n - 1, ids, kind, [-1.0] * len(ids) if kind == "model" else [], "c0", 0, "main", True, d)
             for i in range(2) for n, (ids, kind, d) in enumerate([(list(range(40, 60)), "env", 0), ([101, 102], "model", 20)])]
    rows = [A.RolloutRecord(f"r{i}", f"t{i}", "agentloop", f"t{i}+agentloop", 0, "ok", 1.0, 1, 1.0, 0) for i in range(2)]
    A.write_table(tmp_path / "trees.parquet", nodes, A.TreeNode)
    A.write_table(tmp_path / "rollouts.parquet", rows, A.RolloutRecord)
    r = clawgym("train", str(tmp_path), "--model", str(tiny_model), "--out", "ck", cwd=tmp_path)
    assert r.returncode == 0 and "nothing to learn (all 2 GRPO group(s) gave their rollouts one reward each" in r.stderr, r.stderr
    assert "groups of a single rollout" in r.stderr


def test_a_rerun_over_changed_tasks_or_weights_at_the_same_paths_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    import os
    import shutil

    from helpers import script

    tasks, model = tmp_path / "tasks", tmp_path / "model"
    shutil.copytree(TOY / "numbers-0", tasks / "numbers-0")
    shutil.copytree(tiny_model, model)
    script(tmp_path / "answers.jsonl", {"*": ["42"] * 8})
    base = ["rollout", "--tasks", "tasks", "--harness", "agentloop", "--group-size", "1", "--model", "model", "--engine", "scripted",
            "--out", "step"]
    assert clawgym(*base, "--script", "answers.jsonl", cwd=tmp_path).returncode == 0
    again = clawgym(*base, "--script", str(tmp_path / "answers.jsonl"), cwd=tmp_path)  # the same script, named absolutely
    assert again.returncode == 0 and "same settings as its rollouts; resuming" in again.stderr, again.stderr
    instruction = tasks / "numbers-0" / "instruction.md"
    instruction.write_text(instruction.read_text() + "\nAnswer in words.\n")
    r = clawgym(*base, "--script", "answers.jsonl", cwd=tmp_path)
    assert r.returncode == 1 and "was made with other settings (tasks: its contents changed since)" in r.stderr, r.stderr
    assert clawgym(*base, "--script", "answers.jsonl", "--force", cwd=tmp_path).returncode == 0
    weights = model / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # new weights written at the same path
    r = clawgym(*base, "--script", "answers.jsonl", cwd=tmp_path)
    assert r.returncode == 1 and "(model: its contents changed since)" in r.stderr, r.stderr


def test_train_into_its_own_starting_model_is_refused(tmp_path: Path, tiny_model: Path, step_dir: Path) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    before = (model / "model.safetensors").read_bytes()
    r = clawgym("train", str(step_dir), "--model", "model", "--out", str(model), "--force", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(f"error: --out {model} is the --model it starts from")
    assert (model / "model.safetensors").read_bytes() == before


def test_a_crashing_check_is_its_own_status_left_out_of_groups_and_pass_at_1(tmp_path: Path, tiny_model: Path) -> None:
    """A task whose check crashes is `check_error`: no reward, counted in the summary line, out of training and
    Pass@1; a stage where every check crashed exits 1 naming it."""
    import shutil

    from helpers import script

    tasks = tmp_path / "tasks"
    for t in sorted(TOY.iterdir())[:2]:
        shutil.copytree(t, tasks / t.name)
    broken = sorted(tasks.iterdir())[1]
    (broken / "tests" / "check.py").write_text("import sys\nraise KeyError('the check has a bug')\n")
    script(tmp_path / "s.jsonl", {"*": ["42"] * 8})
    base = ["--tasks", str(tasks), "--harness", "agentloop", "--model", str(tiny_model), "--engine", "scripted",
            "--script", "s.jsonl"]
    r = clawgym("rollout", *base, SAMPLES["rollout"], "2", "--out", "step", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "check_error: 2" in r.stdout, r.stdout
    rows = {x.rollout_id: x for x in A.read_table(tmp_path / "step" / "rollouts.parquet", A.RolloutRecord)}
    crashed = [x for x in rows.values() if x.task_id == broken.name]
    assert [(x.status, x.reward) for x in crashed] == [("check_error", None)] * 2
    assert all("KeyError: 'the check has a bug'" in x.error for x in crashed)
    assert all(x.status != "check_error" and x.reward is not None for x in rows.values() if x.task_id != broken.name)
    r = clawgym("build-trees", "step", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    kept = {n.rollout_id for n in A.read_table(tmp_path / "step" / "trees.parquet", A.TreeNode) if n.trainable}
    assert kept and not kept & {x.rollout_id for x in crashed}
    r = clawgym("eval", *base, SAMPLES["eval"], "2", "--out", "ev", cwd=tmp_path)
    doc = orjson.loads((tmp_path / "ev" / "eval.json").read_bytes())
    assert r.returncode == 0 and broken.name not in doc["per_task"] and doc["excluded"] == 2, r.stderr[-2000:]
    r = clawgym("rollout", *base, SAMPLES["rollout"], "2", "--task-filter", broken.name, "--out", "only-broken", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(
        "error: none of the 2 rollouts could be scored: every one is check_error (the task's check crashed; "
        f"{broken.name}: KeyError: 'the check has a bug')"), r.stderr[-2000:]
