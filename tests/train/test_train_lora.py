"""LoRA with peft on the tree path: only adapters move, and the merged checkpoint equals the peft model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from clawgym.train import lora
from clawgym.train.attention import implementation
from clawgym.train.loop import train
from clawgym.train.packing import PackedPolicy, collate, pack_tree
from test_train_loop import GOOD, answer_logprob, cfg, rollout_tree, run_cli, step  # noqa: F401 - `step` is a fixture


def test_a_lora_step_changes_only_adapter_weights_and_the_merged_checkpoint_scores_like_the_peft_model(step, tiny_model, tmp_path):  # noqa: F811
    from peft import PeftModel

    out = tmp_path / "ckpt"
    base_before = load_file(tiny_model / "model.safetensors")
    res = train(cfg(step, tiny_model, out, lr=1e-2, lora_rank=4, lora_alpha=8.0, lora_targets="q_proj,v_proj"))
    assert res.updates == 1
    # The adapter trained: B moved off zero. Nothing else did: base weights + adapter reproduce the merge.
    adapter_state = load_file(out / lora.ADAPTER_DIR / "adapter_model.safetensors")
    assert adapter_state and all("lora_" in k for k in adapter_state)
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapter_state.items())
    assert load_file(tiny_model / "model.safetensors").keys() == base_before.keys()
    merged = load_file(out / "model.safetensors")
    changed = {k for k in merged if not torch.equal(merged[k], base_before[k])}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)

    # The merged checkpoint is a plain model; its logprobs equal those of base + adapter under peft.
    attn = implementation("segments")
    plain = AutoModelForCausalLM.from_pretrained(out, attn_implementation=attn, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, out / lora.ADAPTER_DIR)
    tree = pack_tree(rollout_tree("probe", GOOD, retry=True), only_trainable=False)
    with torch.no_grad():
        want, _ = PackedPolicy(peft_model.get_base_model())(collate([tree], [0]))
        got, _ = PackedPolicy(plain)(collate([tree], [0]))
        before, _ = PackedPolicy(AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn))(collate([tree], [0]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got - before).abs().max() > 1e-4  # and the step did change the policy


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo", "sft"])
def test_lora_trains_every_algorithm_in_the_right_direction(algo, step, tiny_model, tmp_path):  # noqa: F811
    out = tmp_path / algo
    train(cfg(step, tiny_model, out, algo=algo, lr=2e-2, lora_rank=8, lora_alpha=16.0, min_reward=1.0))
    assert (out / lora.ADAPTER_DIR / "adapter_config.json").exists()
    assert answer_logprob(out, GOOD) > answer_logprob(tiny_model, GOOD) + 1e-3  # GOOD won reward 1 in every algorithm


@pytest.mark.slow
def test_a_killed_lora_call_resumes_from_its_adapter(step, tiny_model, tmp_path, monkeypatch):  # noqa: F811
    from clawgym.train import checkpoint as ckpt

    kw = dict(lr=1e-2, epochs=2, lora_rank=4, lora_alpha=8.0)
    whole = tmp_path / "whole"
    train(cfg(step, tiny_model, whole, metrics=tmp_path / "w.jsonl", **kw))
    real_save = ckpt.save_checkpoint

    def dying_save(*a, **k):
        real_save(*a, **k)
        raise KeyboardInterrupt  # killed right after the first epoch's checkpoint

    monkeypatch.setattr(ckpt, "save_checkpoint", dying_save)
    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        train(cfg(step, tiny_model, part, metrics=tmp_path / "p.jsonl", **kw))
    monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
    assert not ckpt.load_state(part).complete
    train(cfg(step, tiny_model, part, metrics=tmp_path / "p.jsonl", resume=True, **kw))
    a, b = load_file(whole / "model.safetensors"), load_file(part / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


def test_bad_lora_options_give_one_clear_line(step, tiny_model, tmp_path, monkeypatch, capsys):  # noqa: F811
    base = ["train", str(step), "--model", str(tiny_model), "--out", str(tmp_path / "c")]
    code, err = run_cli([*base, "--lora-rank", "-1"], monkeypatch, capsys)
    assert code == 1 and "--lora-rank must be 0" in err and len(err.strip().splitlines()) == 1
    code, err = run_cli([*base, "--lora-rank", "4", "--lora-targets", "no_such_proj"], monkeypatch, capsys)
    assert code == 1 and "--lora-targets 'no_such_proj'" in err and len(err.strip().splitlines()) == 1
