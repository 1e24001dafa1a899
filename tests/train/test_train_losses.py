"""Each loss piece against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from clawgym.train import losses as L


def test_grpo_advantages_normalize_per_group_and_flag_zero_variance():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.7], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv, zero = L.grpo_advantages(rewards, groups, eps=0.0)
    # group 0: mean 0.5, population std 0.5 → ±1; group 1: equal rewards; group 2: a single rollout.
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0])
    assert zero.tolist() == [False, False, False, False, True, True, True]


def test_grpo_advantages_eps_and_uneven_rewards():
    rewards = torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)
    adv, zero = L.grpo_advantages(rewards, torch.tensor([0, 0, 0]), eps=0.1)
    mean, std = 1.0, math.sqrt((4 + 1 + 1) / 3)
    assert adv.tolist() == pytest.approx([(3 - mean) / (std + 0.1), -1 / (std + 0.1), -1 / (std + 0.1)])
    assert not zero.any()


def test_tis_token_weights_truncate_at_cap():
    old = torch.tensor([-1.0, -1.0, -2.0])
    roll = torch.tensor([-1.0, -2.0, -0.5])  # ratios e^0, e^1, e^-1.5
    w, trunc = L.tis_weights(old, roll, torch.tensor([0, 0, 1]), "token", cap=2.0)
    assert w.tolist() == pytest.approx([1.0, 2.0, math.exp(-1.5)])
    assert trunc.tolist() == [False, True, False]


def test_tis_sequence_weights_share_one_ratio_per_rollout():
    old = torch.tensor([-1.0, -1.2, -2.0, -1.0])
    roll = torch.tensor([-1.1, -1.0, -2.0, -3.0])
    seq = torch.tensor([0, 0, 1, 2])
    w, trunc = L.tis_weights(old, roll, seq, "sequence", cap=5.0)
    r0 = math.exp(0.1 - 0.2)
    assert w.tolist() == pytest.approx([r0, r0, 1.0, 5.0])
    assert trunc.tolist() == [False, False, False, True]
    w_off, t_off = L.tis_weights(old, roll, seq, "off")
    assert w_off.tolist() == [1.0] * 4 and not t_off.any()
    with pytest.raises(ValueError):
        L.tis_weights(old, roll, seq, "bogus")


def test_clipped_surrogate_values_and_gradients():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5]))
    # ratios 1.5 (A>0, clipped at 1.2), 0.6 (A>0, unclipped), 1.5 (A<0, unclipped), 0.6 (A<0, clipped at 0.9)
    logp = torch.log(torch.tensor([0.75, 0.3, 0.75, 0.3])).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, clipped = L.clipped_surrogate(logp, old, adv, eps_low=0.1, eps_high=0.2)
    assert loss.tolist() == pytest.approx([-1.2, -0.6, 1.5, 0.9])
    assert clipped.tolist() == [True, False, False, True]
    loss.sum().backward()
    # d(-ratio·A)/dlogp = -ratio·A where unclipped, 0 where clipped
    assert logp.grad.tolist() == pytest.approx([0.0, -0.6, 1.5, 0.0])


def test_k3_kl_hand_values_and_zero_at_equality():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.5])
    kl = L.k3_kl(logp, ref)
    assert kl.tolist() == pytest.approx([0.0, math.e - 1 - 1, math.exp(-1) + 1 - 1])
    assert (kl >= 0).all()


def test_value_loss_and_ppo_advantages():
    v = torch.tensor([0.2, 0.9, -0.5], requires_grad=True)
    R = torch.tensor([1.0, 1.0, 0.0])
    assert L.value_loss(v, R).tolist() == pytest.approx([0.32, 0.005, 0.125])
    adv = L.ppo_advantages(v, R)
    assert adv.tolist() == pytest.approx([0.8, 0.1, 0.5]) and not adv.requires_grad


def test_whiten_centres_and_scales_by_the_weighted_batch():
    adv = torch.tensor([-0.05, -0.05, 0.95, 0.0])
    w = torch.tensor([0.25, 0.25, 0.25, 0.25])
    out = L.whiten(adv, w)
    assert float((w * out).sum()) == pytest.approx(0.0, abs=1e-6)
    assert float((w * out**2).sum()) == pytest.approx(1.0, rel=1e-5)
    assert out[2] > 0 > out[0]  # the rare success pulls up, the rest down, whatever V's offset
    shifted = L.whiten(adv + 0.7, w)  # a value model off by a constant changes nothing
    assert shifted.tolist() == pytest.approx(out.tolist(), abs=1e-5)
    skew = L.whiten(adv, torch.tensor([0.7, 0.1, 0.1, 0.1]))  # weights decide the mean
    assert float((torch.tensor([0.7, 0.1, 0.1, 0.1]) * skew).sum()) == pytest.approx(0.0, abs=1e-6)
    assert L.whiten(torch.full((3,), 0.4), torch.full((3,), 1 / 3)).tolist() == [0.0, 0.0, 0.0]


def test_aggregation_weights_token_and_rollout_mean():
    seq = torch.tensor([0, 0, 0, 1])
    assert L.aggregation_weights(seq, "token-mean").tolist() == pytest.approx([0.25] * 4)
    assert L.aggregation_weights(seq, "rollout-mean").tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0.5])
    with pytest.raises(ValueError):
        L.aggregation_weights(seq, "sum")


def test_weights_make_microbatch_sums_equal_the_minibatch_mean():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    seq = torch.tensor([0, 0, 1, 1, 2])
    w = L.aggregation_weights(seq, "rollout-mean")
    split = (w[:2] * x[:2]).sum() + (w[2:] * x[2:]).sum()
    assert float(split) == pytest.approx((1.5 + 3.5 + 10.0) / 3)
