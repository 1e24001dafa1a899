"""The chunked LM head equals one [T, V] pass: same logprobs and entropies, same gradients, one chunk alive."""

from __future__ import annotations

import random

import pytest
import torch

from clawgym.train.lm_head import chunked_logprobs, whole_score
from clawgym.train.packing import PackedPolicy, collate, pack_tree
from test_train_packing import VOCAB, lm, random_tree  # noqa: F401


def _head(V: int = 300, H: int = 24, softcap: float | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(V, H, generator=g) * 0.3)  # [V, H]

    def head(h: torch.Tensor) -> torch.Tensor:  # [n, H] → [n, V] fp32, soft-capped like Gemma 2 when asked
        logits = (h @ w.T).float()
        return torch.tanh(logits / softcap) * softcap if softcap else logits

    return w, head


@pytest.mark.parametrize("T,chunk", [(37, 8), (64, 16), (5, 16), (40, 1), (30, 30)])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_chunked_values_and_gradients_equal_the_whole_head(T, chunk, softcap):
    w, head = _head(softcap=softcap)
    g = torch.Generator().manual_seed(T)
    hidden = torch.randn(T, 24, generator=g, requires_grad=True)  # [T, H]
    targets = torch.randint(0, 300, (T,), generator=g)  # [T]
    coef = torch.randn(T, generator=g)  # a loss that weighs each token's logprob and entropy differently

    def run(c: int):
        logp, ent = chunked_logprobs(head, hidden, targets, c, with_entropy=True)
        (coef * logp + 0.1 * coef.flip(0) * ent).sum().backward()
        grads = hidden.grad.clone(), w.grad.clone()
        hidden.grad = w.grad = None
        return logp.detach(), ent.detach(), grads

    lp0, e0, (gh0, gw0) = run(0)
    lp1, e1, (gh1, gw1) = run(chunk)
    # 1e-6, and relative 1e-6 for values of 5–10 (an fp32 ulp there is 1e-6): the chunked path sums in
    # a different order (log-sum-exp, a one-row chunk's matrix-vector kernel).
    assert torch.allclose(lp1, lp0, atol=1e-6, rtol=1e-6) and torch.allclose(e1, e0, atol=1e-6, rtol=1e-6)
    assert torch.allclose(gh1, gh0, atol=1e-6, rtol=1e-5) and torch.allclose(gw1, gw0, atol=1e-6, rtol=1e-5)
    ref_lp, ref_e = whole_score(head(hidden.detach()), targets, True)
    assert torch.allclose(lp1, ref_lp, atol=1e-6, rtol=1e-6) and torch.allclose(e1, ref_e, atol=1e-6, rtol=1e-6)


def test_without_entropy_none_is_returned_and_no_grad_builds_no_graph():
    _, head = _head()
    hidden, targets = torch.randn(20, 24), torch.randint(0, 300, (20,))
    logp, ent = chunked_logprobs(head, hidden, targets, 6)
    assert ent is None and logp.shape == (20,)
    with torch.no_grad():
        lp2, _ = chunked_logprobs(head, hidden, targets, 6)
    assert not lp2.requires_grad and torch.equal(lp2, logp.detach())


def test_no_vocabulary_tensor_of_more_than_one_chunk_is_ever_made():
    """Every [rows, V] tensor created in the forward and backward has at most `chunk` rows (besides the
    weight's own [H, V] transpose and gradient, which are not per token)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    V, T, H, chunk = 300, 50, 24, 8
    w, head = _head(V=V, H=H)
    hidden = torch.randn(T, H, requires_grad=True)
    targets = torch.randint(0, V, (T,))
    seen: list[int] = []

    class Rows(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor) and o.dim() == 2 and o.shape[1] == V and o.shape[0] != H:
                    seen.append(o.shape[0])
            return out

    with Rows():
        logp, ent = chunked_logprobs(head, hidden, targets, chunk, with_entropy=True)
        (logp.sum() + ent.sum()).backward()
    assert seen and max(seen) == chunk
    seen.clear()
    hidden.grad = w.grad = None
    with Rows():
        logp, ent = chunked_logprobs(head, hidden, targets, 0, with_entropy=True)
        (logp.sum() + ent.sum()).backward()
    assert max(seen) == T  # the reference does hold them whole: the check above can fail


def test_packed_policy_with_chunks_equals_it_without(lm):  # noqa: F811
    """The policy's chunked head on a packed micro-batch: same logprobs, entropies and weight gradients."""
    rng = random.Random(3)
    trees = [pack_tree(random_tree(rng, 12, f"r{i}", max_len=8), only_trainable=False) for i in range(3)]
    mb = collate(trees, [0, 1, 2])
    out = {}
    for chunk in (0, 7):
        policy = PackedPolicy(lm, head_chunk=chunk)
        lm.zero_grad(set_to_none=True)
        logp, ent = policy(mb, with_entropy=True)
        (logp.sum() - 0.5 * ent.sum()).backward()
        out[chunk] = (logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in lm.named_parameters()})
    assert mb.target_ids.numel() > 7
    (lp0, e0, g0), (lp1, e1, g1) = out[0], out[7]
    # The matmul of a 7-row chunk blocks its sums differently from one of all rows: a few fp32 ulps.
    assert torch.allclose(lp1, lp0, atol=1e-6, rtol=1e-6) and torch.allclose(e1, e0, atol=1e-6, rtol=1e-6)
    for name, g in g0.items():  # relative to each gradient's scale
        assert (g1[name] - g).abs().max() <= 2e-6 * g.abs().max(), name
