"""FlexAttention tree attention: the mask_mod over node ids and depth-first intervals is the dense ancestor mask.

The flex path never builds an [L, L] mask: per row it keeps each token's node and each node's
last descendant, and the block mask is evaluated a slab of queries at a time. Here its rule and its
block classification are compared with the dense mask on random trees longer than a block, and its
logprobs with the segment and dense paths. FlexAttention has no backward pass on CPU in torch, so
the gradient comparison runs where CUDA is present.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from clawgym.train.attention_flex import FLEX_BLOCK
from clawgym.train.packing import PackedPolicy, collate, pack_tree
from test_train_packing import lm, random_tree  # noqa: F401 - `lm` is a fixture used below


def dense_rows(mb) -> torch.Tensor:
    """[B, L, L] bool: the dense path's mask for the same micro-batch."""
    return mb.attention_mask.dense[:, 0]


def _trees(seed: int, n: int = 16, max_len: int = 48):
    rng = random.Random(seed)
    a = pack_tree(random_tree(rng, n, "a", max_len=max_len, roots=2), only_trainable=False)
    b = pack_tree(random_tree(rng, n // 2, "b", max_len=max_len), only_trainable=False)
    return a, b


@pytest.mark.parametrize("seed", range(6))
def test_mask_mod_and_block_mask_equal_the_dense_mask(seed):
    a, b = _trees(seed)
    flex = collate([a, b], [0, 1], attention="flex").attention_mask.flex
    dense = dense_rows(collate([a, b], [0, 1], attention="dense"))
    B, L = flex.node.shape
    assert L > 2 * FLEX_BLOCK  # several blocks, a ragged last one
    idx = torch.arange(L)
    for r, t in enumerate((a, b)):
        rule, n = flex.allowed(r, idx[:, None], idx[None, :]), t.n_tokens
        assert torch.equal(rule[:n, :n], t.attention_mask())
        assert not rule[:n, n:].any()  # no real token sees padding
        assert rule[n:, n:].diagonal().all()  # a padding token sees itself (no empty softmax row)
        dense[r, n:, n:] = rule[n:, n:]  # padding attends among itself on this path; its outputs are never read
    # Block classification: a listed partial block holds some allowed pair, a full block only allowed pairs,
    # and every allowed pair lies in a listed block.
    bm = flex.block_mask()
    nb = -(-L // FLEX_BLOCK)
    padded = torch.nn.functional.pad(dense, (0, nb * FLEX_BLOCK - L, 0, nb * FLEX_BLOCK - L))
    blocks = padded.view(B, nb, FLEX_BLOCK, nb, FLEX_BLOCK)
    some, every = blocks.any(4).any(2), blocks.all(4).all(2)
    for r in range(B):
        for qb in range(nb):
            part = bm.kv_indices[r, 0, qb, : bm.kv_num_blocks[r, 0, qb]].tolist()
            full = bm.full_kv_indices[r, 0, qb, : bm.full_kv_num_blocks[r, 0, qb]].tolist()
            assert not set(part) & set(full)
            assert all(bool(some[r, qb, k]) and not bool(every[r, qb, k]) for k in part)
            assert all(bool(every[r, qb, k]) for k in full)
            assert set(part) | set(full) == set(torch.nonzero(some[r, qb]).flatten().tolist())


@pytest.mark.parametrize("prefix", [0, 100])
def test_the_kernel_gets_block_multiple_lengths_and_the_padding_is_masked(prefix):
    """Compiled FlexAttention on CUDA found no kernel for this mask_mod on ragged lengths, so queries and
    keys are padded to whole blocks: no padded query sees a key and no query sees a padded key."""
    a, _ = _trees(3)
    flex = collate([a], [0], attention="flex").attention_mask.flex
    flex.prefix = prefix
    L = flex.node.shape[1]
    bm = flex.block_mask()
    Lq, Lk = bm.seq_lengths
    assert Lq % FLEX_BLOCK == 0 and Lk % FLEX_BLOCK == 0 and Lq >= L and Lk >= prefix + L
    assert Lq > L or Lk > prefix + L  # this tree's lengths are ragged, so padding is exercised
    rule = flex.allowed(0, torch.arange(Lq)[:, None], torch.arange(Lk)[None, :])
    assert not rule[L:, prefix:].any()  # padded queries see no row token, padding included (the prefix they may)
    assert not rule[:, prefix + L:].any()  # nothing sees a padded key
    assert rule[:L, : prefix + L].any(1).all()  # every row token sees something


def test_windowed_mask_mod_drops_keys_deeper_than_the_window():
    a, _ = _trees(1)
    flex = collate([a], [0], attention="flex").attention_mask.flex
    idx = torch.arange(a.n_tokens)
    near = (a.position_ids[:, None] - a.position_ids[None, :]) < 7
    assert torch.equal(flex.allowed(0, idx[:, None], idx[None, :], 7), a.attention_mask() & near)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_flex_logprobs_equal_segments_and_dense(lm, seed):  # noqa: F811
    a, b = _trees(seed, n=8, max_len=30)
    policy = PackedPolicy(lm)
    with torch.no_grad():
        seg, _ = policy(collate([a, b], [0, 1], attention="segments"))
        dense, _ = policy(collate([a, b], [0, 1], attention="dense"))
        flex, _ = policy(collate([a, b], [0, 1], attention="flex"))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=0)
    torch.testing.assert_close(flex, seg, atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention has no backward pass on CPU (torch raises NotImplementedError)")
def test_flex_gradients_equal_dense_on_cuda(lm):  # noqa: F811
    a, b = _trees(2, n=8, max_len=30)
    model = copy.deepcopy(lm).cuda()  # a copy: the module-scoped `lm` stays on the CPU for the other tests
    policy = PackedPolicy(model)
    grads = {}
    for attention in ("dense", "flex"):
        model.zero_grad()
        logp, _ = policy(collate([a, b], [0, 1], attention=attention).to(torch.device("cuda")))
        (-logp.sum()).backward()
        grads[attention] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    for k, g in grads["flex"].items():
        ref = grads["dense"][k]
        assert (g - ref).abs().max() <= 1e-5 * ref.abs().max().clamp_min(1e-12), k
