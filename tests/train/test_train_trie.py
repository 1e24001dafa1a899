"""Group tries are exact: the trees of a group packed into one trie score every rollout's tokens as alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from clawgym.train.packing import PackedPolicy, collate, pack_tree
from clawgym.train.trie import merge_trees, microbatches, plan_tries
from test_train_loop import step  # noqa: F401 - a fixture used below
from test_train_packing import VOCAB, harness_step, lm, random_tree  # noqa: F401 - `lm` is a fixture used below


def group(seed: int, rollouts: int = 4, prefix: int = 30):
    """Rollouts whose root nodes start with one shared prompt and then diverge, mid-node, into random trees."""
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(prefix)]
    out = []
    for r in range(rollouts):
        nodes = random_tree(rng, rng.randint(1, 7), f"r{r}", p_model=0.6)
        root = nodes[0]
        nodes = [replace(root, token_ids=prompt + root.token_ids)] + [replace(n, depth=n.depth + prefix) for n in nodes[1:]]
        out.append(pack_tree(nodes, only_trainable=False))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_group_trie_logprobs_and_gradients_equal_per_rollout(lm, seed):  # noqa: F811
    trees = group(seed)
    trie = merge_trees(trees)
    assert trie.n_tokens <= sum(t.n_tokens for t in trees) - 3 * 30  # the prompt is forwarded once
    assert torch.equal(trie.target_ids, torch.cat([t.target_ids for t in trees]))
    assert torch.equal(trie.input_ids[trie.label_pos], trie.target_ids)
    policy = PackedPolicy(lm)
    w = torch.randn(trie.target_ids.numel(), generator=torch.Generator().manual_seed(seed))  # a per-token signal
    for attention in ("segments", "dense"):
        lm.zero_grad()
        alone = torch.cat([policy(collate([t], [0], attention=attention))[0] for t in trees])
        (w * alone).sum().backward()
        want = {k: p.grad.clone() for k, p in lm.named_parameters()}
        lm.zero_grad()
        packed, _ = policy(collate([trie], [0], attention=attention))
        (w * packed).sum().backward()
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
        for k, p in lm.named_parameters():
            assert (p.grad - want[k]).abs().max() <= 1e-5 * want[k].abs().max().clamp_min(1e-12), k


def test_tries_group_shared_prefixes_within_the_budget_and_keep_label_order():
    a, b = group(7, rollouts=3, prefix=40), group(8, rollouts=3, prefix=40)
    trees = [a[0], b[0], a[1], b[1], a[2], b[2]]
    size_a, size_b = merge_trees(a).n_tokens, merge_trees(b).n_tokens
    (one,) = plan_tries(trees, range(6), 10_000)
    assert sorted(one) == list(range(6))
    assert merge_trees(trees).n_tokens == size_a + size_b  # each group's prompt once
    # A budget that holds one group's trie but not both: trees sharing a prefix are side by side, so each group is one trie.
    assert sorted(sorted(g) for g in plan_tries(trees, range(6), max(size_a, size_b))) == [[0, 2, 4], [1, 3, 5]]
    assert plan_tries(trees, range(6), 1) == [[i] for i in sorted(range(6), key=lambda i: trees[i].input_ids.tolist())]
    for budget in (150, 10_000):
        seen, forwarded = [], 0
        for rows, mb in microbatches(trees, range(6), budget, "segments"):
            assert torch.equal(mb.target_ids, torch.cat([trees[i].target_ids for i in rows]))
            seen += rows
            forwarded += mb.n_tokens
        assert sorted(seen) == list(range(6))
        assert forwarded < sum(t.n_tokens for t in trees)
    plain = [rows for rows, _ in microbatches(trees, range(6), 10_000, "segments", share_prefixes=False)]
    assert sorted(i for rows in plain for i in rows) == list(range(6))


def test_a_trie_of_one_chain_is_that_chain():
    t = group(3, rollouts=1)[0]
    m = merge_trees([t, t])  # the same rollout twice: nothing new, labels twice
    assert torch.equal(m.input_ids, t.input_ids) and m.target_ids.numel() == 2 * t.target_ids.numel()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_training_with_group_tries_equals_training_without(step, tiny_model, tmp_path, algo):  # noqa: F811
    """The step's rollouts share their prompt: one update with and without tries gives the same weights."""
    from safetensors.torch import load_file

    from clawgym.train.loop import train
    from test_train_loop import cfg

    got = {}
    for share in (True, False):
        out = tmp_path / f"{algo}-{share}"
        train(cfg(step, tiny_model, out, algo=algo, lr=1e-3, share_prefixes=share, metrics=tmp_path / f"{share}.jsonl"))
        got[share] = load_file(out / "model.safetensors")
    for k, w in got[False].items():
        torch.testing.assert_close(got[True][k], w, atol=1e-5, rtol=0)
    from clawgym.artifacts import read_jsonl

    fwd = {s: read_jsonl(tmp_path / f"{s}.jsonl").records[-1]["train/tokens_forwarded"] for s in (True, False)}
    assert fwd[True] < fwd[False]  # the shared prompt was forwarded once



@pytest.mark.parametrize("seed", range(2))
def test_a_step_over_several_micro_batches_scores_and_accumulates_as_per_rollout(lm, seed):  # noqa: F811
    """The trainer's micro-batches of a whole step (a shared system prompt, tries split by the budget):
    every rollout's logprobs and the gradient summed over the micro-batches equal per-rollout trees."""
    trees = harness_step(seed, system=40, only_trainable=False)
    unique = merge_trees(trees).n_tokens
    budget = max(t.n_tokens for t in trees) + 10  # tries of one or two rollouts: the step needs several
    policy = PackedPolicy(lm, head_chunk=5)  # chunked head, as trained
    w = [torch.randn(t.target_ids.numel(), generator=torch.Generator().manual_seed(i)) for i, t in enumerate(trees)]
    lm.zero_grad()
    alone = [policy(collate([t], [0]))[0] for t in trees]
    sum((wi * a).sum() for wi, a in zip(w, alone)).backward()
    want = {k: p.grad.clone() for k, p in lm.named_parameters()}
    lm.zero_grad()
    got, forwarded, n_mb = {}, 0, 0
    for rows, mb in microbatches(trees, range(len(trees)), budget, "segments"):
        logp, _ = policy(mb)
        (torch.cat([w[i] for i in rows]) * logp).sum().backward()  # accumulated over micro-batches
        for i, part in zip(rows, logp.detach().split([trees[i].target_ids.numel() for i in rows])):
            got[i] = part
        forwarded, n_mb = forwarded + mb.n_tokens, n_mb + 1
    assert n_mb >= 3 and sorted(got) == list(range(len(trees)))
    assert unique < forwarded < sum(t.n_tokens for t in trees)
    for i, a in enumerate(alone):
        torch.testing.assert_close(got[i], a.detach(), atol=1e-5, rtol=0)
    for k, p in lm.named_parameters():
        assert (p.grad - want[k]).abs().max() <= 1e-5 * want[k].abs().max().clamp_min(1e-12), k


def test_a_shared_prompt_is_forwarded_once_per_micro_batch_and_no_more():
    """Rollouts of 40 shared + 20 own tokens, a budget of two per trie: 3 micro-batches for 6 rollouts,
    each forwarding the prompt once: unique + 2 × 40 tokens, the fewest any plan within the budget forwards."""
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(40)]
    trees = []
    for r in range(6):
        own = [rng.randrange(VOCAB) for _ in range(20)]
        trees.append(pack_tree([replace(random_tree(rng, 1, f"r{r}")[0], token_ids=prompt + own)], only_trainable=False))
    unique = merge_trees(trees).n_tokens
    assert unique == 40 + 6 * 20
    mbs = list(microbatches(trees, range(6), 80, "segments"))
    assert len(mbs) == 3 and sum(mb.n_tokens for _, mb in mbs) == unique + 2 * 40
