"""The SFT cold start: the teacher engine through the real path (agentloop → proxy → records → trees → train --algo sft), and [sft] recipe checks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from clawgym import artifacts as A
from clawgym.run import progress as P
from clawgym.run import metrics as M
from clawgym.run.recipe import load_recipe
from clawgym.engines import EngineConfig, EngineError, Sampling, make_engine
from clawgym.engines.base import Chat, ReadsChat
from clawgym.errors import UserError
from clawgym.rollout.harnesses.agentloop import SYSTEM_PROMPT, TOOLS
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from clawgym.tasks.families import FAMILIES, make_tasks
from clawgym.tasks.generated import Reply, ToolCall
from clawgym.engines.teacher import HARNESSES, fit_call, harness_form, offered_tools, read_chat, workdir
from clawgym.train.loop import TrainConfig, train
from clawgym.trees import resolve_config, run_build_trees
from helpers import model_with_template, skip_unless_installed, template_fixture


def render(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_the_teacher_reads_the_conversation_and_answers_in_the_served_tokenizer(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = make_engine("teacher", EngineConfig(tiny_model, {"family": "lookup"}))
    assert isinstance(engine, ReadsChat)  # the proxy hands it the parsed conversation
    instruction = "Write the value of key log to answer.txt."
    msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]
    first = FAMILIES["lookup"].teach(instruction, [])
    assert first == Reply(calls=(ToolCall("bash", {"command": "grep -h log= *"}),))
    msgs += [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "bash", "arguments": json.dumps({"command": "grep -h log= *"})}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "exit code 0\nlog=7\n"}]
    assert read_chat(Chat(msgs, TOOLS), HARNESSES["agentloop"]) == ([instruction], ["exit code 0\nlog=7\n"])
    gen = asyncio.run(engine.generate_chat(render(tok, msgs), Chat(msgs, TOOLS), Sampling(max_tokens=64), "r1"))
    # The init-model template's own (Hermes) call form, then its end of turn.
    hermes = '<tool_call>\n{"name": "write", "arguments": {"path": "answer.txt", "content": "7"}}\n</tool_call>'
    assert gen.output_ids == tok(hermes).input_ids + [tok.eos_token_id] and gen.finish_reason == "stop"
    msgs += [{"role": "assistant", "content": tok.decode(gen.output_ids[:-1])}, {"role": "tool", "tool_call_id": "c2", "content": "exit code 0\n"}]
    done = asyncio.run(engine.generate_chat(render(tok, msgs), Chat(msgs, TOOLS), Sampling(max_tokens=64), "r1"))
    assert done.output_ids == tok("done").input_ids + [tok.eos_token_id]
    foreign = [{"role": "user", "content": "What is 2+2?"}]
    with pytest.raises(EngineError, match="teacher 'lookup' cannot answer rollout 'r2'"):
        asyncio.run(engine.generate_chat(render(tok, foreign), Chat(foreign, TOOLS), Sampling(max_tokens=64), "r2"))
    with pytest.raises(EngineError, match="answers from the conversation"):
        asyncio.run(engine.generate(render(tok, foreign), Sampling(max_tokens=64), "r2"))
    with pytest.raises(EngineError, match="no weights to reload"):
        asyncio.run(engine.reload(tiny_model))
    for options in ({}, {"family": "nope"}):
        with pytest.raises(UserError, match="needs a task family, one of: lookup"):
            make_engine("teacher", EngineConfig(tiny_model, options))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_teacher_trajectories_go_through_proxy_and_harness_and_sft_trains_on_them(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    make_tasks("lookup", tmp_path / "tasks", n=3, seed=0, split="train")
    step = tmp_path / "sft"
    summary = run_rollouts(RolloutConfig(
        tasks=tmp_path / "tasks", harnesses=["agentloop"], out=step, group_size=1, concurrency=3, model=tiny_model,
        engine="teacher", engine_options={"family": "lookup"}, timeout_s=120,
        harness_options={"agentloop": {"max_turns": 4, "max_tokens": 64}}), Console(stderr=True))
    assert [r.reward for r in summary.rollouts] == [1.0, 1.0, 1.0], [r.error for r in summary.rollouts]
    calls = A.read_table(step / "calls.parquet", A.CallRecord)
    assert len(calls) == 9  # search, write, done: three recorded calls per rollout
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for c in calls:  # the recorded output is the served (student's) tokenizer's encoding of the teacher's text
        text = tok.decode(c.output_ids[:-1])
        assert c.output_ids == tok(text).input_ids + [tok.eos_token_id]
    run_build_trees(resolve_config(step, None, None, None, 64, step / "trees.metrics.jsonl", 0), Console(stderr=True))
    (trees,) = A.read_metrics(step / "trees.metrics.jsonl")
    v = trees.values
    assert v["trees/tokens_saved"] == v["trees/call_tokens"] - v["trees/tree_tokens"] > 0  # calls share their prompts
    res = train(TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model,
                            out=tmp_path / "ckpt", algo="sft", lr=1e-3, epochs=1))
    assert res.rollouts == 3 and res.trainable_tokens == sum(len(c.output_ids) for c in calls)


def test_the_teacher_fits_its_calls_to_the_tools_the_harness_offers() -> None:
    def chat(*specs: tuple[str, list[str]], system: str = "", results: tuple[str, ...] = ()) -> Chat:
        tools = [{"type": "function", "function": {"name": n, "parameters": {
            "type": "object", "properties": {p: {"type": "string"} for p in ps}}}} for n, ps in specs]
        return Chat([{"role": "system", "content": system}, {"role": "user", "content": "task"}]
                    + [{"role": "tool", "content": r} for r in results], tools)

    def fit(call: ToolCall, c: Chat) -> tuple[str, dict]:
        tools = offered_tools(c)
        form = harness_form(tools)
        return fit_call(call, tools, form, workdir(c, form))

    write = ToolCall("write", {"path": "answer.txt", "content": "it's 4"})
    printf = "printf '%s' 'it'\"'\"'s 4' > answer.txt"
    # Claude Code's system blocks arrive run together: its CWD line may follow other text directly
    claude = chat(("Bash", ["command", "timeout"]), ("Write", ["file_path", "content"]), system="SDK.CWD: /workspace\n\n")
    assert harness_form(offered_tools(claude)) is HARNESSES["claude-code"]
    assert fit(write, claude) == ("Write", {"file_path": "/workspace/answer.txt", "content": "it's 4"})
    assert fit(ToolCall("bash", {"command": "ls"}), claude) == ("Bash", {"command": "ls"})
    openclaw = chat(("exec", ["command"]), ("read", ["path"]))
    assert fit(write, openclaw) == ("exec", {"command": printf})
    # OpenClaw slim's four tools: its own write takes the family's arguments; exec's output arrives bare
    slim = chat(("exec", ["title", "command", "workdir", "env", "timeoutSeconds", "pty"]), ("read", ["path", "offset", "limit"]),
                ("write", ["path", "content"]), ("edit", ["path", "edits"]), system="## Workspace\nWorking directory: /workspace\n",
                results=("data=6",))
    assert harness_form(offered_tools(slim)) is HARNESSES["openclaw"]
    assert fit(write, slim) == ("write", dict(write.arguments))
    assert fit(ToolCall("bash", {"command": "grep -h data= *"}), slim) == ("exec", {"command": "grep -h data= *"})
    assert read_chat(slim, HARNESSES["openclaw"]) == (["task"], ["data=6"])
    codex = chat(("exec_command", ["cmd", "workdir"]), ("write_stdin", ["chars"]),
                 results=("Chunk ID: 1\nWall time: 0.1 seconds\nProcess exited with code 0\nOriginal token count: 2\nOutput:\nlog=7\n",))
    assert fit(ToolCall("bash", {"command": "cat a.txt"}), codex) == ("exec_command", {"cmd": "cat a.txt"})
    assert fit(write, codex) == ("exec_command", {"cmd": printf})
    assert read_chat(codex, harness_form(offered_tools(codex))) == (["task"], ["log=7\n"])  # the command's output alone
    agentloop = chat(("bash", ["command"]), ("write", ["path", "content"]))
    assert fit(write, agentloop) == ("write", dict(write.arguments))
    assert offered_tools(chat()) == {} and fit(write, chat()) == ("write", dict(write.arguments))


def test_the_teacher_serves_a_llama3_template_through_the_proxy(tiny_model: Path, tmp_path: Path) -> None:
    """Under Llama 3.2's template (headers, not ChatML; tools in the first user message, results under
    `ipython`) the teacher still finds the instruction and the tool results, because it reads the
    conversation the proxy parsed, and it answers in Llama's own call form, which the proxy parses
    back into tool calls. (It read decoded ChatML before and found no instruction here.)"""
    import openai
    from transformers import AutoTokenizer

    from clawgym.proxy import ProxyConfig, ProxyThread, read_records

    model = model_with_template(tiny_model, tmp_path / "llama", template_fixture("llama3.2.jinja"), llama=True)
    tok = AutoTokenizer.from_pretrained(model)
    config = ProxyConfig(model_dir=model, engine="teacher", engine_options={"family": "lookup"}, port=0,
                         records_dir=tmp_path / "records", audit_render=True)
    with ProxyThread(config) as proxy:
        assert proxy.server.tool_parser == "llama3-json"
        reg = proxy.register("llama-teacher")
        client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": "Write the value of key log to answer.txt."}]
        answers = []
        for result in ("exit code 0\nlog=7\n", "exit code 0\n", None):
            msg = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_completion_tokens=64).choices[0].message
            answers.append([(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []] or msg.content)
            if result is not None:
                call = msg.tool_calls[0]
                messages += [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                             {"role": "tool", "tool_call_id": call.id, "content": result}]
        proxy.settle("llama-teacher")
        recorded = [tok.decode(r.output_ids) for r in read_records(proxy.config.records_dir / "llama-teacher.jsonl")]
    assert answers == [[("bash", {"command": "grep -h log= *"})], [("write", {"path": "answer.txt", "content": "7"})], "done"]
    # the recorded ids are the student's tokenizer's, in Llama's call form, through its end of turn
    assert recorded[0] == '{"name": "bash", "parameters": {"command": "grep -h log= *"}}<|eot_id|>' and recorded[2] == "done<|eot_id|>"


def teacher_calls_through(harness: str, model: Path, tmp_path: Path, step: Path, **config: Any) -> list[dict]:
    """The teacher solves 3 lookup tasks through the real `harness` binary into `step` (each must score
    1.0); the tool calls of its transcripts. `config` sets other RolloutConfig fields (a chat template,
    harness options, engine options in place of a window large enough for any harness's prompt).
    Skips where the binary is missing (scripts/install.sh dev installs it, so CI runs these)."""
    skip_unless_installed(harness)
    make_tasks("lookup", tmp_path / "tasks", n=3, seed=0, split="train")
    config = {"engine_options": {"family": "lookup", "max_context": 65536}, "timeout_s": 300} | config
    summary = run_rollouts(RolloutConfig(
        tasks=tmp_path / "tasks", harnesses=[harness], out=step, group_size=1, concurrency=3, model=model, engine="teacher", **config),
        Console(stderr=True))
    assert [r.reward for r in summary.rollouts] == [1.0, 1.0, 1.0], [r.error for r in summary.rollouts]
    return [c for line in (step / "transcripts.jsonl").read_text().splitlines()
            for m in json.loads(line)["messages"] for c in m.get("tool_calls") or []]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_teacher_trajectories_through_claude_code_use_its_own_tools_and_sft_trains_on_its_prompts(tiny_model: Path, tmp_path: Path) -> None:
    """Teacher data collected through the real Claude Code binary: the family's calls are fitted to the
    tools Claude Code offers (Bash; Write with an absolute file_path), every task is solved, and SFT
    trains on trees whose prompts are Claude Code's own."""
    step = tmp_path / "sft"
    called = teacher_calls_through("claude-code", tiny_model, tmp_path, step)
    assert sorted({(c["name"], tuple(sorted(c["arguments"]))) for c in called}) == [("Bash", ("command",)), ("Write", ("content", "file_path"))]
    writes = [c["arguments"]["file_path"] for c in called if c["name"] == "Write"]
    assert len(writes) == 3 and all(p.startswith("/") and p.endswith("/answer.txt") for p in writes)
    run_build_trees(resolve_config(step, None, None, None, 64, step / "trees.metrics.jsonl", 0), Console(stderr=True))
    res = train(TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model,
                            out=tmp_path / "ckpt", metrics=tmp_path / "sft.jsonl", algo="sft", lr=3e-3, epochs=3, minibatches=1))
    assert res.rollouts == 3
    losses = [m.values["train/loss"] for m in A.read_metrics(tmp_path / "sft.jsonl")]
    assert len(losses) == 3 and losses[-1] < losses[0] - 1.0, losses


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_teacher_trajectories_through_codex_use_its_shell_tool(tiny_model: Path, tmp_path: Path) -> None:
    """Teacher data collected through the real Codex binary: Codex's `exec_command` (parameter `cmd`)
    carries both the search and the write, and every task is solved."""
    called = teacher_calls_through("codex", tiny_model, tmp_path, tmp_path / "sft")
    assert {c["name"] for c in called} == {"exec_command"} and len(called) == 6
    assert sum(c["arguments"]["cmd"].startswith("printf ") for c in called) == 3


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_teacher_trajectories_through_openclaw_slim_use_its_exec_and_write_in_smollm2s_call_form(smollm2_model: Path, tmp_path: Path) -> None:
    """Teacher data collected through the real OpenClaw with `slim`, served with SmolLM2's tokenizer,
    window (8,192) and template (smollm2-tools): OpenClaw's `exec` (parameter `command`) carries the
    search, its own `write` (`path` relative to its working directory, `content`) the answer, which is
    the first line of exec's output as OpenClaw returns it; every call is recorded in SmolLM2's call
    form and parsed back by the proxy, and every task is solved."""
    from transformers import AutoTokenizer

    step = tmp_path / "sft"
    called = teacher_calls_through("openclaw", smollm2_model, tmp_path, step, engine_options={"family": "lookup"},
                                   chat_template="smollm2-tools", harness_options={"openclaw": {"slim": True, "max_tokens": 48}})
    assert sorted({(c["name"], tuple(sorted(c["arguments"]))) for c in called}) == [("exec", ("command",)), ("write", ("content", "path"))]
    assert [c["arguments"]["path"] for c in called if c["name"] == "write"] == ["answer.txt"] * 3
    tok = AutoTokenizer.from_pretrained(smollm2_model)
    calls = A.read_table(step / "calls.parquet", A.CallRecord)
    texts = [tok.decode(c.output_ids) for c in calls]
    assert len(texts) == 9 and all(c.role == "main" and len(c.prompt_ids) + len(c.output_ids) <= 8192 for c in calls)
    searches = [t for t in texts if t.startswith('<tool_call>[{"name": "exec", "arguments": {"command": "grep ')]
    writes = [t for t in texts if t.startswith('<tool_call>[{"name": "write", "arguments": {"path": "answer.txt", ')]
    assert len(searches) == len(writes) == 3 and all(t.endswith("}}]</tool_call><|im_end|>") for t in searches + writes)
    assert texts.count("done<|im_end|>") == 3
    assert sorted(c.finish_reason for c in calls) == ["stop"] * 3 + ["tool_calls"] * 6  # the proxy parsed each call


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_teacher_answers_in_the_served_templates_own_call_form_smollm2(smollm2_model: Path, tmp_path: Path) -> None:
    """SmolLM2's template calls tools as a JSON list: the teacher's recorded answers are in that form,
    the proxy parses them as tool calls (json-list parser), and every task is solved."""
    from transformers import AutoTokenizer

    make_tasks("lookup", tmp_path / "tasks", n=3, seed=0, split="train")
    step = tmp_path / "sft"
    summary = run_rollouts(RolloutConfig(
        tasks=tmp_path / "tasks", harnesses=["agentloop"], out=step, group_size=1, concurrency=3, model=smollm2_model,
        engine="teacher", engine_options={"family": "lookup"}, chat_template="smollm2-tools", timeout_s=120,
        harness_options={"agentloop": {"max_turns": 4, "max_tokens": 64, "tools": ["bash", "write"]}}), Console(stderr=True))
    assert [r.reward for r in summary.rollouts] == [1.0, 1.0, 1.0], [r.error for r in summary.rollouts]
    calls = A.read_table(step / "calls.parquet", A.CallRecord)
    tok = AutoTokenizer.from_pretrained(smollm2_model)
    texts = [tok.decode(c.output_ids) for c in calls]
    assert len(texts) == 9 and all(c.output_ids[-1] == tok.eos_token_id for c in calls)  # <|im_end|>
    searches = [t for t in texts if t.startswith('<tool_call>[{"name": "bash", "arguments": {"command": "grep ')]
    writes = [t for t in texts if t.startswith('<tool_call>[{"name": "write", "arguments": {"path": "answer.txt", ')]
    assert len(searches) == len(writes) == 3 and all(t.endswith("}}]</tool_call><|im_end|>") for t in searches + writes)
    assert texts.count("done<|im_end|>") == 3
    assert sorted(c.finish_reason for c in calls) == ["stop"] * 3 + ["tool_calls"] * 6  # the proxy parsed each call


def recipe(tmp_path: Path, sft: str) -> Path:
    make_tasks("lookup", tmp_path / "tasks", n=3, seed=0, split="train", force=True)
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\n[sft]\n{sft}\n')
    return path


def test_sft_section_is_checked(tmp_path: Path) -> None:
    r = load_recipe(recipe(tmp_path, 'demonstrations = 2\nfamily = "lookup"\nepochs = 3'))
    assert (r.sft.demonstrations, r.sft.epochs, r.sft.engine, r.sft.tasks) == (2, 3, "teacher", None)
    for text, message in (('demonstrations = 2', "the teacher engine needs a task family"),
                          ('demonstrations = 2\nfamily = "nope"', "needs a task family, one of: lookup"),
                          ('demonstrations = 2\nfamily = "lookup"\nengine = "gpt"', "unknown engine 'gpt'"),
                          ('demonstrations = 2\nfamily = "lookup"\nepochs = 0', "'epochs' must be at least 1"),
                          ('demonstrations = 2\nfamily = "lookup"\ntasks = "missing"', "is not a directory"),
                          ('demonstrations = 1\nsteps = 3', "unknown key 'steps'")):
        with pytest.raises(UserError, match=message):
            load_recipe(recipe(tmp_path, text))
    assert load_recipe(recipe(tmp_path, "demonstrations = 0")).sft.demonstrations == 0  # no cold start: nothing else is needed


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_run_with_sft_cold_starts_then_trains_from_the_sft_policy_and_writes_the_table(tmp_path: Path) -> None:
    import subprocess
    import sys

    make_tasks("lookup", tmp_path / "train", n=3, seed=0, split="train")
    make_tasks("lookup", tmp_path / "heldout", n=3, seed=0, split="heldout")
    (tmp_path / "r.toml").write_text("""
[run]
name = "cold"
steps = 1
[model]
init = "tiny"
[rollout]
tasks = "train"
group_size = 2
timeout_s = 120
[rollout.agentloop]
max_turns = 3
max_tokens = 40
tools = ["bash", "write"]
[sft]
demonstrations = 1
family = "lookup"
epochs = 1
minibatches = 1
[train]
lr = 0.001
[eval]
every = 1
tasks = "heldout"
samples_per_task = 1
""")
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(tmp_path / "r.toml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=1700)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / "cold"
    lines = A.read_metrics(run / "metrics.jsonl")
    assert [m.step for m in lines] == [0, 1]
    zero, one = lines[0].values, lines[1].values
    assert zero["rollout/teacher_reward_mean"] == 1.0 and zero["rollout/teacher_n"] == 3
    assert "eval/base/pass@1" in zero and "eval/pass@1" in zero and "train/sft_loss_last" in zero
    # (a policy that answers without a tool call makes one call per rollout: nothing shared, nothing saved)
    assert one["trees/tokens_saved"] == one["trees/call_tokens"] - one["trees/tree_tokens"] >= 0
    # the per-step lines: the cold start's, then step 1's with its held-out Pass@1
    assert "step 0 (SFT cold start)  teacher reward 1.000  sft loss " in r.stderr
    # the wall time of each cold-start stage, in the metrics and at the end of the step-0 line
    stages = {k: zero[k] for k in ("time/base_eval_s", "time/teach_s", "time/sft_s", "time/sft_eval_s")}
    assert all(s > 0 for s in stages.values()), stages
    assert f"| base eval {P.duration(stages['time/base_eval_s'])}  teacher " in r.stderr
    # each stage's and each phase's peak resident memory: at least the model the process holds
    peaks = [zero[p.peak_key] for p in M.COLD_START_PHASES] + [one[p.peak_key] for p in M.PHASES]
    assert all(0.1 < g < 64 for g in peaks), peaks
    assert "eval/pass@1" in one and f"step 1/1  reward {one['rollout/reward_mean']:.3f}" in r.stderr
    assert f"pass@1 {one['eval/pass@1']:.1%}" in r.stderr
    if one.get("train/rollouts"):  # a batch of flat groups trains nothing and has no packing to report
        assert one["train/tokens_saved"] >= 0
    # step 1 rolled out with the SFT policy (version 0 of this proxy) and trained from it
    start = json.loads((run / "checkpoints" / "step-0001" / "train_config.json").read_text())["model"]
    assert Path(start).resolve() == (run / "checkpoints" / "sft").resolve()
    table = (run / "table.md").read_text()
    assert "| base |" in table and "| SFT |" in table and "| SFT+RL (step-0001) |" in table
    assert "count" in table and "file" in table and "value" in table
    # the held-out tasks were only evaluated: no rollout of them in the SFT or RL batches
    trained = {r.task_id for d in ("sft", "step-0001") for r in A.read_table(run / d / "rollouts.parquet", A.RolloutRecord)}
    assert trained and not {t for t in trained if "heldout" in t}


def test_the_quickstart_recipe_loads_and_its_sft_section_round_trips() -> None:
    root = Path(__file__).resolve().parents[1]
    tasks = root / "recipes" / "tasks"
    r = load_recipe(root / "recipes" / "quickstart.toml")
    assert (r.sft.demonstrations, r.sft.family, r.model.init) == (1, "scan", "small")
    assert r.sft.tasks == tasks / "scan" / "demos" and r.rollout.tasks == tasks / "scan" / "train"
    assert 0 < r.rollout.tasks_per_step < 96
    assert r.eval.tasks == tasks / "scan" / "heldout" and r.eval.every > 0
    assert r.rollout.harness_options["agentloop"]["tools"] == ["bash", "write"]
    from clawgym.run.recipe import recipe_to_toml

    text = recipe_to_toml(r)
    assert "[sft]" in text and 'family = "scan"' in text
    # the shipped task sets: no held-out task's content is trained on, by SFT (the teacher's
    # demonstrations, a few train tasks) or by RL; the lookup sets (the SmolLM2 recipe's) likewise
    def contents(folder: Path) -> set[tuple]:
        return {((d / "instruction.md").read_text(), tuple((d / "workspace" / f).read_text() for f in ("a.txt", "b.txt", "c.txt")))
                for d in folder.iterdir()}

    demos, trained, heldout = (contents(tasks / "scan" / s) for s in ("demos", "train", "heldout"))
    assert len(demos) == 6 and demos <= trained and len(trained) == 96 and len(heldout) == 48
    assert not trained & heldout
    trained, heldout = contents(tasks / "lookup" / "train"), contents(tasks / "lookup" / "heldout")
    assert len(heldout) == 48 and len(trained) == 96 and not trained & heldout


def test_the_smollm2_tools_recipe_loads_and_names_its_pretrained_model_and_template() -> None:
    root = Path(__file__).resolve().parents[1]
    r = load_recipe(root / "recipes" / "smollm2-tools.toml")
    assert (r.model.init, r.model.path, r.engine.name, r.engine.chat_template) == ("smollm2-135m-instruct", None, "hf", "smollm2-tools")
    assert (r.sft.demonstrations, r.sft.family, r.sft.tasks) == (1, "lookup", None)
    assert r.rollout.tasks == root / "recipes" / "tasks" / "lookup" / "train" and r.rollout.tasks_per_step > 0 and r.train["algo"] == "grpo"
    assert r.eval.tasks == root / "recipes" / "tasks" / "lookup" / "heldout" and r.eval.every == r.run.steps  # eval after RL
    from clawgym.run.recipe import recipe_to_toml

    assert 'init = "smollm2-135m-instruct"' in recipe_to_toml(r)


def test_model_init_names_a_size_or_a_pretrained_model(tmp_path: Path) -> None:
    path = recipe(tmp_path, "n = 0")
    path.write_text(path.read_text().replace('init = "tiny"', 'init = "gpt-5"'))
    with pytest.raises(UserError, match=r"\[model\] key 'init': unknown 'gpt-5'; choose a size \(tiny, small.*\) or a pretrained model \(smollm2-135m-instruct"):
        load_recipe(path)
