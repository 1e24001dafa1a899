"""The memory formula (train/memory.py), bf16 weights with fp32 optimizer state, activation checkpointing."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
import torch

from clawgym.artifacts import RolloutRecord, TreeNode, write_table
from clawgym.train import memory as M
from clawgym.train.config import TrainConfig
from clawgym.train.loop import train


def test_parameter_counts_match_the_published_qwen3_sizes():
    # Qwen3's model cards: 0.6B (0.44B non-embedding), 4.0B, 8.2B, 32.8B.
    assert [round(M.param_count(s) / 1e9, 1) for s in M.QWEN3.values()] == [0.6, 4.0, 8.2, 32.8]
    s = M.QWEN3["0.6B"]
    assert round((M.param_count(s) - s.vocab * s.hidden) / 1e9, 2) == 0.44


def test_the_formula_by_hand_on_a_small_shape():
    s = M.Shape(hidden=8, layers=2, ffn=16, heads=2, kv_heads=1, head_dim=4, vocab=100, tied=True)
    # per layer: q 8·8 + k,v 2·8·4 + o 8·8 + 3·8·16 MLP + norms 2·8 + q/k norms 2·4 = 64+64+64+384+16+8
    assert M.layer_params(s) == 600
    assert M.param_count(s) == 2 * 600 + 100 * 8 + 8
    P = 2008
    e = M.estimate(s, precision="bf16", activation_checkpointing=False)
    assert (e.weights, e.grads, e.optimizer) == (2 * P, 2 * P, 12 * P)  # bf16 weights/grads, fp32 master + 2 moments
    e32 = M.estimate(s, precision="fp32")
    assert (e32.weights, e32.grads, e32.optimizer) == (4 * P, 4 * P, 8 * P)
    full_layer = 2 * (4 * 8 + 2 * 8 + 2 * 4 + 4 * 16)
    assert e.act_per_token == 2 * full_layer
    assert M.estimate(s).act_per_token == 2 * 8 * 2 + full_layer  # checkpointing: layer inputs + one layer
    # The chunked head: one 256-row chunk (16 B × vocab per row) and a weight-sized gradient per
    # micro-batch; per trainable token only the 4 B × hidden row it is recomputed from (+ 2 results).
    assert (e.head_per_trainable_token, e.head_fixed) == (4 * 8 + 8, 16 * 100 * 256 + 100 * 8 * 2)
    whole = M.estimate(s, head_chunk=0)  # unchunked: logits bf16 + fp32, log-softmax, exp per token
    assert (whole.head_per_trainable_token, whole.head_fixed) == (14 * 100, 0)
    assert M.estimate(s, lora_rank=2).head_fixed == 16 * 100 * 256  # LoRA: the head takes no gradient
    sharded = M.estimate(s, fsdp=4)
    assert sharded.optimizer == 12 * P / 4 and sharded.weights == 2 * P / 4 + 2 * 600 * 2
    lora = M.estimate(s, lora_rank=2)
    assert lora.trainable == 2 * 2 * ((8 + 8) + 2 * (8 + 4) + (8 + 8) + 2 * (8 + 16) + (16 + 8))
    assert lora.optimizer == 12 * lora.trainable and lora.weights == 2 * (P + lora.trainable)
    # What fits: the static part alone over the GPU is "0 tokens".
    assert M.estimate(M.QWEN3["8B"], precision="bf16").max_tokens(80e9) == 0
    assert M.estimate(M.QWEN3["8B"], fsdp=8).max_tokens(80e9) > 32_000


def _step(d: Path) -> Path:
    prompt, nodes, rows = list(range(40, 60)), [], []
    for i, (ans, r) in enumerate([([101, 102, 103], 1.0), ([201, 202, 203], 0.0)]):
        nodes += [TreeNode(f"r{i}", 0, -1, prompt, "env", [], "c0", 0, "main", True, 0),
                  TreeNode(f"r{i}", 1, 0, ans, "model", [-9.0] * 3, "c0", 0, "main", True, len(prompt))]
        rows.append(RolloutRecord(f"r{i}", "t1", "agentloop", "t1+agentloop", 0, "ok", r, 1, 1.0, 0))
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    return d


def test_the_start_line_divides_weights_grads_and_optimizer_by_the_fsdp_ranks():
    s = M.QWEN3["8B"]
    cfg = TrainConfig(trees=Path("t"), rollouts=Path("r"), model=Path("m"), out=Path("o"), precision="bf16", head_chunk=256)
    whole, sharded = M.estimate_line(s, cfg, 8), M.estimate_line(s, TrainConfig(**{**cfg.__dict__, "fsdp": True}), 8)
    assert "8 process(es), unsharded" in whole and "8 process(es), FSDP over 8" in sharded
    e1 = M.estimate(s, precision="bf16", activation_checkpointing=False)
    e8 = M.estimate(s, precision="bf16", fsdp=8, activation_checkpointing=False)
    assert f"optimizer {e1.optimizer / M.GIB:.2f} GiB" in whole and f"optimizer {e8.optimizer / M.GIB:.2f} GiB" in sharded
    assert e8.optimizer * 8 == pytest.approx(e1.optimizer)
    assert "LM head 1.74 GiB per micro-batch (256-token chunks)" in whole  # 16·151,936·256 + 151,936·4096·2 B
    assert "LM head" not in M.estimate_line(s, TrainConfig(**{**cfg.__dict__, "head_chunk": 0}), 8)


@pytest.mark.slow
def test_bf16_keeps_bf16_weights_and_fp32_optimizer_state_and_checkpointing_changes_nothing(tiny_model, tmp_path, capfd):
    from safetensors.torch import load_file

    step = _step(tmp_path / "step")

    def run(out: str, **kw) -> dict:
        train(TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model,
                          out=tmp_path / out, metrics=tmp_path / f"{out}.jsonl", lr=1e-3, **kw))
        return load_file(tmp_path / out / "model.safetensors")

    plain, ckpointed = run("plain", activation_checkpointing=False), run("ckpt")  # checkpointing is the default
    for k in plain:
        torch.testing.assert_close(plain[k], ckpointed[k], atol=1e-6, rtol=0)
    assert "memory per process (fp32" in capfd.readouterr().err
    half = run("bf16", precision="bf16")
    start = load_file(tiny_model / "model.safetensors")
    assert all(v.dtype == torch.bfloat16 for v in half.values())
    opt = torch.load(tmp_path / "bf16" / "optimizer.pt", weights_only=True)
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt["state"].values())
    # The bf16 run moves the weights as the fp32 run does, to bf16's resolution.
    k = "model.layers.0.mlp.down_proj.weight"
    d32, d16 = (plain[k] - start[k]).flatten(), (half[k].float() - start[k]).flatten()
    assert torch.nn.functional.cosine_similarity(d32, d16, dim=0) > 0.9


def test_activation_checkpointing_recomputes_each_layer_in_the_backward(tiny_model):
    from transformers import AutoModelForCausalLM

    from clawgym.train.packing import PackedPolicy, collate, pack_tree
    from clawgym.train.precision import enable_activation_checkpointing

    tree = pack_tree([TreeNode("r", 0, -1, list(range(40, 60)), "env", [], "c0", 0, "main", True, 0),
                      TreeNode("r", 1, 0, [101, 102], "model", [-9.0] * 2, "c0", 0, "main", True, 20)])
    grads, saved = [], []
    for ckpt in (False, True):
        lm = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa", dtype=torch.float32)
        if ckpt:
            assert enable_activation_checkpointing(lm) == lm.config.num_hidden_layers
        n = [0]

        def count(t: torch.Tensor) -> torch.Tensor:
            n[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            logp, _ = PackedPolicy(lm)(collate([tree], [0]))
        logp.sum().backward()
        saved.append(n[0])
        grads.append(lm.model.layers[0].mlp.down_proj.weight.grad.clone())
        assert not lm.model.layers[0].self_attn.training  # dropout stays off
    assert saved[1] < saved[0] / 2  # the layers' insides are not kept for the backward: they are recomputed
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=0)


def _long_step(d: Path, rollouts: int = 8) -> Path:
    """Two GRPO groups of rollouts of ~300 tokens (a shared 80-token prompt, then their own turns)."""
    import random

    rng, nodes, rows = random.Random(0), [], []
    prompt = [rng.randrange(4, 200) for _ in range(80)]
    for i in range(rollouts):
        turn = [rng.randrange(4, 200) for _ in range(200)]
        ans = [rng.randrange(4, 200) for _ in range(20)]
        nodes += [TreeNode(f"r{i}", 0, -1, prompt + turn, "env", [], "c0", 0, "main", True, 0),
                  TreeNode(f"r{i}", 1, 0, ans, "model", [-5.0] * 20, "c0", 0, "main", True, 280)]
        g = f"t{i % 2}"
        rows.append(RolloutRecord(f"r{i}", g, "agentloop", f"{g}+agentloop", i // 2, "ok", float(i % 4 < 2), 1, 1.0, 0))
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    return d


def _expected_peaks(step: Path, tiny_model: Path, budgets: list[int]) -> dict[int, float]:
    """memory_guard's expected peak of the step's whole-batch plan at each budget, with nothing held."""
    from transformers import AutoConfig

    from clawgym.train import memory_guard
    from clawgym.train.batch import choose, pack
    from clawgym.train.distributed import Dist
    from clawgym.train.microbatches import RankMicroBatches

    cfg = TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model, out=step / "o")
    batch = pack(cfg, choose(cfg))
    shape = M.shape_of(AutoConfig.from_pretrained(tiny_model))
    accelerator = type("CPU", (), {"device": torch.device("cpu")})()
    out = {}
    for b in budgets:
        micro = RankMicroBatches(batch.trees, Dist(0, 1), accelerator, token_budget=b, share_prefixes=True,
                                 attention="segments", sharded=False, step_prefix=True)
        plan = micro.plan(range(len(batch.trees)))
        out[b] = memory_guard.need(cfg, shape, 1, torch.device("cpu"), batch.trees, plan, 0.0, False, False).total
    return out


@pytest.mark.slow
def test_a_plan_that_does_not_fit_is_planned_with_smaller_micro_batches_and_trains_as_that_budget(
        tiny_model, tmp_path, capfd, monkeypatch):
    from safetensors.torch import load_file

    from clawgym.train import memory_guard

    step = _long_step(tmp_path / "step")
    peaks = _expected_peaks(step, tiny_model, [8192, 1024, 512])
    assert peaks[8192] > peaks[1024] > peaks[512]  # the micro-batch term follows the budget
    monkeypatch.setattr(memory_guard, "held_now", lambda device: 0.0)  # the test process's own size is not the step's
    limit = (peaks[8192] + peaks[1024]) / 2 / memory_guard.HEADROOM  # between 8,192 and 1,024 tokens: 4,096 or less fits

    def run(out: str, **kw) -> dict:
        train(TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model,
                          out=tmp_path / out, metrics=tmp_path / f"{out}.jsonl", lr=1e-3, **kw))
        return load_file(tmp_path / out / "model.safetensors")

    guarded = run("guarded", memory_limit_gib=limit / M.GIB)
    err = capfd.readouterr().err
    planned = re.search(r"planned with ([\d,]+)-token micro-batches instead of 8,192", err)
    assert planned, err
    budget = int(planned[1].replace(",", ""))
    assert 512 <= budget <= 4096
    line = orjson.loads((tmp_path / "guarded.jsonl").read_text().splitlines()[-1])
    assert line["train/token_budget"] == budget and line["train/peak_gib"] > 0
    direct = run("direct", token_budget=budget)  # the same plan asked for by hand: the same weights
    for k in direct:
        torch.testing.assert_close(guarded[k], direct[k], atol=0, rtol=0)


def test_a_plan_that_never_fits_stops_in_one_line_before_anything_is_written(tiny_model, tmp_path):
    import subprocess
    import sys

    step = _long_step(tmp_path / "step")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "clawgym.cli", "train", str(step), "--model", str(tiny_model), "--out",
                          str(out), "--memory-limit-gib", "0.01"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "memory:" in errors[0] and "0.0 GiB this process can have (--memory-limit-gib)" in errors[0]
    assert "no smaller budget fits" in errors[0] and "Traceback" not in res.stderr
    assert not out.exists() and not (step / "train.jsonl").exists()
