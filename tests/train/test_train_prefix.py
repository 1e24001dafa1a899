"""A step's shared prefix is forwarded once per minibatch and is exact: the trainer's micro-batches after it
score every rollout and accumulate gradients as per-rollout trees do; fallbacks plan as trie.py does."""

from __future__ import annotations

import contextlib
import random
from dataclasses import replace

import pytest
import torch

from clawgym.train import prefix, trie
from clawgym.train.distributed import Dist, padded_plan, shard
from clawgym.train.microbatches import RankMicroBatches
from clawgym.train.packing import PackedPolicy, collate, pack_tree
from test_train_archs import make_config, make_lm
from test_train_packing import VOCAB, harness_step, random_tree


class CPU:
    """The part of accelerate's Accelerator that RankMicroBatches uses, for one CPU process."""

    device = torch.device("cpu")

    def autocast(self):
        return contextlib.nullcontext()

    def unwrap_model(self, model):
        return model

    def backward(self, loss):
        loss.backward()

    def no_sync(self, model):
        return contextlib.nullcontext()



def micro_batches(trees, budget: int, attention: str = "segments", world: int = 1, step_prefix: bool = True):
    return RankMicroBatches(trees, Dist(0, world), CPU(), token_budget=budget, share_prefixes=True, attention=attention,
                            sharded=False, step_prefix=step_prefix)


def layout(plan) -> list:
    """A plan as comparable values: each step's rows and, per collated part, its trees, tokens and prefix."""
    return [None if p is None else (p[0], [(t.rollout_id, t.n_tokens, t.prefix) for t in p[1]]) for p in plan]


def _model(name: str, tiny_model, checkpointing: bool):
    """A model by name (tiny: the init-model policy; "tiny+lora": with rank-4 adapters on q/v, B randomized so
    every adapter weight has a gradient); with activation checkpointing if asked."""
    from transformers import AutoModelForCausalLM

    from clawgym.train.attention import implementation
    from clawgym.train.precision import enable_activation_checkpointing

    lm = make_lm(name) if not name.startswith("tiny") else AutoModelForCausalLM.from_pretrained(
        tiny_model, attn_implementation=implementation("segments"), dtype=torch.float32).eval()
    if checkpointing:
        enable_activation_checkpointing(lm)
    if name == "tiny+lora":
        from clawgym.train import lora

        lora.add_adapter(lm, 4, 8.0, "q_proj,v_proj")
        with torch.no_grad():
            for k, p in lm.named_parameters():
                if "lora_B" in k:
                    p.copy_(0.1 * torch.randn_like(p))
    return lm


@pytest.mark.slow
@pytest.mark.parametrize("name,attention,checkpointing", [("tiny", "segments", False), ("tiny", "dense", False),
                                                          ("tiny", "segments", True), ("llama", "segments", False),
                                                          ("qwen3", "dense", True), ("tiny+lora", "segments", True)])
def test_a_step_prefix_over_several_micro_batches_scores_and_accumulates_as_per_rollout(name, attention, checkpointing,
                                                                                       tiny_model):
    """GQA models (tiny: 2 heads / 1 KV head; llama, qwen3: 4 / 2), with and without activation checkpointing, LoRA:
    the prefix is forwarded once, the step's ≥ 3 micro-batches attend to its keys/values, and logprobs
    (update and no-grad scoring) and the parameter gradients of the whole minibatch equal per-rollout trees'."""
    lm = _model(name, tiny_model, checkpointing)
    policy = PackedPolicy(lm, head_chunk=5)
    trees = harness_step(0)
    w = [torch.randn(t.n_trainable, generator=torch.Generator().manual_seed(i)) for i, t in enumerate(trees)]
    lm.zero_grad()
    alone = [policy(collate([t], [0], attention=attention))[0] for t in trees]
    sum((wi * a).sum() for wi, a in zip(w, alone)).backward()
    want = {k: p.grad.clone() for k, p in lm.named_parameters() if p.requires_grad}
    lm.zero_grad()

    micro = micro_batches(trees, budget=max(t.n_tokens for t in trees) - 90, attention=attention)
    plan = micro.plan(range(len(trees)))
    assert len(plan) >= 3 and all(parts[0].prefix == 100 for _, parts in plan)
    got, forwarded = {}, 0
    for step in micro.steps(plan, policy):
        logp, _ = policy(step.batch)
        micro.backward(step, (torch.cat([w[i] for i in step.rows]) * logp).sum())
        got.update(zip(step.rows, logp.detach().split([trees[i].n_trainable for i in step.rows])))
        forwarded += step.forwarded
    today = sum(mb.n_tokens for _, mb in trie.microbatches(trees, range(len(trees)), micro.token_budget, attention))
    assert forwarded == 100 + sum(sum(p.n_tokens for p in parts) for _, parts in plan) < today
    scored = micro.score(policy, plan)
    for i, a in enumerate(alone):
        torch.testing.assert_close(got[i], a.detach(), atol=1e-5, rtol=0)
        torch.testing.assert_close(scored[i], a.detach(), atol=1e-5, rtol=0)
    assert want and all(want[k].abs().max() > 0 for k in want)
    for k, p in lm.named_parameters():
        if p.requires_grad:
            assert (p.grad - want[k]).abs().max() <= 1e-5 * want[k].abs().max().clamp_min(1e-12), k


def test_flex_after_a_prefix_sees_the_prefix_then_its_tree_and_scores_as_segments():
    """FlexAttention's rule with a prefix is the dense mask with a prefix; its logprobs (forward: CPU has no
    flex backward) equal the segment path's."""
    trees = harness_step(1)
    micro = micro_batches(trees, budget=max(t.n_tokens for t in trees) - 90)
    rows, parts = micro.plan(range(len(trees)))[0]
    flex = collate(parts, range(len(parts)), attention="flex").attention_mask.flex
    dense = collate(parts, range(len(parts)), attention="dense").attention_mask.dense[:, 0]
    L = flex.node.shape[1]
    for r, t in enumerate(parts):
        n = t.n_tokens
        rule = flex.allowed(r, torch.arange(L)[:, None], torch.arange(100 + L)[None, :])
        assert torch.equal(rule[:n, : 100 + n], dense[r, :n, : 100 + n]) and not rule[:n, 100 + n:].any()
        dense[r, n:] = rule[n:]  # padding queries: what they see is never read
    # The block mask over [L queries, 100 + L keys]: partial blocks hold some allowed pair, full blocks only
    # allowed pairs, and every allowed pair lies in a listed block.
    from clawgym.train.attention_flex import FLEX_BLOCK

    bm = flex.block_mask()
    nq, nk = -(-L // FLEX_BLOCK), -(-(100 + L) // FLEX_BLOCK)
    padded = torch.nn.functional.pad(dense, (0, nk * FLEX_BLOCK - 100 - L, 0, nq * FLEX_BLOCK - L))
    blocks = padded.view(len(parts), nq, FLEX_BLOCK, nk, FLEX_BLOCK)
    some, every = blocks.any(4).any(2), blocks.all(4).all(2)
    for r in range(len(parts)):
        for qb in range(nq):
            part = set(bm.kv_indices[r, 0, qb, : bm.kv_num_blocks[r, 0, qb]].tolist())
            full = set(bm.full_kv_indices[r, 0, qb, : bm.full_kv_num_blocks[r, 0, qb]].tolist())
            assert all(bool(every[r, qb, k]) for k in full) and not any(bool(every[r, qb, k]) for k in part)
            assert part | full == set(torch.nonzero(some[r, qb]).flatten().tolist())
    policy = PackedPolicy(make_lm("qwen3"))
    with torch.no_grad():
        seg = micro.score(policy, micro.plan(range(len(trees))))
        micro.attention = "flex"
        fl = micro.score(policy, micro.plan(range(len(trees))))
    for a, b in zip(seg, fl):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_the_prefix_ends_before_a_branch_and_before_the_first_scored_token():
    trees = harness_step(2)
    group, p = prefix.choose(trees, range(len(trees)))
    assert sorted(group) == list(range(6)) and p == 100  # the system prompt; the task prompts differ
    t = trees[0]
    assert prefix.chain_length(t) == int(t.pred_pos.min())  # no branch in the prompts: the first predicting position
    cut = prefix.strip(t, p)
    assert torch.equal(cut.position_ids, t.position_ids[p:]) and int(cut.position_ids[0]) == p
    assert torch.equal(cut.input_ids[cut.label_pos], cut.target_ids) and torch.equal(cut.target_ids, t.target_ids)
    assert cut.prev_pos[0] == -1 and cut.prefix == p
    # A model token right after 80 prompt tokens: the prefix stops at 79, where that token is predicted from.
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(80)]
    nodes = [replace(random_tree(rng, 1, "a")[0], token_ids=prompt)]
    nodes.append(replace(nodes[0], node_id=1, parent_id=0, token_ids=[5, 6], kind="model", logprobs=[-1.0, -1.0], depth=80))
    assert prefix.chain_length(pack_tree(nodes)) == 79


def test_no_step_prefix_where_it_saves_nothing_plans_as_today():
    """Under 64 shared tokens, or trees that fit one micro-batch: trie.py's plan, unchanged."""
    short = harness_step(3, system=40)
    assert prefix.choose(short, range(6)) == ([], 0)
    assert layout(prefix.plan(short, range(6), 60)) == layout(trie.plan(short, range(6), 60))
    trees = harness_step(3)
    big = 10 * sum(t.n_tokens for t in trees)
    assert layout(prefix.plan(trees, range(6), big)) == layout(trie.plan(trees, range(6), big))


@pytest.mark.parametrize("world,config,fsdp", [(2, "qwen3", True), (1, "mistral", False), (1, "gemma2", False)])
def test_fallbacks_say_why_once_and_plan_as_today(world, config, fsdp):
    """FSDP on several processes, or a sliding-window model: the prefix is forwarded once per micro-batch, as trie.py plans it."""
    why = prefix.unavailable(world, make_config(config), fsdp)
    assert why is not None and "once per micro-batch" in why
    assert prefix.unavailable(world, make_config("qwen3"), False) is None  # DDP or one process: once per step
    trees = harness_step(4)
    budget = max(t.n_tokens for t in trees) - 90
    micro = micro_batches(trees, budget, world=world, step_prefix=why is None)
    owner = shard([t.n_tokens for t in trees], world)
    assert layout(micro.plan(range(6))) == layout(padded_plan(list(range(6)), owner, 0, world,
                                                              lambda mine: trie.plan(trees, mine, budget)))
    assert all(p is None or p[1][0].prefix == 0 for p in micro.plan(range(6)))
    assert prefix.unavailable(1, make_config("qwen3")) is None


def test_ddp_ranks_plan_the_minibatchs_prefix_alike_and_each_its_own_trees():
    """Every rank plans the prefix chosen over the whole minibatch (one rank forwards it for all), its own trees
    without it; FSDP ranks, which reduce-scatter each micro-batch, never plan one."""
    trees = harness_step(5)
    budget = max(t.n_tokens for t in trees) - 90
    group, p = prefix.choose(trees, range(6))
    ranks = [micro_batches(trees, budget, world=2) for _ in range(2)]
    for r, m in enumerate(ranks):
        m.dist = Dist(r, 2)
    plans = [m.plan(range(6)) for m in ranks]
    assert len(plans[0]) == len(plans[1]) and p > 0
    assert all(torch.equal(plan.prefix, trees[group[0]].input_ids[:p]) for plan in plans)
    scored = sorted(i for r, plan in enumerate(plans) for step in plan if step is not None for i in step[0])
    assert scored == list(range(6))  # every tree once, on its own rank, without the prefix
    assert all(parts[0].prefix == p for plan in plans for step in plan if step is not None for parts in [step[1]])
    sharded = RankMicroBatches(trees, Dist(0, 2), CPU(), token_budget=budget, share_prefixes=True, attention="segments",
                               sharded=True, step_prefix=True)
    plan = sharded.plan(range(6))
    assert plan.prefix is None and all(step is None or step[1][0].prefix == 0 for step in plan)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3_moe", "gemma", "phi3", "olmo2", "granite", "smollm3"])
def test_every_full_attention_architecture_scores_after_a_step_prefix_as_per_rollout(name):
    """No-grad scoring (logp_old) through the step prefix equals each tree alone, architecture by architecture."""
    assert prefix.unavailable(1, make_config(name)) is None
    policy = PackedPolicy(make_lm(name))
    trees = harness_step(6)
    micro = micro_batches(trees, budget=max(t.n_tokens for t in trees) - 90)
    plan = micro.plan(range(len(trees)))
    assert len(plan) >= 2 and all(parts[0].prefix for _, parts in plan)
    with torch.no_grad():
        scored = micro.score(policy, plan)
        for t, got in zip(trees, scored):
            torch.testing.assert_close(got, policy(collate([t], [0]))[0], atol=1e-5, rtol=0)


def _step_dir(tmp_path):
    """Six rollouts of two tasks under one 80-token system prompt, rewards varying within each task."""
    from clawgym.artifacts import RolloutRecord, TreeNode, write_table

    system, nodes, rows = list(range(400, 480)), [], []
    for i in range(6):
        task = [500 + i // 3, 501]
        answer = list(range(100 + 7 * i, 110 + 7 * i))
        a = len(system) + len(task)
        nodes += [TreeNode(f"r{i}", 0, -1, system + task, "env", [], "c0", 0, "main", True, 0),
                  TreeNode(f"r{i}", 1, 0, answer, "model", [-9.0] * len(answer), "c0", 0, "main", True, a),
                  TreeNode(f"r{i}", 2, 1, [300, 301, 302], "env", [], "c1", 0, "main", True, a + len(answer)),
                  TreeNode(f"r{i}", 3, 2, answer[:4], "model", [-8.0] * 4, "c1", 0, "main", True, a + len(answer) + 3)]
        rows.append(RolloutRecord(f"r{i}", f"t{i // 3}", "agentloop", f"t{i // 3}+agentloop", 0, "ok", float(i % 3 == 0), 2, 1.0, 0))
    d = tmp_path / "step"
    write_table(d / "trees.parquet", nodes, TreeNode)
    write_table(d / "rollouts.parquet", rows, RolloutRecord)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_training_with_a_step_prefix_equals_training_without_shared_prefixes(tiny_model, tmp_path, algo):
    """`train` over micro-batches of 100 tokens: the system prompt forwarded once per step (policy and PPO's
    value model) gives the weights of per-rollout trees, with fewer tokens forwarded."""
    from safetensors.torch import load_file

    from clawgym.artifacts import read_jsonl
    from clawgym.train.loop import TrainConfig, train

    from clawgym.train.setup import autocast_bf16

    step = _step_dir(tmp_path)
    got, forwarded = {}, {}
    for share in (True, False):
        out = tmp_path / f"{algo}-{share}"
        cfg = TrainConfig(trees=step / "trees.parquet", rollouts=step / "rollouts.parquet", model=tiny_model, out=out,
                          algo=algo, lr=1e-3, token_budget=100, share_prefixes=share, value_warmup_steps=1,
                          metrics=tmp_path / f"{share}.jsonl")
        train(cfg)
        got[share] = {**load_file(out / "model.safetensors"),
                      **({f"value.{k}": v for k, v in load_file(out / "value" / "model.safetensors").items()} if algo == "ppo" else {})}
        forwarded[share] = read_jsonl(tmp_path / f"{share}.jsonl").records[-1]["train/tokens_forwarded"]
    # Adam moves a weight by about lr whatever its gradient's size (g / (|g| + eps)), so a wrong gradient moves
    # whole rows and columns by ~1e-3. fp32 summation order changes a gradient within a few eps of zero enough to
    # move that one weight by ~1e-4, on some machines: so the test counts weights off by more than a tenth of lr,
    # and allows one in a thousand of each tensor. (The gradients themselves are compared to 1e-5 above.)
    # Under bf16 autocast (CUDA) a gradient carries bf16's rounding, 2^-8 of its size, so every weight whose
    # gradient is that close to zero can step either way (docs/training.md, "Precision and activation
    # checkpointing"), and a small tensor can have a few: on an H200, 0.23% of the policy's weights were off, 2 of
    # a 128-weight norm's. There the count is per model (policy, value), one in a hundred allowed; the same run
    # with the prefix's gradient halved had 2.4% off, with it dropped 7.1%.
    off = {k: int(((got[True][k] - w).abs() > 1e-4).sum()) for k, w in got[False].items()}
    if autocast_bf16(cfg):
        for model in ("policy", "value"):
            keys = [k for k in off if k.startswith("value.") == (model == "value")]
            n, total = sum(off[k] for k in keys), sum(got[False][k].numel() for k in keys)
            assert n <= total // 100, f"{model}: {n} of {total} weights differ by more than 1e-4, most in {max(keys, key=off.get)}"
    for k, w in got[False].items():
        assert autocast_bf16(cfg) or off[k] <= w.numel() // 1000, f"{k}: {off[k]} of {w.numel()} weights differ by more than 1e-4"
    assert forwarded[True] < forwarded[False] - 4 * 80  # the 80-token prompt once instead of once per rollout
