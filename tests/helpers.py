"""Helpers shared by the test modules: task folders for rollouts, scripted answers, and models whose
tokenizer carries another chat template. Fixtures live in conftest.py; this module holds plain
functions and constants, imported as `from helpers import ...` (conftest.py's folder is on sys.path)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
"""real chat templates, as their models ship them (fixtures/templates/README.md names their sources)"""
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHECK_FILE = textwrap.dedent("""\
    import json, sys, pathlib
    ws = pathlib.Path(sys.argv[1])
    f = ws / "out.txt"
    print(json.dumps({"file_exists": f.exists(), "content": f.exists() and f.read_text().strip() == "hi"}))
""")
"""a hidden check with two results: out.txt exists, and it says hi"""

CHECK_HI = ("import json, sys, pathlib\nf = pathlib.Path(sys.argv[1]) / 'out.txt'\n"
            "print(json.dumps({'out': f.exists() and f.read_text().strip() == 'hi'}))\n")
"""a hidden check with one result: reward 1 when out.txt says hi, else 0"""


def template_fixture(name: str) -> str:
    """The text of a real chat template in fixtures/templates/."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def model_with_template(tiny_model: Path, out: Path, template: str, llama: bool = False) -> Path:
    """A copy of the tiny model whose tokenizer carries `template` (and Llama 3's special tokens)."""
    from transformers import AutoTokenizer

    shutil.copytree(tiny_model, out)
    tok = AutoTokenizer.from_pretrained(out)
    if llama:
        tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                "additional_special_tokens": LLAMA_SPECIALS})
    tok.chat_template = template
    tok.save_pretrained(out)
    return out


def make_task(root: Path, task_id: str, instruction: str = "Write hi to out.txt.", timeout: int = 60,
              check: str = CHECK_FILE) -> Path:
    """A task folder for rollouts: a seeded workspace and a hidden check."""
    d = root / task_id
    (d / "tests").mkdir(parents=True)
    (d / "workspace").mkdir()
    (d / "workspace" / "README.md").write_text("seed file\n")
    (d / "task.toml").write_text(f'[metadata]\nid = "{task_id}"\ncategory = "files"\n\n[agent]\ntimeout_sec = {timeout}\n')
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "tests" / "check.py").write_text(check)
    return d


def scripted_config(tmp_path: Path, tiny_model: Path, script_path: Path, **kw):
    """A RolloutConfig for agentloop rollouts of the tasks in tmp_path/tasks against the scripted engine."""
    from clawgym.rollout.runner import RolloutConfig

    return RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / "out", model=tiny_model,
                         engine="scripted", engine_options={"script": str(script_path)}, **kw)


def tool_call(name: str, **args) -> str:
    """A tool call in the tiny model's (Hermes) form, as a scripted answer."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def script(path: Path, items: dict[str, list]) -> Path:
    """A scripted engine's file: each rollout id's answers in order (a text, or a dict with text/delay_s/error)."""
    with open(path, "w") as f:
        for rid, texts in items.items():
            for t in texts:
                f.write(json.dumps({"rollout_id": rid, **(t if isinstance(t, dict) else {"text": t})}) + "\n")
    return path


def has_marker(pid: str, sandbox_id: str) -> bool:
    """Whether process `pid` runs with `sandbox_id` in its environment (a sandbox's leftover)."""
    try:
        return sandbox_id.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def skip_unless_installed(*names: str) -> None:
    """Skip the calling test, with the harness's own reason (e.g. the npm package it needs), when a harness
    binary is not installed; `scripts/install.sh dev` installs them, so on such a machine nothing skips."""
    import pytest

    from clawgym.rollout.harnesses import HARNESSES

    for name in names:
        if (why := HARNESSES[name]().missing()) is not None:
            pytest.skip(why)
