"""The over-confident reference forecaster and the warm-start examples it writes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from futureworld.domain import QuestionKind
from futureworld.scoring import brier
from futureworld.world import (
    MarketResolution,
    World,
    WorldConfig,
    reference_forecast,
    sft_examples,
    true_probability,
)
from futureworld.world.reference import sharpen

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def test_overconfident_reference_is_worse_than_the_truth_but_beats_a_coin() -> None:
    world = World(WorldConfig(seed=21, questions_per_day=25))
    truth, reference, outcomes = [], [], []
    for example in sft_examples(world, 120):
        resolution = world.resolution_as_of(example.question.external_id, FAR_FUTURE)
        if resolution.resolution is MarketResolution.CANCEL:
            continue
        truth.append(true_probability(example.question, world))
        reference.append(example.target_p_yes)
        outcomes.append(resolution.value)
    assert len(outcomes) > 2500
    brier_truth, brier_reference = brier(truth, outcomes), brier(reference, outcomes)
    assert brier_truth < brier_reference < 0.25
    # Expected values: 0.17 for the truth, about 0.181 for sharpening 2.
    assert abs(brier_truth - 0.17) < 0.01


def test_reference_pushes_every_cue_toward_zero_or_one() -> None:
    world = World(WorldConfig(seed=1))
    for question in (q.to_domain() for q in world.questions_posed_on(0)):
        p_true = true_probability(question)
        p_reference = reference_forecast(question)
        if p_true == 0.5:
            assert p_reference == 0.5
        else:
            assert abs(p_reference - 0.5) > abs(p_true - 0.5)
            assert (p_reference > 0.5) == (p_true > 0.5)
        assert reference_forecast(question, sharpening=1.0) == pytest.approx(p_true)


def test_sft_examples_cover_the_days_asked_for_as_harvested_questions() -> None:
    world = World(WorldConfig(seed=3, questions_per_day=6))
    examples = sft_examples(world, [2, 4], sharpening=3.0)
    assert [e.question.external_id for e in examples] == [
        q.external_id for day in (2, 4) for q in world.questions_posed_on(day)
    ]
    for example in examples:
        question = example.question
        assert question.source == "manifold" and question.kind is QuestionKind.BINARY
        assert question.info_cutoff_at == question.created_at
        assert question.domain in question.extra["group_slugs"]
        p_true = world.true_probability(question.external_id)
        assert true_probability(question) == true_probability(question, world) == p_true
        expected = min(max(sharpen(p_true, 3.0), 0.01), 0.99)  # never certain
        assert example.target_p_yes == pytest.approx(expected, abs=1e-4)
    assert len(sft_examples(world, 3)) == 18
    assert {e.target_p_yes for e in examples} >= {0.01, 0.99}  # "very low" / "very high" clip


def test_noisy_sft_targets_spread_but_stay_inside_the_reference_range() -> None:
    world = World(WorldConfig(seed=4, questions_per_day=40))
    plain = sft_examples(world, 5, sharpening=3.0)
    noisy = sft_examples(world, 5, sharpening=3.0, noise_logit=1.0)
    assert noisy == sft_examples(world, 5, sharpening=3.0, noise_logit=1.0)  # seeded
    targets = [e.target_p_yes for e in noisy]
    assert all(0.01 <= t <= 0.99 for t in targets)
    even = [n.target_p_yes for p, n in zip(plain, noisy, strict=True) if p.target_p_yes == 0.5]
    assert len(set(even)) > 20 and min(even) < 0.35 and max(even) > 0.65


def test_sharpen_rejects_probabilities_it_cannot_sharpen() -> None:
    with pytest.raises(ValueError, match="inside"):
        sharpen(1.0, 2.0)
    with pytest.raises(ValueError, match="sharpening"):
        sharpen(0.5, 0.0)
