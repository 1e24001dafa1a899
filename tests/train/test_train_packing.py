"""Tree packing is exact: packed logprobs and gradients equal those of each root-to-leaf path alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym.artifacts import TreeNode
from clawgym.errors import UserError
from clawgym.train.packing import PackedPolicy, PackedTree, collate, pack_tree, plan_microbatches, root_paths

VOCAB = 512


def random_tree(rng: random.Random, n_nodes: int, rollout_id: str = "r0", *, max_len: int = 6,
                p_model: float = 0.5, p_dropped: float = 0.0, roots: int = 1, vocab: int = VOCAB) -> list[TreeNode]:
    """A random prefix tree: node i hangs under a random earlier node (the first `roots` are roots)."""
    nodes: list[TreeNode] = []
    end: dict[int, int] = {}
    for i in range(n_nodes):
        parent = -1 if i < roots else rng.randrange(i)
        kind = "model" if parent >= 0 and rng.random() < p_model else "env"  # a prompt starts every root
        toks = [rng.randrange(vocab) for _ in range(rng.randint(1, max_len))]
        depth = 0 if parent < 0 else end[parent]
        end[i] = depth + len(toks)
        dropped = rng.random() < p_dropped
        role = rng.choice(["subagent", "compaction", "aux"]) if dropped and rng.random() < 0.5 else "main"
        nodes.append(TreeNode(
            rollout_id=rollout_id, node_id=i, parent_id=parent, token_ids=toks, kind=kind,
            logprobs=[-rng.random() for _ in toks] if kind == "model" else [], call_id=f"c{i}", segment=0,
            role=role, kept=not (dropped and role == "main"), depth=depth,
            drop_reason="dead_leaf" if dropped and role == "main" else ("" if role == "main" else role),
        ))
    return nodes


def harness_step(seed: int, tasks: int = 2, k: int = 3, system: int = 100, task: int = 12, *,
                 only_trainable: bool = True) -> list[PackedTree]:
    """N tasks × K rollouts, packed: one system prompt for all, one task prompt per task, then each rollout's random tree."""
    rng = random.Random(seed)
    sys_toks = [rng.randrange(VOCAB) for _ in range(system)]
    out = []
    for t in range(tasks):
        prompt = sys_toks + [rng.randrange(VOCAB) for _ in range(task)]
        for r in range(k):
            nodes = random_tree(rng, rng.randint(2, 6), f"t{t}r{r}", p_model=0.6)
            root = nodes[0]
            nodes = [replace(root, token_ids=prompt + root.token_ids)] + [replace(n, depth=n.depth + len(prompt)) for n in nodes[1:]]
            out.append(pack_tree(nodes, only_trainable=only_trainable))
    return out


@pytest.fixture(scope="module")
def lm():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=64, intermediate_size=256)
    cfg._attn_implementation = "sdpa"
    return transformers.Qwen3ForCausalLM(cfg).eval()


def per_path_logprobs(lm, tree) -> torch.Tensor:
    """[N] logprob of every packed token computed on its root path alone (NaN for a root's first token)."""
    ref = torch.full((tree.n_tokens,), float("nan"))
    for path in root_paths(tree):
        ids = tree.input_ids[path][None]
        logp = lm(input_ids=ids).logits[0].float().log_softmax(-1)
        ref[path[1:]] = logp[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
    return ref


def scored_positions(tree) -> torch.Tensor:
    return torch.nonzero(tree.prev_pos >= 0).flatten()


_settings = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(seed=st.integers(0, 10**6), n=st.integers(1, 9), roots=st.integers(1, 2))
def test_packed_logprobs_equal_per_path(lm, seed, n, roots):
    rng = random.Random(seed)
    a = pack_tree(random_tree(rng, n, "a", roots=min(roots, n)), only_trainable=False)
    b = pack_tree(random_tree(rng, rng.randint(1, 6), "b"), only_trainable=False)
    policy = PackedPolicy(lm)
    with torch.no_grad():
        ref = torch.cat([per_path_logprobs(lm, t)[scored_positions(t)] for t in (a, b)])
        for attention in ("segments", "dense"):
            # Both trees in one padded micro-batch, so the padding and per-row masks are exercised too.
            logp, _ = policy(collate([a, b], [0, 1], attention=attention))
            assert logp.shape == ref.shape
            torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
            alone, _ = policy(collate([a], [0], attention=attention))
            torch.testing.assert_close(alone, ref[: alone.numel()], atol=1e-5, rtol=0)


@pytest.mark.slow
@_settings
@given(seed=st.integers(0, 10**6), n=st.integers(2, 9), attention=st.sampled_from(["segments", "dense"]))
def test_packed_gradients_equal_per_path_with_once_per_prefix_weights(lm, seed, n, attention):
    rng = random.Random(seed)
    tree = pack_tree(random_tree(rng, n), only_trainable=False)
    pos = scored_positions(tree)
    adv = torch.randn(tree.n_tokens, generator=torch.Generator().manual_seed(seed))  # a per-token signal
    w = torch.full((tree.n_tokens,), 1.0 / len(pos)) if len(pos) else torch.zeros(tree.n_tokens)

    lm.zero_grad()
    logp, _ = PackedPolicy(lm)(collate([tree], [0], attention=attention))
    (-(w[pos] * adv[pos] * logp).sum()).backward()
    packed = {k: p.grad.clone() for k, p in lm.named_parameters() if p.grad is not None}

    # Per trajectory: every path alone; a token shared by c paths is weighted 1/c (counted once per rollout).
    paths = root_paths(tree)
    count = torch.zeros(tree.n_tokens)
    for p in paths:
        count[p] += 1
    lm.zero_grad()
    total = 0.0
    for p in paths:
        ids = tree.input_ids[p][None]
        lp = lm(input_ids=ids).logits[0].float().log_softmax(-1)[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        tgt = p[1:]
        total = total - (w[tgt] / count[tgt] * adv[tgt] * lp).sum()
    total.backward()
    # each parameter's error relative to its own largest gradient, floored by the model's largest: a
    # parameter whose gradient is all but zero (a q_proj row group at 1e-8) carries fp32 rounding of
    # the whole backward, not its own scale
    refs = {k: dict(lm.named_parameters())[k].grad for k in packed}
    floor = max(float(r.abs().max()) for r in refs.values())
    for k, g in packed.items():
        scale = max(float(refs[k].abs().max()), 1e-3 * floor, 1e-12)
        assert (g - refs[k]).abs().max() <= 1e-5 * scale, k


def test_only_trainable_nodes_and_their_ancestors_are_packed():
    rng = random.Random(3)
    nodes = random_tree(rng, 30, p_dropped=0.4)
    tree = pack_tree(nodes)
    trainable_tokens = sum(len(n.token_ids) for n in nodes if n.trainable)
    assert tree.n_trainable == trainable_tokens == int(tree.trainable.sum()) == tree.target_ids.numel()
    assert tree.n_tokens <= sum(len(n.token_ids) for n in nodes)
    # Every scored token's engine logprob came along.
    want = sorted(lp for n in nodes if n.trainable for lp in n.logprobs)
    assert sorted(tree.rollout_logprobs.tolist()) == pytest.approx(want)


def test_leaf_that_is_not_trainable_is_not_forwarded():
    nodes = [
        TreeNode("r", 0, -1, [1, 2, 3], "env", [], "c0", 0, "main", True, 0),
        TreeNode("r", 1, 0, [4, 5], "model", [-0.1, -0.2], "c0", 0, "main", True, 3),
        TreeNode("r", 2, 0, [6, 7, 8], "model", [-0.1, -0.2, -0.3], "c1", 0, "subagent", True, 3, "subagent"),
        TreeNode("r", 3, 1, [9], "model", [-0.5], "c2", 0, "main", False, 5, "dead_leaf"),
    ]
    tree = pack_tree(nodes)
    assert tree.input_ids.tolist() == [1, 2, 3, 4, 5]
    assert tree.is_chain and tree.leaves == 1 and tree.path_tokens == 5
    assert tree.pred_pos.tolist() == [2, 3] and tree.target_ids.tolist() == [4, 5]
    assert collate([tree], [0]).attention_mask is None  # plain causal attention
    full = pack_tree(nodes, only_trainable=False)
    assert full.input_ids.tolist() == [1, 2, 3, 4, 5, 9, 6, 7, 8]
    assert full.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5]
    # The branch point's last token (3, at position 2) predicts each child's first token once.
    assert [p for p, t in zip(full.pred_pos.tolist(), full.target_ids.tolist()) if t in (4, 6)] == [2, 2]
    assert full.leaves == 2 and full.path_tokens == 6 + 6 and not full.is_chain
    mask = full.attention_mask()
    assert not mask[6, 3] and not mask[6, 5] and mask[6, 2] and mask[5, 4]


def test_chain_without_mask_equals_plain_forward(lm):
    ids = list(range(10, 40))
    nodes = [TreeNode("r", 0, -1, ids[:10], "env", [], "c", 0, "main", True, 0),
             TreeNode("r", 1, 0, ids[10:], "model", [-1.0] * 20, "c", 0, "main", True, 10)]
    tree = pack_tree(nodes)
    with torch.no_grad():
        logp, _ = PackedPolicy(lm)(collate([tree], [0]))
        ref = lm(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)[9:-1].gather(-1, torch.tensor(ids[10:])[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda ns: ns[1].__setattr__("depth", 7), "depth"),
        (lambda ns: ns[1].__setattr__("logprobs", [-0.1]), "logprobs"),
        (lambda ns: ns[1].__setattr__("parent_id", 42), "parent_id"),
    ],
)
def test_bad_trees_name_the_field(change, field):
    nodes = [TreeNode("r", 0, -1, [1, 2], "env", [], "c", 0, "main", True, 0),
             TreeNode("r", 1, 0, [3, 4], "model", [-0.1, -0.2], "c", 0, "main", True, 2)]
    change(nodes)
    with pytest.raises(UserError, match=field):
        pack_tree(nodes)


def test_microbatches_stay_within_the_token_budget():
    lengths = [5, 100, 30, 30, 31, 7, 250, 1]
    plan = plan_microbatches(lengths, 100)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 100


def test_segment_attention_splits_long_runs_into_exact_query_blocks(lm, monkeypatch):
    from clawgym.train import attention

    monkeypatch.setattr(attention, "QUERY_BLOCK", 4)  # force many blocks on a small tree
    rng = random.Random(7)
    tree = pack_tree(random_tree(rng, 7, max_len=11, roots=2), only_trainable=False)
    blocks = attention.plan_blocks(tree.node_parent, tree.node_start, tree.n_tokens)
    assert any(b.mask is not None and b.q1 - b.q0 == 4 for b in blocks)
    # The blocks cover every position exactly once, in order.
    assert [p for b in blocks for p in range(b.q0, b.q1)] == list(range(tree.n_tokens))
    with torch.no_grad():
        logp, _ = PackedPolicy(lm)(collate([tree], [0], attention="segments"))
        ref = per_path_logprobs(lm, tree)[scored_positions(tree)]
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
