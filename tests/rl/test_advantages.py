"""Advantage estimators: hand-computed cases and slow loop references."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from futureworld.domain import Outcome, OutcomeStatus, Question, Turn
from futureworld.rewards import brier_reward
from futureworld.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    group_consensus,
    version_reliability,
)
from futureworld.rl.config import Estimator, TrainConfig
from tests.rl.rl_builders import make_rollout

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _group(rewards, *, question_id=1, mask=(1, 0, 1), p_yes=None, outcome_value=1.0):
    p_yes = p_yes or [0.5] * len(rewards)
    return [
        make_rollout(
            question_id=question_id,
            sample_index=i,
            reward=r,
            completion=tuple(range(len(mask))),
            mask=mask,
            p_yes=p,
            outcome_value=outcome_value,
        )
        for i, (r, p) in enumerate(zip(rewards, p_yes, strict=True))
    ]


def _advantages(rollouts, estimator, **config):
    return compute_advantages(rollouts, TrainConfig(estimator=estimator, **config))


def test_registry_covers_every_estimator():
    assert set(ADVANTAGE_ESTIMATORS) == set(Estimator)


def test_dr_grpo_subtracts_the_group_mean_on_generated_tokens_only():
    out = _advantages(_group([-0.04, -0.36, -0.16]), Estimator.DR_GRPO)
    expected = [0.14666667, -0.17333333, 0.02666667]
    for adv, a in zip(out.token_advantages, expected, strict=True):
        np.testing.assert_allclose(adv, [a, 0.0, a], rtol=1e-6)
        assert adv.dtype == np.float32


def test_grpo_divides_by_the_group_std():
    out = _advantages(_group([0.0, 1.0]), Estimator.GRPO)
    np.testing.assert_allclose([a[0] for a in out.token_advantages], [-1.0, 1.0], rtol=1e-5)


def test_grpo_group_of_equal_rewards_gets_zero_advantage():
    out = _advantages(_group([-0.25, -0.25, -0.25]), Estimator.GRPO)
    assert all(np.all(a == 0) for a in out.token_advantages)


def test_rloo_uses_the_mean_of_the_other_rollouts():
    out = _advantages(_group([1.0, 2.0, 3.0]), Estimator.RLOO)
    np.testing.assert_allclose([a[0] for a in out.token_advantages], [-1.5, 0.0, 1.5])


def _turns(first_end: int, end: int, belief: float | None, second: bool = True) -> tuple:
    """An assistant turn eliciting `belief`, then (when `second`) a tool turn and a second
    assistant turn."""
    first = Turn(
        index=0, role="assistant", text="", token_start=0, token_end=first_end, belief=belief
    )
    if not second:
        return (first,)
    return (
        first,
        Turn(index=1, role="tool", text="", token_start=first_end, token_end=first_end + 1),
        Turn(index=2, role="assistant", text="", token_start=first_end + 1, token_end=end),
    )


def test_forecast_info_gain_centres_each_turns_credit_within_the_group():
    # y = 1, λ = 0.5. a: belief 0.8 after turn 0, answer 0.9 (R = −0.01); b: 0.4 then 0.5
    # (R = −0.25); c: one turn only, answer 0.7 (R = −0.09).
    a = make_rollout(
        sample_index=0,
        reward=-0.01,
        completion=(1, 2, 3, 4, 5),
        mask=(1, 1, 0, 1, 1),
        turns=_turns(2, 5, 0.8),
    )
    b = make_rollout(
        sample_index=1,
        reward=-0.25,
        completion=(1, 2, 3, 4, 5),
        mask=(1, 1, 0, 1, 1),
        turns=_turns(2, 5, 0.4),
    )
    c = make_rollout(
        sample_index=2,
        reward=-0.09,
        completion=(1, 2),
        mask=(1, 1),
        turns=_turns(2, 2, 0.7, second=False),
    )
    out = _advantages([a, b, c], Estimator.FORECAST_INFO_GAIN, info_gain_lambda=0.5)
    # Outcome part: mean R = −0.35/3, so A = 0.32/3, −0.40/3, 0.08/3.
    # Turn 0, c_i = R_i − Φ(0.5) = R_i + 0.25 = 0.24, 0, 0.16: centred = the outcome part
    # (the prior is shared), × λ: 0.16/3, −0.20/3, 0.04/3.
    # Turn 2 (a and b only): c = −0.01 + (0.8 − 1)² = 0.03 and −0.25 + (0.4 − 1)² = 0.11,
    # mean 0.07, centred −0.04 and +0.04, × λ: −0.02, +0.02 (b's last turn gained more).
    # Turn 1 is a tool turn: mask 0, no credit.
    expected = (
        [0.48 / 3, 0.48 / 3, 0.0, 0.32 / 3 - 0.02, 0.32 / 3 - 0.02],
        [-0.60 / 3, -0.60 / 3, 0.0, -0.40 / 3 + 0.02, -0.40 / 3 + 0.02],
        [0.12 / 3, 0.12 / 3],
    )
    for got, want in zip(out.token_advantages, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_forecast_info_gain_gives_identical_rollouts_exactly_zero():
    # Eight identical 0.9 answers to a question that resolved yes: uncentred, every token
    # would get λ·(R − Φ(0.5)) = 0.5·(−0.01 + 0.25) = +0.12 and reinforce the collapse.
    group = [
        make_rollout(
            sample_index=i,
            reward=-((0.9 - 1.0) ** 2),
            completion=(1, 2, 3, 4, 5),
            mask=(1, 1, 0, 1, 1),
            turns=_turns(2, 5, 0.7),
        )
        for i in range(8)
    ]
    for size in (8, 3):  # three equal floats do not average back to their value: still 0
        out = _advantages(group[:size], Estimator.FORECAST_INFO_GAIN, info_gain_lambda=0.5)
        assert all(np.all(adv == 0) for adv in out.token_advantages)
        assert len(out.token_advantages) == size


def test_forecast_info_gain_skips_groups_without_an_outcome():
    out = _advantages(_group([0.0, -1.0], outcome_value=None), Estimator.FORECAST_INFO_GAIN)
    assert (out.groups_used, out.groups_skipped, out.rollouts) == (0, 1, ())


def _searched(belief: float, *, answer_end: int = 5) -> tuple:
    """An assistant search turn, its tool turn with the belief elicited after it (where the
    loop records it), and the answering assistant turn."""
    return (
        Turn(index=0, role="assistant", text="", token_start=0, token_end=2),
        Turn(index=1, role="tool", text="", token_start=2, token_end=3, belief=belief),
        Turn(index=2, role="assistant", text="", token_start=3, token_end=answer_end),
    )


def _phi(b: float, q: float) -> float:
    return q * math.log(b) + (1 - q) * math.log(1 - b)


def test_siop_credits_each_turn_by_the_change_of_the_outcome_potential():
    # Unresolved, consensus ŷ = 0.8, λ = 0.5; rewards are the provisional Brier expectations
    # −(p − 0.8)² − 0.16. a: searched, belief 0.7, answered 0.9 (R = −0.17); b: searched,
    # belief 0.4, answered 0.6 (R = −0.20); c: answered 0.5 at once (R = −0.25).
    q, lam = 0.8, 0.5

    def unresolved(sample: int, reward: float, p_yes: float, belief: float | None):
        searched = belief is not None
        return make_rollout(
            sample_index=sample,
            reward=reward,
            completion=(1, 2, 3, 4, 5) if searched else (1, 2),
            mask=(1, 1, 0, 1, 1) if searched else (1, 1),
            turns=_searched(belief) if searched else _searched(0.5)[:1],
            p_yes=p_yes,
            outcome_value=None,
            consensus=q,
        )

    a = unresolved(0, -0.17, 0.9, 0.7)
    b = unresolved(1, -0.20, 0.6, 0.4)
    c = unresolved(2, -0.25, 0.5, None)
    out = _advantages([a, b, c], Estimator.SIOP, siop_lambda=lam)
    # Returns from each assistant turn: potential change to the end + (1 − λ)·R.
    a0 = _phi(0.9, q) - _phi(0.5, q) + (1 - lam) * -0.17
    a1 = _phi(0.9, q) - _phi(0.7, q) + (1 - lam) * -0.17
    b0 = _phi(0.6, q) - _phi(0.5, q) + (1 - lam) * -0.20
    b1 = _phi(0.6, q) - _phi(0.4, q) + (1 - lam) * -0.20
    c0 = (1 - lam) * -0.25
    first = (a0 + b0 + c0) / 3
    second = (a1 + b1) / 2  # c has no second assistant turn
    expected = (
        [a0 - first, a0 - first, 0.0, a1 - second, a1 - second],
        [b0 - first, b0 - first, 0.0, b1 - second, b1 - second],
        [c0 - first, c0 - first],
    )
    for got, want in zip(out.token_advantages, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # b's answer turn moved it toward the consensus (0.4 → 0.6), a's away (0.7 → 0.9): b's
    # answer turn gets the larger advantage though a's whole rollout scores higher.
    assert out.token_advantages[1][3] > 0 > out.token_advantages[0][3] and a.reward > b.reward


def test_siop_uses_the_outcome_once_known_and_gives_identical_rollouts_exactly_zero():
    resolved = [
        make_rollout(
            sample_index=i,
            reward=-((p - 1.0) ** 2),
            completion=(1, 2, 3, 4, 5),
            mask=(1, 1, 0, 1, 1),
            turns=_searched(0.6),
            p_yes=p,
            outcome_value=1.0,
            consensus=0.2,  # ignored: the outcome is known
        )
        for i, p in enumerate((0.9, 0.7))
    ]
    out = _advantages(resolved, Estimator.SIOP, siop_lambda=0.5)
    gain = (_phi(0.9, 1.0) - _phi(0.7, 1.0)) / 2  # only the answers differ, both turns
    extra = 0.5 * (-0.01 + 0.09) / 2
    np.testing.assert_allclose(out.token_advantages[0][[0, 3]], [gain + extra] * 2, rtol=1e-5)
    identical = [
        make_rollout(
            sample_index=i,
            reward=-0.01,
            completion=(1, 2, 3, 4, 5),
            mask=(1, 1, 0, 1, 1),
            turns=_searched(0.7),
            p_yes=0.9,
            outcome_value=1.0,
        )
        for i in range(8)
    ]
    for size in (8, 3):
        out = _advantages(identical[:size], Estimator.SIOP)
        assert all(np.all(adv == 0) for adv in out.token_advantages)


def test_siop_on_rollouts_without_turn_records_is_one_turn_each():
    # y = 1, λ = 0.5: return = Φ(p) − Φ(0.5) + 0.5·R on every generated token
    group = _group([-0.04, -0.36], p_yes=[0.8, 0.4])
    out = _advantages(group, Estimator.SIOP, siop_lambda=0.5)
    g = [math.log(p) - math.log(0.5) + 0.5 * r for p, r in ((0.8, -0.04), (0.4, -0.36))]
    mean = sum(g) / 2
    for adv, value in zip(out.token_advantages, g, strict=True):
        np.testing.assert_allclose(adv, [value - mean, 0.0, value - mean], rtol=1e-5)


def test_siop_skips_a_group_with_neither_outcome_nor_consensus():
    out = _advantages(_group([0.0, -1.0], outcome_value=None), Estimator.SIOP)
    assert (out.groups_used, out.groups_skipped) == (0, 1)
    unparsed_member = _group([-0.1, -1.25], outcome_value=None)
    unparsed_member[0] = replace(unparsed_member[0], consensus=0.6)
    assert _advantages(unparsed_member, Estimator.SIOP).groups_used == 1


def test_version_reliability_is_the_inverse_shrunk_brier():
    # No resolved forecast: the prior Brier 0.25 → weight 4.
    assert version_reliability(0.0, 0) == pytest.approx(4.0)
    # Σ brier 1.0 over 10 forecasts, shrunk with 10 × 0.25: (1 + 2.5) / 20 = 0.175.
    assert version_reliability(1.0, 10) == pytest.approx(1 / 0.175)
    # A version that forecast better weighs more.
    assert version_reliability(0.5, 10) > version_reliability(2.0, 10)


def test_group_consensus_is_one_reliability_weighted_mean_for_the_whole_group():
    # Pool: an earlier version's two forecasts (weight 2) and the group's three (weight 5).
    pool_p = np.array([0.2, 0.4, 0.6, 0.7, 0.9])
    pool_w = np.array([2.0, 2.0, 5.0, 5.0, 5.0])
    own_p, own_w = pool_p[2:], pool_w[2:]
    got = group_consensus(pool_p, pool_w, own_p, own_w)
    # (0.4 + 0.8 + 3 + 3.5 + 4.5) / 19, the same for every member
    assert got.tolist() == pytest.approx([12.2 / 19] * 3)
    assert len(set(got.tolist())) == 1


def _brier_expectation(p_yes: float, y_hat: float) -> float:
    """E[R(p, y)], y ~ Bernoulli(ŷ), from the real Brier reward at y = 1 and y = 0: what the
    provisional-rewards stage stores."""
    question = Question(
        source="test",
        external_id="q",
        title="Will it?",
        created_at=T0,
        info_cutoff_at=T0,
        close_at=T0 + timedelta(days=1),
        id=1,
    )
    trajectory = make_rollout(p_yes=p_yes).trajectory
    values = [
        brier_reward(
            trajectory,
            question,
            Outcome(
                question_id=1, revision=0, status=OutcomeStatus.RESOLVED, value=y, resolved_at=T0
            ),
        ).value
        for y in (1.0, 0.0)
    ]
    return y_hat * values[0] + (1 - y_hat) * values[1]


def _provisional_first_tokens(p_yes, y_hat):
    rewards = [_brier_expectation(p, y) for p, y in zip(p_yes, y_hat, strict=True)]
    out = _advantages(
        _group(rewards, p_yes=list(p_yes), outcome_value=None), Estimator.PROVISIONAL_CONSENSUS
    )
    return np.asarray([a[0] for a in out.token_advantages], dtype=np.float64)


def test_provisional_consensus_ranks_four_0_6_and_four_0_9_forecasts_by_their_distance_only():
    # Equal weights (the prior reliability 4): the consensus is ŷ = (4·0.6 + 4·0.9)/8 = 0.75
    # and both halves are 0.15 from it, so the distance gives them equal rewards
    # −0.15² − 0.75·0.25 = −0.21 and the centred advantage is 0 for every member.
    p_yes = np.array([0.6] * 4 + [0.9] * 4)
    weights = np.full(8, version_reliability(0.0, 0))
    y_hat = group_consensus(p_yes, weights, p_yes, weights)
    assert y_hat.tolist() == pytest.approx([0.75] * 8)
    assert _brier_expectation(0.6, 0.75) == pytest.approx(_brier_expectation(0.9, 0.75))
    np.testing.assert_allclose(_provisional_first_tokens(p_yes, y_hat), 0.0, atol=1e-7)
    # The leave-one-out labels this replaces: ŷ₋ᵢ = (6 − p_i)/7 = 0.7714 for a 0.6 and 0.7286
    # for a 0.9. Both are 0.1714 from their label (the distance still ties them), but the
    # variance terms ŷ₋ᵢ(1 − ŷ₋ᵢ) = 0.17633 and 0.19776 differ by 0.02143, so the 0.6 half got
    # +0.0107 and the 0.9 half −0.0107 from where its own vote had moved its label alone.
    loo = (p_yes.sum() - p_yes) / 7
    old = _provisional_first_tokens(p_yes, loo)
    np.testing.assert_allclose(old, [0.0107] * 4 + [-0.0107] * 4, atol=1e-4)


def test_provisional_advantages_are_the_leave_one_out_distances_scaled_by_a_group_constant():
    # An earlier version's forecasts (weight 2) and a group of three (weight 5): the shared
    # label gives A_i = −(p_i − ŷ)² + mean_j (p_j − ŷ)², the leave-one-out distance alone
    # (W / (W − w))² times that, W = 19, w = 5.
    pool_p = np.array([0.2, 0.4, 0.6, 0.7, 0.9])
    pool_w = np.array([2.0, 2.0, 5.0, 5.0, 5.0])
    own_p, own_w = pool_p[2:], pool_w[2:]
    y_hat = group_consensus(pool_p, pool_w, own_p, own_w)
    got = _provisional_first_tokens(own_p, y_hat)
    shared = -((own_p - y_hat) ** 2)
    np.testing.assert_allclose(got, shared - shared.mean(), atol=1e-7)
    loo = ((pool_w * pool_p).sum() - own_w * own_p) / (pool_w.sum() - own_w)
    distance = -((own_p - loo) ** 2)
    np.testing.assert_allclose(got * (19 / 14) ** 2, distance - distance.mean(), atol=1e-7)
    assert got[0] > got[1] > got[2]  # 0.6 is nearest the consensus 12.2/19 = 0.642, 0.9 farthest


def test_group_consensus_of_a_lone_forecast_is_undefined():
    got = group_consensus(np.array([0.3]), np.array([4.0]), np.array([0.3]), np.array([4.0]))
    assert np.isnan(got).all()


def test_provisional_consensus_is_dr_grpo_on_the_rewards_replay_hands_it():
    # Provisional rewards (no outcome yet) and real ones alike: A = R − mean R.
    provisional = _advantages(
        _group([-0.01, -0.09], outcome_value=None), Estimator.PROVISIONAL_CONSENSUS
    )
    np.testing.assert_allclose(
        [a[0] for a in provisional.token_advantages], [0.04, -0.04], atol=1e-6
    )
    real = _advantages(_group([-0.04, -0.36]), Estimator.PROVISIONAL_CONSENSUS)
    np.testing.assert_allclose([a[0] for a in real.token_advantages], [0.16, -0.16], atol=1e-6)


def test_each_question_weighs_the_same_however_many_groups_it_has():
    def group(question_id, version, rewards):
        return [
            make_rollout(
                question_id=question_id,
                policy_version=version,
                sample_index=i,
                reward=r,
                completion=(0, 1),
                mask=(1, 1),
            )
            for i, r in enumerate(rewards)
        ]

    # Question 1 re-forecast by versions 0 and 1, question 2 forecast once.
    rollouts = [*group(1, 0, [0.0, -0.4]), *group(2, 0, [0.0, -0.4]), *group(1, 1, [-0.1, -0.5])]
    out = _advantages(rollouts, Estimator.DR_GRPO)
    assert out.group_sizes == (2, 2, 2)
    first = [a[0] for a in out.token_advantages]
    # dr_grpo gives ±0.2 in each group; question 1's two groups count 1/2 each.
    np.testing.assert_allclose(first, [0.1, -0.1, 0.2, -0.2, 0.1, -0.1], atol=1e-6)


def test_groups_come_out_whole_and_consecutive_in_first_appearance_order():
    a1, a2 = _group([0.0, -1.0], question_id=1)
    b1, b2, b3 = _group([-0.5, -0.2, -0.1], question_id=2)
    out = _advantages([a1, b1, a2, b2, b3], Estimator.DR_GRPO)
    assert out.rollouts == (a1, a2, b1, b2, b3) and out.group_sizes == (2, 3)


def test_groups_with_fewer_than_two_rollouts_are_skipped_except_for_sft():
    rollouts = [*_group([0.0, -1.0], question_id=1), *_group([-0.5], question_id=2)]
    for estimator in (
        Estimator.DR_GRPO,
        Estimator.GRPO,
        Estimator.RLOO,
        Estimator.PROVISIONAL_CONSENSUS,
    ):
        out = _advantages(rollouts, estimator)
        assert (out.groups_used, out.groups_skipped, len(out.rollouts)) == (1, 1, 2)
    sft = _advantages(rollouts, Estimator.SFT)
    # SFT has no baseline: every trajectory is a group (a step unit) of its own
    assert (sft.groups_used, sft.groups_skipped, len(sft.rollouts)) == (3, 0, 3)
    assert sft.group_sizes == (1, 1, 1)
    assert all(np.array_equal(a, [1.0, 0.0, 1.0]) for a in sft.token_advantages)


def test_non_finite_reward_is_rejected_with_the_rollout_named():
    rollouts = _group([0.0, math.nan])
    with pytest.raises(ValueError, match="q1-a1-v0-s1"):
        _advantages(rollouts, Estimator.DR_GRPO)


def _reference(estimator, rollouts, lam):
    """Slow, obvious per-token loops for every estimator."""
    groups = {}
    for r in rollouts:
        groups.setdefault(r.trajectory.group_key, []).append(r)
    out = []
    for group in groups.values():
        rewards = [r.reward for r in group]
        g = len(group)
        mean = sum(rewards) / g
        if estimator is Estimator.SFT:
            out += [[float(m) for m in r.trajectory.loss_mask] for r in group]
            continue
        if g < 2:
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / g)
        for i, r in enumerate(group):
            if estimator is Estimator.GRPO:
                a = (rewards[i] - mean) / (std + 1e-6)
            elif estimator is Estimator.RLOO:
                a = rewards[i] - (sum(rewards) - rewards[i]) / (g - 1)
            else:
                a = rewards[i] - mean
            tokens = []
            for t, m in enumerate(r.trajectory.loss_mask):
                value = a if m else 0.0
                if estimator is Estimator.FORECAST_INFO_GAIN and m:
                    for turn in r.trajectory.turns:
                        if turn.token_start <= t < turn.token_end:
                            credits = turn_credits(group, turn.index)
                            value += lam * (credits[i] - sum(credits.values()) / len(credits))
                tokens.append(value)
            out.append(tokens)
    return out


def turn_credits(group, index):
    """R_j − Φ(belief of rollout j before its turn `index`), for the rollouts with that turn."""
    credits = {}
    for j, r in enumerate(group):
        belief = 0.5
        for turn in sorted(r.trajectory.turns, key=lambda x: x.index):
            if turn.index == index:
                credits[j] = r.reward + (belief - r.outcome_value) ** 2
            if turn.belief is not None:
                belief = turn.belief
    return credits


@pytest.mark.parametrize(
    "estimator",
    [
        Estimator.DR_GRPO,
        Estimator.GRPO,
        Estimator.RLOO,
        Estimator.FORECAST_INFO_GAIN,
        Estimator.SFT,
    ],
)
def test_estimators_match_a_python_loop_reference(estimator):
    rng = np.random.default_rng(7)
    rollouts = []
    for q in range(6):
        for s in range(int(rng.integers(1, 6))):
            n = int(rng.integers(3, 9))
            mask = tuple(int(x) for x in rng.integers(0, 2, n))
            cuts = sorted(rng.choice(np.arange(1, n), size=2, replace=False).tolist())
            turns = (
                Turn(
                    index=0,
                    role="assistant",
                    text="",
                    token_start=0,
                    token_end=cuts[0],
                    belief=float(rng.uniform()),
                ),
                Turn(index=1, role="assistant", text="", token_start=cuts[0], token_end=cuts[1]),
                Turn(
                    index=2,
                    role="assistant",
                    text="",
                    token_start=cuts[1],
                    token_end=n,
                    belief=float(rng.uniform()),
                ),
            )
            rollouts.append(
                make_rollout(
                    question_id=q,
                    sample_index=s,
                    reward=-float(rng.uniform()),
                    completion=tuple(range(n)),
                    mask=mask,
                    turns=turns,
                    outcome_value=float(rng.integers(0, 2)),
                )
            )
    out = _advantages(rollouts, estimator, info_gain_lambda=0.3)
    expected = _reference(estimator, rollouts, 0.3)
    assert len(out.token_advantages) == len(expected)
    for got, want in zip(out.token_advantages, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
