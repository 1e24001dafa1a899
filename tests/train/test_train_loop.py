"""`clawgym train` end to end on hand-built trees: direction of the update, checkpoints, resume, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from clawgym.artifacts import RolloutRecord, TreeNode, read_metrics, write_table
from clawgym.train import checkpoint as ckpt
from clawgym.train.loop import TrainConfig, train
from clawgym.train.packing import PackedPolicy, collate, pack_tree

PROMPT = list(range(40, 60))
GOOD = [101, 102, 103, 104, 105]
BAD = [201, 202, 203, 204, 205]
TOOL = list(range(300, 310))


def rollout_tree(rid: str, answer: list[int], *, retry: bool = False) -> list[TreeNode]:
    """prompt → answer → tool output → answer again (two turns), plus an optional dead retry leaf."""
    a = len(PROMPT)
    nodes = [
        TreeNode(rid, 0, -1, PROMPT, "env", [], "c0", 0, "main", True, 0),
        TreeNode(rid, 1, 0, answer, "model", [-9.0] * len(answer), "c0", 0, "main", True, a),
        TreeNode(rid, 2, 1, TOOL, "env", [], "c1", 0, "main", True, a + len(answer)),
        TreeNode(rid, 3, 2, answer, "model", [-9.0] * len(answer), "c1", 0, "main", True, a + len(answer) + len(TOOL)),
    ]
    if retry:
        nodes.append(TreeNode(rid, 4, 2, [7, 8, 9], "model", [-1.0] * 3, "c1r", 0, "main", False, a + len(answer) + len(TOOL), "dead_leaf"))
    return nodes


def rollout(rid: str, group: str, reward: float | None, status: str = "ok") -> RolloutRecord:
    return RolloutRecord(rid, group.split("+")[0], "agentloop", group, 0, status, reward, 2, 1.0, 0)


def write_step(d: Path, *, zero_variance: bool = True) -> Path:
    """A step directory: one group with two good (reward 1) and two bad (reward 0) rollouts,
    a zero-variance group (the good answer at reward 0.5) unless told not to, and an infra_error
    rollout (excluded)."""
    nodes, rows = [], []
    for i, (answer, r) in enumerate([(GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0)]):
        nodes += rollout_tree(f"g{i}", answer, retry=i == 0)
        rows.append(rollout(f"g{i}", "t1+agentloop", r))
    for i in range(2 if zero_variance else 0):
        nodes += rollout_tree(f"z{i}", GOOD)
        rows.append(rollout(f"z{i}", "t2+agentloop", 0.5))
    nodes += rollout_tree("x0", BAD)
    rows.append(rollout("x0", "t1+agentloop", None, "infra_error"))
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    return d


@pytest.fixture
def step(tmp_path: Path) -> Path:
    return write_step(tmp_path / "step-0001")


def answer_logprob(model_dir: Path, answer: list[int]) -> float:
    """Mean logprob of the answer's tokens on a fresh tree, scored the way the trainer scores."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    tree = pack_tree(rollout_tree("probe", answer))
    with torch.no_grad():
        logp, _ = PackedPolicy(lm)(collate([tree], [0]))
    return float(logp.mean())


def cfg(step: Path, model: Path, out: Path, **kw) -> TrainConfig:
    return TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=model, out=out, **kw)


def test_grpo_step_raises_positive_and_lowers_negative_advantage_tokens(step, tiny_model, tmp_path):
    out = tmp_path / "ckpt"
    res = train(cfg(step, tiny_model, out, lr=1e-3, epochs=1, minibatches=1))
    assert res.updates == 1 and res.rollouts == 4  # zero-variance group and infra_error left out
    assert answer_logprob(out, GOOD) > answer_logprob(tiny_model, GOOD) + 1e-3
    assert answer_logprob(out, BAD) < answer_logprob(tiny_model, BAD) - 1e-3
    (line,) = read_metrics(step / "train.jsonl")
    v = line.values
    assert v["train/zero_var_groups"] == 1 and v["train/groups"] == 2 and v["train/rollouts"] == 4
    assert v["train/trainable_tokens"] == 4 * 2 * len(GOOD)
    assert v["train/clip_frac"] == 0  # first update: ratio is 1
    assert v["train/mismatch_abs"] > 0 and v["train/mismatch_k3"] > 0 and v["train/entropy"] > 0
    assert v["train/tis_clip_frac"] == pytest.approx(1.0)  # engine logprobs of -9 are far below the policy's
    assert 0 < v["train/tree_token_ratio"] <= 1 and v["train/tokens_forwarded"] > 0 and v["train/grad_norm"] > 0


@pytest.mark.slow
def test_checkpoint_is_hf_loadable_and_complete(step, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "ckpt"
    train(cfg(step, tiny_model, out, epochs=2, minibatches=2))
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "optimizer.pt", "train_config.json"):
        assert (out / name).exists(), name
    assert not (out / ckpt.BATCH_FILE).exists()
    state = ckpt.load_state(out)
    assert state.complete and state.updates_done == 4 and state.epochs_done == 2
    AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    assert [m.values["train/update"] for m in read_metrics(step / "train.jsonl")] == [1, 2, 3, 4]
    # The next step starts from this checkpoint and reuses its optimizer state.
    train(cfg(step, out, tmp_path / "next", metrics=tmp_path / "m.jsonl"))
    assert ckpt.load_state(tmp_path / "next").complete


def test_a_step_trains_at_its_own_lr_not_the_one_saved_with_the_optimizer_state(step, tiny_model, tmp_path):
    from safetensors.torch import load_file

    first = tmp_path / "sft"
    train(cfg(step, tiny_model, first, algo="sft", lr=1e-2, min_reward=0.0))  # saves its Adam state (lr 1e-2)
    nxt = tmp_path / "next"
    train(cfg(step, first, nxt, lr=1e-7, metrics=tmp_path / "m.jsonl"))
    a, b = load_file(first / "model.safetensors"), load_file(nxt / "model.safetensors")
    moved = max(float((a[k] - b[k]).abs().max()) for k in a)
    # Adam moves a weight by at most about lr per update: 1e-7 here, 1e-2 at the saved lr.
    assert 0 < moved < 1e-5
    saved = torch.load(nxt / ckpt.OPTIMIZER_FILE, weights_only=True)
    assert {g["lr"] for g in saved["param_groups"]} == {1e-7}
    assert all(s["step"] > 1 for s in saved["state"].values())  # the moments and step counts did carry over


@pytest.mark.slow
def test_resume_after_a_kill_matches_an_uninterrupted_run(step, tiny_model, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    whole = tmp_path / "whole"
    train(cfg(step, tiny_model, whole, lr=1e-3, epochs=2, minibatches=2, metrics=tmp_path / "w.jsonl"))

    real_save, calls = ckpt.save_checkpoint, []

    def dying_save(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while writing the second epoch's checkpoint
        return real_save(*a, **k)

    part = tmp_path / "part"
    monkeypatch.setattr(ckpt, "save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train(cfg(step, tiny_model, part, lr=1e-3, epochs=2, minibatches=2, metrics=tmp_path / "p.jsonl"))
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    state = ckpt.load_state(part)
    assert not state.complete and state.epochs_done == 1 and (part / ckpt.BATCH_FILE).exists()
    with pytest.raises(Exception, match="--resume"):
        train(cfg(step, tiny_model, part, lr=1e-3, epochs=2, minibatches=2, metrics=tmp_path / "p.jsonl"))
    train(cfg(step, tiny_model, part, lr=1e-3, epochs=2, minibatches=2, metrics=tmp_path / "p.jsonl", resume=True))
    assert ckpt.load_state(part).complete
    a, b = load_file(whole / "model.safetensors"), load_file(part / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)
    assert [m.values["train/update"] for m in read_metrics(tmp_path / "p.jsonl")] == [1, 2, 3, 4]
    # Resuming a complete checkpoint is a no-op; writing over it needs --force.
    again = train(cfg(step, tiny_model, part, lr=1e-3, epochs=2, minibatches=2, metrics=tmp_path / "p.jsonl", resume=True))
    assert again.updates == 4 and len(read_metrics(tmp_path / "p.jsonl")) == 4
    with pytest.raises(Exception, match="--force"):
        train(cfg(step, tiny_model, part, metrics=tmp_path / "p.jsonl"))


def test_a_kill_between_the_two_renames_leaves_the_previous_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    (tmp_path / "ckpt.old-123").mkdir()
    (tmp_path / "ckpt.old-123" / "trainer_state.json").write_text("{}")
    (tmp_path / ".ckpt.tmp-abc").mkdir()
    ckpt.recover(out)
    assert (out / "trainer_state.json").exists()
    assert not (tmp_path / "ckpt.old-123").exists() and not (tmp_path / ".ckpt.tmp-abc").exists()


@pytest.mark.slow
def test_ppo_warms_up_the_value_model_and_moves_the_policy(tiny_model, tmp_path):
    # Without the zero-variance group: there the good answer follows the same prompt at reward 0.5, so a
    # value model fitted well predicts ~0.75 after good tokens and ~0 after bad ones, and the bad answer's
    # advantage (R − V) is ~0 past its first token. Whether it then falls depends on how far the value
    # model is from that fit, which bf16 autocast (CUDA) changes. Here V(prompt) = 0.5 gives every
    # answer's first token a clear ±0.5 however well the rest is fitted.
    step = write_step(tmp_path / "step-0001", zero_variance=False)
    out = tmp_path / "ppo"
    res = train(cfg(step, tiny_model, out, algo="ppo", lr=1e-3, value_lr=3e-3, value_warmup_steps=8))
    first = res.last
    assert first["train/value_warmup_loss_last"] < first["train/value_warmup_loss_first"]
    assert (out / "value" / "value_head.safetensors").exists() and (out / "value" / "optimizer.pt").exists()
    assert answer_logprob(out, GOOD) > answer_logprob(tiny_model, GOOD)
    assert answer_logprob(out, BAD) < answer_logprob(tiny_model, BAD)
    # The next PPO step loads this value model rather than a fresh one.
    from clawgym.train.value import load_value_model

    _, fresh = load_value_model(out)
    assert not fresh


def test_a_fresh_value_head_starts_at_the_batch_mean_return(step, tiny_model, tmp_path):
    """Not at 0, and not wherever Adam's first steps throw it: V ≡ the mean return (rewards 1, 0, 1, 0, .5, .5)."""
    from safetensors.torch import load_file

    out = tmp_path / "ppo-start"
    res = train(cfg(step, tiny_model, out, algo="ppo", lr=1e-3, value_lr=0.0))  # value_lr 0: the head stays put
    head = load_file(out / "value" / "value_head.safetensors")
    assert float(head["weight"].abs().max()) == 0.0
    assert float(head["bias"]) == pytest.approx(0.5, abs=0.05)
    assert res.last["train/value_mean"] == pytest.approx(float(head["bias"]), abs=1e-5)
    assert res.last["train/adv_mean"] == pytest.approx(0.0, abs=1e-5)  # whitened over the batch


def test_sft_trains_only_on_rollouts_above_min_reward(step, tiny_model, tmp_path):
    out = tmp_path / "sft"
    res = train(cfg(step, tiny_model, out, algo="sft", lr=1e-3, min_reward=1.0))
    assert res.rollouts == 2
    assert answer_logprob(out, GOOD) > answer_logprob(tiny_model, GOOD) + 1e-3


def test_all_zero_variance_writes_the_unchanged_policy(tmp_path, tiny_model):
    d = tmp_path / "s"
    write_table(d / "trees.parquet", rollout_tree("a", GOOD) + rollout_tree("b", GOOD), TreeNode)
    write_table(d / "rollouts.parquet", [rollout("a", "t+h", 1.0), rollout("b", "t+h", 1.0)], RolloutRecord)
    res = train(cfg(d, tiny_model, tmp_path / "o"))
    assert res.updates == 0 and ckpt.load_state(tmp_path / "o").complete
    assert read_metrics(d / "train.jsonl")[0].values["train/zero_var_groups"] == 1


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    from clawgym.cli import main

    monkeypatch.setattr(sys, "argv", ["clawgym", *args])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr().err


def test_cli_train_runs_on_a_step_directory(step, tiny_model, tmp_path, monkeypatch, capsys):
    from clawgym.cli import main

    monkeypatch.setattr(sys, "argv", ["clawgym", "train", str(step), "--model", str(tiny_model), "--out", str(tmp_path / "c")])
    try:
        main()
    except SystemExit as e:
        assert e.code in (0, None)
    assert "1 updates on 4 rollouts" in capsys.readouterr().out
    assert json.loads((tmp_path / "c" / "train_config.json").read_text())["algo"] == "grpo"


def test_cli_bad_inputs_give_one_clear_line(step, tiny_model, tmp_path, monkeypatch, capsys):
    base = ["--model", str(tiny_model), "--out", str(tmp_path / "c")]
    code, err = run_cli(["train", str(tmp_path / "nowhere"), *base], monkeypatch, capsys)
    assert code == 1 and "nowhere/" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    code, err = run_cli(["train", str(step), *base, "--algo", "dpo"], monkeypatch, capsys)
    assert code == 1 and "--algo must be one of grpo, ppo, sft" in err
    code, err = run_cli(["train", str(step), "--model", str(tmp_path), "--out", str(tmp_path / "c")], monkeypatch, capsys)
    assert code == 1 and "not a model directory" in err
    d = tmp_path / "untrainable"
    nodes = rollout_tree("a", GOOD)
    for n in nodes:
        n.role = "subagent" if n.kind == "model" else n.role
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", [rollout("a", "t+h", 1.0)], RolloutRecord)
    code, err = run_cli(["train", str(d), *base], monkeypatch, capsys)
    assert code == 1 and "no trainable tokens" in err


@pytest.mark.slow
def test_kl_to_a_reference_and_the_other_modes_still_move_the_right_way(step, tiny_model, tmp_path):
    out = tmp_path / "kl"
    res = train(cfg(step, tiny_model, out, lr=1e-3, kl_coef=0.1, ref_model=tiny_model, tis="sequence",
                    aggregation="rollout-mean", minibatches=2, epochs=2, clip_low=0.1, clip_high=0.3))
    assert res.updates == 4
    lines = read_metrics(step / "train.jsonl")
    assert lines[0].values["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    assert lines[-1].values["train/kl_ref"] > 0
    assert answer_logprob(out, GOOD) > answer_logprob(tiny_model, GOOD)
    with pytest.raises(Exception, match="--ref-model"):
        train(cfg(step, tiny_model, tmp_path / "x", kl_coef=0.1))


def test_a_branching_tree_reports_the_tokens_packing_saved(tmp_path, tiny_model):
    """Two kept main branches share the prompt: packed once, it saves len(PROMPT) tokens over per-path forwarding."""
    d = tmp_path / "step-0001"
    nodes, rows = [], []
    for i, r in enumerate((1.0, 0.0)):
        tree = rollout_tree(f"b{i}", GOOD)
        tree.append(TreeNode(f"b{i}", 4, 0, BAD, "model", [-9.0] * len(BAD), "c2", 0, "main", True, len(PROMPT)))
        nodes += tree
        rows.append(rollout(f"b{i}", "t1+agentloop", r))
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    train(cfg(d, tiny_model, tmp_path / "ckpt", lr=1e-3))
    (line,) = read_metrics(d / "train.jsonl")
    path_tokens = 2 * (len(PROMPT) + 2 * len(GOOD) + len(TOOL) + len(PROMPT) + len(BAD))
    assert line.values["train/tokens_saved"] == 2 * len(PROMPT)
    assert line.values["train/tree_token_ratio"] == pytest.approx((path_tokens - 2 * len(PROMPT)) / path_tokens)


def test_several_updates_per_step_return_the_step_metrics_by_each_keys_rule(step, tiny_model, tmp_path):
    from clawgym.layout import StepLayout
    from clawgym.run.metrics import step_values

    res = train(cfg(step, tiny_model, tmp_path / "c", epochs=2, minibatches=2, lr=1e-3))
    lines = [m.values for m in read_metrics(step / "train.jsonl")]
    assert res.updates == 4 and len(lines) == 4
    m = res.metrics
    assert m["train/update"] == 4 and m["train/epoch"] == 1
    assert m["train/trainable_tokens"] == res.trainable_tokens and m["train/rollouts"] == res.rollouts == 4  # the batch once
    assert m["train/tokens_forwarded"] == sum(v["train/tokens_forwarded"] for v in lines)
    assert m["train/loss"] == pytest.approx(sum(v["train/loss"] for v in lines) / 4)
    assert m["train/grad_norm_max"] == max(v["train/grad_norm"] for v in lines)
    # `clawgym inspect` of a chained run reduces train.jsonl by the same table; a resumed loop gets the same from train()
    assert {k: v for k, v in step_values(StepLayout(step)).items() if k.startswith("train/")} == pytest.approx(m)
    again = train(cfg(step, tiny_model, tmp_path / "c", epochs=2, minibatches=2, lr=1e-3, resume=True))
    assert again.metrics == pytest.approx(m)
