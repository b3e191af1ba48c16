"""The validation slice and the promotion gate's rules, as pure functions: the slice is a
deterministic hash of (source, external_id); the verdict's rules on hand-made forecasts."""

from __future__ import annotations

import hashlib
import math

import pytest

from futureworld.validation import (
    GateOptions,
    equal_counts,
    forecast_health,
    is_held_out,
    judge_candidate,
    parse_drop_interval,
    validation_point,
)

KEYS = [("manifold", f"m{i}") for i in range(4000)]


def test_the_slice_is_a_hash_of_source_and_external_id() -> None:
    digest = hashlib.sha256(b"manifold\x00abc").digest()
    assert validation_point("manifold", "abc") == int.from_bytes(digest[:8], "big") / 2**64
    assert validation_point("manifold", "abc") != validation_point("metaculus", "abc")
    assert is_held_out("manifold", "abc", 0.3) == (validation_point("manifold", "abc") < 0.3)


def test_the_slice_holds_out_about_its_fraction_and_grows_with_it() -> None:
    small = {k for k in KEYS if is_held_out(*k, 0.05)}
    default = {k for k in KEYS if is_held_out(*k)}
    assert 0.08 < len(default) / len(KEYS) < 0.12
    assert small < default
    assert not any(is_held_out(*k, 0.0) for k in KEYS)
    assert all(is_held_out(*k, 1.0) for k in KEYS)


def test_a_fraction_outside_the_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="validation fraction"):
        is_held_out("s", "e", 1.5)
    with pytest.raises(ValueError, match="validation fraction"):
        GateOptions(validation_fraction=-0.1)


OUTCOMES = {q: float(q % 2) for q in range(20)}
"""Twenty questions, alternately NO and YES."""
HEDGING = {q: (0.5, 0.5) for q in OUTCOMES}
"""Always 0.5: Brier 0.25, parse rate 1, nothing extreme."""


def test_health_is_counted_per_rollout_and_brier_per_question() -> None:
    samples = {0: (0.0, None), 1: (0.99, 1.0)}
    health = forecast_health(samples, {0: 0.0, 1: 1.0}, margin=0.02)
    # question 0: mean(0.0, 0.5) = 0.25 → 0.0625; question 1: 0.995 → 0.000025
    assert health.brier == pytest.approx((0.0625 + 0.005**2) / 2)
    assert health.parse_rate == 3 / 4
    assert health.extreme_share == 1.0


def test_a_version_like_its_parent_is_promoted() -> None:
    verdict = judge_candidate(HEDGING, HEDGING, OUTCOMES, GateOptions())
    assert verdict.promote and verdict.reason.startswith("passed")
    assert verdict.brier_difference == 0.0 and verdict.brier_ci == (0.0, 0.0)


def test_a_version_that_stops_answering_is_rejected_for_its_parse_rate() -> None:
    mute = {q: (None, None) for q in OUTCOMES}
    verdict = judge_candidate(mute, HEDGING, OUTCOMES, GateOptions())
    assert not verdict.promote
    assert verdict.parse_drop == 1.0 and verdict.parse_drop_ci == (1.0, 1.0)
    assert (
        "parse rate 0.00 is more than 0.02 below parent's 1.00, a drop beyond the interval "
        "(lower end of the drop +1.00 > 0 on 20 questions)" in verdict.reason
    )
    assert "parse rate 0.00 vs 1.00 (drop +1.00, 95% CI [+1.00, +1.00])" in verdict.reason
    # nothing parsed against everything parsed is certain on any number of questions
    three = {q: OUTCOMES[q] for q in range(3)}
    assert not judge_candidate(mute, HEDGING, three, GateOptions()).promote


def test_one_unparsed_answer_more_than_the_parent_on_a_small_set_is_promoted() -> None:
    few = {q: OUTCOMES[q] for q in range(4)}
    parent = {q: (0.5,) * 4 for q in few}
    candidate = {**parent, 2: (0.5, 0.5, 0.5, None)}
    verdict = judge_candidate(candidate, parent, few, GateOptions())
    assert verdict.promote and verdict.parse_drop == pytest.approx(1 / 16)
    assert verdict.parse_drop_ci[0] == 0.0 and verdict.parse_drop_ci[1] > 0.05
    # one rollout a question: one miss in ten is a drop of 0.10, more than 0.02, yet promoted
    ten = {q: OUTCOMES[q] for q in range(10)}
    single = {q: (0.5,) for q in ten}
    verdict = judge_candidate({**single, 0: (None,)}, single, ten, GateOptions())
    assert verdict.promote and verdict.parse_drop == pytest.approx(0.1)
    # the same share missing on every question of forty rollouts each is a drop with confidence
    wide = {q: (0.5,) * 40 for q in OUTCOMES}
    thinner = {q: (0.5,) * 30 + (None,) * 10 for q in OUTCOMES}
    verdict = judge_candidate(thinner, wide, OUTCOMES, GateOptions())
    assert not verdict.promote and verdict.parse_drop_ci[0] > 0.05


def test_a_parse_drop_beyond_the_margin_is_rejected_once_the_interval_excludes_no_drop() -> None:
    # 16 rollouts on each of 20 questions; the candidate misses 1 of 16 on 10 of them: a drop
    # of 0.03125 whose interval's lower end is above 0 but below the 0.02 margin (the rule as
    # it was, lower end above the margin, promoted it)
    parent = {q: (0.5,) * 16 for q in OUTCOMES}
    candidate = {q: (0.5,) * 15 + (None,) if q < 10 else (0.5,) * 16 for q in OUTCOMES}
    verdict = judge_candidate(candidate, parent, OUTCOMES, GateOptions())
    assert verdict.parse_drop == pytest.approx(0.03125)
    assert 0.0 < verdict.parse_drop_ci[0] < 0.02
    assert not verdict.promote and "a drop beyond the interval" in verdict.reason
    assert judge_candidate(candidate, parent, OUTCOMES, GateOptions(max_parse_drop=0.05)).promote
    # a larger drop that the interval cannot tell from none is not a verdict
    verdict = judge_candidate({0: (0.5,) * 7 + (None,)}, {0: (0.5,) * 8}, {0: 0.0}, GateOptions())
    assert verdict.parse_drop == pytest.approx(0.125) and verdict.parse_drop_ci[0] == 0.0
    assert verdict.promote


def test_the_parse_drop_interval_of_one_question_is_its_rollouts_binomial() -> None:
    # one question, 4 of 4 parsed against 3 of 4: the parent never varies, the candidate's
    # redrawn parsed count is Binomial(4, 3/4), so the drop 1 − X/4 is 0 with P = 0.316,
    # 0.25 with 0.422, 0.5 with 0.211, 0.75 with 0.047 and 1 with 0.004: its 2.5% quantile
    # is 0 and its 97.5% quantile 0.75 (P(drop ≤ 0.5) = 0.949 < 0.975 ≤ P(drop ≤ 0.75))
    interval = parse_drop_interval({0: (0.5, 0.5, 0.5, None)}, {0: (0.5,) * 4}, [0])
    assert interval == (0.0, 0.75)
    # all 4 parsed on both sides: no noise, a point at 0
    assert parse_drop_interval({0: (0.5,) * 4}, {0: (0.5,) * 4}, [0]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least one question"):
        parse_drop_interval({}, {}, [])


def test_a_collapsed_version_is_rejected_but_not_for_matching_an_extreme_parent() -> None:
    certain = {q: (1.0, 1.0) for q in OUTCOMES}
    verdict = judge_candidate(certain, HEDGING, OUTCOMES, GateOptions())
    assert not verdict.promote and "collapsed: 100% of answers" in verdict.reason
    # always 1 on a half-YES set: Brier 0.5 vs 0.25, yet 20 questions leave the interval at 0
    assert verdict.brier_difference == 0.25 and "Brier worse" not in verdict.reason
    sharp = {q: (0.99 if y else 0.01,) * 2 for q, y in OUTCOMES.items()}  # right and certain
    assert judge_candidate(sharp, sharp, OUTCOMES, GateOptions()).promote
    assert not judge_candidate(sharp, HEDGING, OUTCOMES, GateOptions()).promote  # collapse rule
    assert judge_candidate(
        sharp, HEDGING, OUTCOMES, GateOptions(max_extreme_share=1.0)
    ).promote  # better Brier, extremes allowed


def test_brier_rejects_only_when_the_whole_interval_is_above_the_allowed_increase() -> None:
    slightly_worse = {q: (0.45 if y else 0.55,) * 2 for q, y in OUTCOMES.items()}
    verdict = judge_candidate(slightly_worse, HEDGING, OUTCOMES, GateOptions())
    # every question is worse by the same amount: the interval is one point, above 0
    assert verdict.brier_ci == pytest.approx((0.0525, 0.0525), abs=1e-12)  # 0.55² − 0.5²
    assert not verdict.promote and "lower end +0.0525 > +0.0000" in verdict.reason
    lenient = GateOptions(max_brier_increase=0.06, max_brier_point_increase=None)
    assert judge_candidate(slightly_worse, HEDGING, OUTCOMES, lenient).promote
    # worse by 0.0525 on the first ten questions, better by 0.0475 on the others
    mixed = {q: (abs(y - 0.55) if q < 10 else abs(y - 0.45),) for q, y in OUTCOMES.items()}
    mixed_verdict = judge_candidate(mixed, HEDGING, OUTCOMES, GateOptions())
    assert mixed_verdict.brier_ci is not None and mixed_verdict.brier_ci[0] < 0.0
    assert mixed_verdict.promote


def test_a_candidate_worse_beyond_the_point_bound_is_rejected_inside_the_interval() -> None:
    # 0.20 worse on the first ten questions, 0.14 better on the others: +0.03 on the mean
    def off(y: float, distance: float) -> tuple[float]:
        return (1.0 - distance if y else distance,)

    noisy = {q: off(y, math.sqrt(0.45) if q < 10 else math.sqrt(0.11)) for q, y in OUTCOMES.items()}
    verdict = judge_candidate(noisy, HEDGING, OUTCOMES, GateOptions())
    assert verdict.brier_difference == pytest.approx(0.03, abs=1e-12)
    assert verdict.brier_ci is not None and verdict.brier_ci[0] < 0.0  # the interval acquits
    assert not verdict.promote
    assert "Brier +0.0300 worse than parent (bound +0.0200)" in verdict.reason
    assert "beyond the interval" not in verdict.reason
    assert judge_candidate(
        noisy, HEDGING, OUTCOMES, GateOptions(max_brier_point_increase=0.04)
    ).promote
    few = {q: OUTCOMES[q] for q in range(3)}  # below min_brier_questions neither Brier rule
    assert judge_candidate({q: noisy[q] for q in few}, HEDGING, few, GateOptions()).promote


def test_too_few_questions_leave_the_brier_rule_out() -> None:
    few = {q: OUTCOMES[q] for q in range(3)}
    worse = {q: (0.4 if y else 0.6,) for q, y in few.items()}
    verdict = judge_candidate(worse, HEDGING, few, GateOptions())
    assert verdict.promote and verdict.brier_ci is None
    assert "Brier rule needs 10 questions" in verdict.reason
    assert not judge_candidate(worse, HEDGING, few, GateOptions(min_brier_questions=3)).promote


def test_a_small_validation_set_gets_more_rollouts_per_question() -> None:
    options = GateOptions(samples=4, min_rollouts=128, max_samples=32)
    assert [options.samples_for(n) for n in (0, 1, 4, 5, 32, 33, 200)] == [4, 32, 32, 26, 4, 4, 4]
    assert GateOptions(min_rollouts=0).samples_for(3) == 4
    with pytest.raises(ValueError, match="max_samples >= samples"):
        GateOptions(samples=8, max_samples=4)


def test_the_health_rules_also_judge_questions_without_an_outcome() -> None:
    """Two resolved questions the candidate answers well, and thirty open ones it mostly
    cannot answer: the parse rule, over all 32, rejects what the resolved two would pass."""
    resolved = {0: 0.0, 1: 1.0}
    open_ids = list(range(2, 32))
    parent = {q: (0.5,) * 4 for q in range(32)}
    candidate = {0: (0.1,) * 4, 1: (0.9,) * 4, **{q: (None, None, None, 0.5) for q in open_ids}}
    alone = judge_candidate(candidate, parent, resolved, GateOptions())
    assert alone.promote and alone.candidate.parse_rate == 1.0
    verdict = judge_candidate(candidate, parent, resolved, GateOptions(), health_ids=open_ids)
    assert not verdict.promote and "parse rate 0.30 is more than 0.02 below" in verdict.reason
    health = verdict.candidate
    assert (health.questions, health.health_questions) == (2, 32)
    assert health.brier == pytest.approx(0.01)  # over the resolved two only
    assert health.parse_rate == pytest.approx((8 + 30) / 128)
    assert verdict.brier_difference == pytest.approx(0.01 - 0.25)


def test_with_no_resolved_question_only_the_health_rules_decide() -> None:
    parent = {q: (0.5, 0.5) for q in range(12)}
    certain = {q: (1.0, 1.0) for q in range(12)}
    verdict = judge_candidate(certain, parent, {}, GateOptions(), health_ids=list(range(12)))
    assert not verdict.promote and "collapsed: 100% of answers" in verdict.reason
    assert verdict.candidate.brier is None and verdict.brier_ci is None
    assert "no resolved question: the Brier rule waits for outcomes" in verdict.reason
    assert judge_candidate(parent, parent, {}, GateOptions(), health_ids=list(range(12))).promote
    with pytest.raises(ValueError, match="at least one validation question"):
        judge_candidate(parent, parent, {}, GateOptions())


TRAINED = {q: float(q % 3 == 0) for q in range(100, 130)}
"""Thirty questions an update trained on, a third resolved YES."""
OPEN = list(range(5))
"""Questions with no outcome yet: the health rules' only ones."""


def _on(trained: dict[int, tuple[float, ...]]) -> dict[int, tuple[float, ...]]:
    return {**{q: (0.5, 0.5) for q in OPEN}, **trained}


def test_a_version_worse_on_its_training_questions_is_rejected_before_held_out_outcomes() -> None:
    """No held-out outcome yet (the Brier rule waits), healthy answers everywhere: the fit
    rule alone rejects a candidate that answers its training questions backwards."""
    parent = _on({q: (0.3, 0.4) if y == 0 else (0.6, 0.7) for q, y in TRAINED.items()})
    backwards = _on({q: (0.7, 0.8) if y == 0 else (0.2, 0.3) for q, y in TRAINED.items()})
    verdict = judge_candidate(
        backwards, parent, {}, GateOptions(), health_ids=OPEN, trained_outcomes=TRAINED
    )
    assert not verdict.promote
    assert "worse than parent on the 30 questions it was trained on" in verdict.reason
    # each question: (0.75 - y)^2 against (0.35 - y)^2 for NO, (0.25-1)^2 vs (0.65-1)^2 YES
    assert verdict.fit_difference == pytest.approx(
        (20 * (0.5625 - 0.1225) + 10 * (0.5625 - 0.1225)) / 30
    )
    assert verdict.fit_ci == pytest.approx((0.44, 0.44))
    assert verdict.fit_questions == 30 and verdict.brier_ci is None
    assert verdict.candidate.health_questions == len(OPEN)  # trained ones are not health's

    learnt = judge_candidate(
        parent, backwards, {}, GateOptions(), health_ids=OPEN, trained_outcomes=TRAINED
    )
    assert learnt.promote and learnt.fit_difference == pytest.approx(-0.44)
    off = judge_candidate(backwards, parent, {}, GateOptions(), health_ids=OPEN)
    assert off.promote and off.fit_questions == 0 and off.fit_ci is None


def test_the_fit_rule_needs_as_many_questions_as_the_brier_rule_and_an_interval_above_zero() -> (
    None
):
    few = dict(list(TRAINED.items())[:9])
    parent = _on({q: (0.5, 0.5) for q in TRAINED})
    backwards = _on({q: (0.9,) * 2 if y == 0 else (0.1,) * 2 for q, y in TRAINED.items()})
    verdict = judge_candidate(
        backwards, parent, {}, GateOptions(), health_ids=OPEN, trained_outcomes=few
    )
    assert verdict.promote and verdict.fit_ci is None
    assert "fit rule needs 10 questions" in verdict.reason
    # Worse on some, better on others: an interval that reaches below zero does not convict.
    # Half answered the right way (0.8 toward the outcome: -0.21 each), half the wrong way
    # (0.7 away from it: +0.24 each): +0.015 on average.
    mixed = _on(
        {q: (abs(y - 0.2),) * 2 if q % 2 else (abs(y - 0.7),) * 2 for q, y in TRAINED.items()}
    )
    interval_only = GateOptions(max_fit_point_increase=None)
    maybe = judge_candidate(
        mixed, parent, {}, interval_only, health_ids=OPEN, trained_outcomes=TRAINED
    )
    assert maybe.fit_difference == pytest.approx(0.015)
    assert maybe.fit_ci is not None and maybe.fit_ci[0] <= 0.0 < maybe.fit_ci[1]
    assert maybe.promote
    # The point bound (0.01 by default) convicts what the interval cannot: +0.015 on the very
    # outcomes the update was fitted to; a candidate better on them on average passes.
    bounded = judge_candidate(
        mixed, parent, {}, GateOptions(), health_ids=OPEN, trained_outcomes=TRAINED
    )
    assert not bounded.promote
    assert bounded.reason.startswith(
        "rejected: Brier +0.0150 worse than parent on the 30 questions it was trained on "
        "(bound +0.0100)"
    )
    # Half 0.2 toward the outcome (-0.21 each), half 0.6 away from it (+0.11 each): -0.05.
    closer = _on(
        {q: (abs(y - 0.2),) * 2 if q % 2 else (abs(y - 0.6),) * 2 for q, y in TRAINED.items()}
    )
    assert judge_candidate(
        closer, parent, {}, GateOptions(), health_ids=OPEN, trained_outcomes=TRAINED
    ).promote
    with pytest.raises(ValueError, match="max_trained must be >= 0"):
        GateOptions(max_trained=-1)


def test_both_sides_are_judged_on_as_many_rollouts_of_each_question() -> None:
    """A parent with 8 stored rollouts against a candidate forecast 4 times: the comparison
    takes the parent's first 4. Its last 4 (0.9 on questions that resolved YES) would have
    made the parent 0.16 better on every question and rejected an equal candidate."""
    yes = {q: 1.0 for q in range(12)}
    parent = {q: (0.5,) * 4 + (0.9,) * 4 for q in yes}
    candidate = {q: (0.5,) * 4 for q in yes}
    verdict = judge_candidate(candidate, parent, yes, GateOptions())
    assert verdict.promote, verdict.reason
    assert verdict.brier_difference == 0.0 and verdict.parent.brier == 0.25
    cut_candidate, cut_parent = equal_counts(candidate, parent, list(yes))
    assert cut_parent[0] == (0.5,) * 4 and cut_candidate[0] == (0.5,) * 4
    # Fewer on the parent's side: the candidate's are cut instead; a side with none keeps
    # the other's (a question one side could not forecast at all stays as it was).
    assert equal_counts({0: (0.1, 0.2, 0.3)}, {0: (0.4,)}, [0]) == ({0: (0.1,)}, {0: (0.4,)})
    assert equal_counts({0: ()}, {0: (0.4, 0.5)}, [0]) == ({0: ()}, {0: (0.4, 0.5)})
    trained = judge_candidate(
        candidate, parent, {}, GateOptions(), health_ids=[0], trained_outcomes=yes
    )
    assert trained.promote and trained.fit_difference == 0.0
