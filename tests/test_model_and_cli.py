"""init-model determinism, offline loading and the chat template; the CLI's help, version, errors and inspect."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.models.tiny import CHAT_TEMPLATE, MARKUP_TOKENS

OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"}


def clawgym(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clawgym.cli", *args], capture_output=True, text=True, cwd=cwd, env=OFFLINE, timeout=300)


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.slow
def test_init_model_is_byte_identical_for_the_same_seed(tmp_path: Path, tiny_model: Path) -> None:
    r = clawgym("init-model", str(tmp_path / "again"), "--seed", "0")
    assert r.returncode == 0, r.stderr
    assert "Qwen3ForCausalLM" in r.stdout
    assert _digests(tmp_path / "again") == _digests(tiny_model)
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= set(_digests(tiny_model))
    r = clawgym("init-model", str(tmp_path / "other"), "--seed", "1")
    assert r.returncode == 0, r.stderr
    other = _digests(tmp_path / "other")
    assert other["model.safetensors"] != _digests(tiny_model)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(tiny_model)["tokenizer.json"]  # one tokenizer for every seed


def test_model_loads_offline_with_the_expected_shape(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert cfg.head_dim == 64 and cfg.max_position_embeddings >= 32768
    assert model.dtype == torch.float32
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size)


def test_chat_template_renders_tools_calls_and_results(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Make out.txt"},
        {"role": "assistant", "content": "Sure.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo hi > out.txt"}'}},
            {"id": "b", "type": "function", "function": {"name": "read", "arguments": {"path": "out.txt"}}},
        ]},
        {"role": "tool", "tool_call_id": "a", "content": ""},
        {"role": "tool", "tool_call_id": "b", "content": "hi"},
        {"role": "assistant", "content": "Done."},
    ]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}\n</tools>' in text
    assert (
        "<|im_start|>assistant\nSure.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "echo hi > out.txt"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "read", "arguments": {"path": "out.txt"}}\n</tool_call><|im_end|>\n'
    ) in text
    # consecutive tool results share one user turn
    assert "<|im_start|>user\n<tool_response>\n\n</tool_response>\n<tool_response>\nhi\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nDone.<|im_end|>\n<|im_start|>assistant\n")
    # without tools and with no system message, nothing is invented
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # decoding the ids gives the text back, markers included
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_markers_are_single_tokens(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    for marker in [*MARKUP_TOKENS, "<|im_start|>", "<|im_end|>"]:
        ids = tok.encode(marker, add_special_tokens=False)
        assert len(ids) == 1, marker
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok.encode('<tool_call>\n{"name": "x"}\n</tool_call>', add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>") and ids[-1] == tok.convert_tokens_to_ids("</tool_call>")
    # tool-call markers survive skip_special_tokens, as in Qwen3, so parsers see them
    assert "<tool_call>" in tok.decode(ids, skip_special_tokens=True)


def test_template_is_our_own_and_prefix_stable(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    assert tok.chat_template == CHAT_TEMPLATE
    convo = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    short = tok.apply_chat_template(convo, tokenize=False)
    longer = tok.apply_chat_template(convo + [{"role": "user", "content": "u2"}], tokenize=False)
    assert longer.startswith(short)  # the proxy's incremental rendering depends on this


# --- CLI -------------------------------------------------------------------------------------------


def _leaf_commands() -> list[list[str]]:
    """Every runnable command path of the app, e.g. ["harness", "install"]."""
    import typer.main

    from clawgym.cli import app

    out: list[list[str]] = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        else:
            out.append(path)

    walk(typer.main.get_command(app), [])
    return out


@pytest.mark.slow
def test_every_command_has_help_with_an_example() -> None:
    commands = _leaf_commands()
    assert ["init-model"] in commands and ["inspect"] in commands
    for path in commands:
        r = clawgym(*path, "--help")
        assert r.returncode == 0, path
        assert "Example: clawgym " + " ".join(path) in r.stdout, path


def test_version_and_root_help() -> None:
    r = clawgym("--version")
    assert r.returncode == 0 and r.stdout.strip().startswith("clawgym 0.")
    r = clawgym("--help")
    assert r.returncode == 0 and "init-model" in r.stdout and "inspect" in r.stdout


def test_tool_parser_help_names_every_parser() -> None:
    from clawgym.proxy.toolparse import PARSERS

    for command in ("rollout", "eval", "serve-proxy"):
        help_text = " ".join(clawgym(command, "--help").stdout.split())
        line = help_text[help_text.index("--tool-parser"):][:300]
        assert all(name in line for name in ["auto", *PARSERS]), (command, line)


@pytest.mark.slow
def test_usage_error_exits_2_and_runtime_error_exits_1_with_one_line(tmp_path: Path) -> None:
    r = clawgym("init-model")
    assert r.returncode == 2 and "Missing argument 'DIR'" in r.stderr
    r = clawgym("init-model", str(tmp_path / "m"), "--size", "huge")
    assert r.returncode == 1
    assert r.stderr.strip() == "error: unknown --size 'huge'; choose one of: tiny, small"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    r = clawgym("init-model", str(tmp_path / "full"))
    assert r.returncode == 1 and "is not empty; pass --force" in r.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"  # nothing already written is lost
    r = clawgym("inspect", str(tmp_path / "missing.parquet"))
    assert r.returncode == 1 and r.stderr.strip().endswith("missing.parquet: no such file or directory")


@pytest.mark.slow
def test_inspect_model_directory(tiny_model: Path) -> None:
    r = clawgym("inspect", str(tiny_model))
    assert r.returncode == 0, r.stderr
    assert "Qwen3ForCausalLM" in r.stdout and "649,984" in r.stdout
    assert "ok: renders tools" in r.stdout


def _sample_calls() -> list[A.CallRecord]:
    base = dict(protocol="openai-chat", model="m", started_at=0.0, finished_at=1.0, finish_reason="stop", policy_version=3)
    return [
        A.CallRecord(rollout_id="r1", call_id="c0", seq=0, prompt_ids=list(range(30)), output_ids=[1, 2], output_logprobs=[-1.0, -2.0], **base),
        A.CallRecord(rollout_id="r1", call_id="c1", seq=1, prompt_ids=[7], output_ids=[3], output_logprobs=[-3.0],
                     prompt_base_call="c0", prompt_base_len=32, status="engine_error", **base),
    ]


def test_inspect_tables_and_jsonl(tmp_path: Path) -> None:
    A.write_table(tmp_path / "calls.parquet", _sample_calls(), A.CallRecord)
    r = clawgym("inspect", str(tmp_path / "calls.parquet"))
    assert r.returncode == 0, r.stderr
    assert "calls table, schema_version 1, 2 rows" in r.stdout
    assert "1 of 2" in r.stdout and "engine_error: 1" in r.stdout and "-2" in r.stdout  # delta count, status, mean logprob

    rollouts = [
        A.RolloutRecord("r1", "t1", "agentloop", "t1/agentloop", 0, "ok", 1.0, 2, 3.0, 0),
        A.RolloutRecord("r2", "t1", "agentloop", "t1/agentloop", 1, "infra_error", None, 0, 1.0, 0),
    ]
    A.write_table(tmp_path / "rollouts.parquet", rollouts, A.RolloutRecord)
    r = clawgym("inspect", str(tmp_path / "rollouts.parquet"))
    assert r.returncode == 0 and "1 of 2" in r.stdout and "infra_error: 1" in r.stdout

    A.append_metrics(tmp_path / "logs" / "metrics.jsonl", A.MetricsLine(1, {"rollout/reward_mean": 0.125}))
    with open(tmp_path / "logs" / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 2, "rollout/rew')
    r = clawgym("inspect", str(tmp_path / "logs" / "metrics.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "1 complete records" in r.stdout and "torn line 2" in r.stdout and "0.125" in r.stdout

    r = clawgym("inspect", str(tmp_path))
    assert r.returncode == 0 and "calls.parquet" in r.stdout and "rollouts" in r.stdout


def test_inspect_rejects_foreign_files_with_one_line(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    r = clawgym("inspect", str(tmp_path / "other.parquet"))
    assert r.returncode == 1 and "not a clawgym table" in r.stderr
    (tmp_path / "notes.txt").write_text("x")
    r = clawgym("inspect", str(tmp_path / "notes.txt"))
    assert r.returncode == 1 and "don't know how to inspect a '.txt' file" in r.stderr
    A.write_table(tmp_path / "calls.parquet", _sample_calls(), A.CallRecord)
    r = clawgym("inspect", str(tmp_path / "calls.parquet"), "--rollout", "r1")
    assert r.returncode == 1 and "--rollout applies to trees.parquet" in r.stderr


def test_inspect_trees_counts_leaves_per_rollout_and_draws_one(tmp_path: Path) -> None:
    def node(rid: str, nid: int, parent: int, kind: str = "env") -> A.TreeNode:
        return A.TreeNode(rid, nid, parent, [nid + 1] * 3, kind, [-0.1] * 3 if kind == "model" else [], f"c{nid}", 0, "main", True, 3 * nid)

    # rollout a: a chain 0 → 1 → 2 (one leaf); rollout b: 0 → 1 and 0 → 2 (two leaves)
    nodes = [node("a", 0, -1), node("a", 1, 0, "model"), node("a", 2, 1), node("b", 0, -1), node("b", 1, 0, "model"), node("b", 2, 0, "model")]
    A.write_table(tmp_path / "trees.parquet", nodes, A.TreeNode)
    r = clawgym("inspect", str(tmp_path / "trees.parquet"))
    assert r.returncode == 0, r.stderr
    assert "│ leaves" in r.stdout and r.stdout.split("│ leaves")[1].split("│")[1].strip() == "3"
    r = clawgym("inspect", str(tmp_path / "trees.parquet"), "--rollout", "b")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("model") >= 2
    r = clawgym("inspect", str(tmp_path / "trees.parquet"), "--rollout", "zzz")
    assert r.returncode == 1 and "no rollout 'zzz'" in r.stderr


def test_inspect_run_directory_prints_the_per_step_table(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "demo"
    A.append_metrics(run / "metrics.jsonl", A.MetricsLine(1, {"rollout/reward_mean": 0.05, "rollout/reward_mean/agentloop": 0.05,
                                                             "rollout/reward_mean/codex": 0.07, "train/loss": 0.25}))
    A.append_metrics(run / "metrics.jsonl", A.MetricsLine(2, {"rollout/reward_mean": 0.875}))
    r = clawgym("inspect", str(run))
    assert r.returncode == 0, r.stderr
    assert "agentloop" in r.stdout and "codex" in r.stdout and "0.875" in r.stdout and "0.25" in r.stdout


def test_inspect_run_directory_prints_the_cold_start_line_and_the_held_out_table(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "cold"
    A.append_metrics(run / "metrics.jsonl", A.MetricsLine(0, {"rollout/teacher_n": 6, "rollout/teacher_reward_mean": 1.0,
                                                             "eval/base/pass@1": 0.0, "eval/pass@1": 0.615,
                                                             "time/base_eval_s": 362.0, "time/sft_s": 400.0}))
    A.append_metrics(run / "metrics.jsonl", A.MetricsLine(1, {"rollout/reward_mean": 0.625}))
    (run / "table.md").write_text("| policy | overall |\n|---|---|\n| SFT | 61.5 |\n")
    r = clawgym("inspect", str(run))
    assert r.returncode == 0, r.stderr
    assert "step 0 (SFT cold start)  teacher reward 1.000" in r.stdout and "pass@1 0.0% → 61.5%" in r.stdout
    assert "| base eval 6m02s  sft 6m40s" in r.stdout
    assert "| SFT | 61.5 |" in r.stdout
