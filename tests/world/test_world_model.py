"""The simulated world's generator: determinism, balance, calibration and no leakage."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from futureworld.world import ArticleKind, MarketResolution, SimClock, World, WorldConfig
from futureworld.world.config import cue_phrase, parse_cue_level

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def snapshot(world: World, days: range) -> str:
    """Everything the world holds for `days`, as one string, outcomes included."""
    lines = []
    for day in days:
        for question in world.questions_posed_on(day):
            lines.append(repr(question))
            lines.append(repr(world.resolution_as_of(question.external_id, FAR_FUTURE)))
    last = world.day_start(days.stop)
    lines.extend(repr(article) for article in world.articles_published_by(last))
    return "\n".join(lines)


def test_same_seed_gives_byte_identical_questions_articles_and_outcomes() -> None:
    config = WorldConfig(seed=7, questions_per_day=10)
    first = World(config)
    second = World(config)
    # Access in a different order: generation must not depend on it.
    second.questions_posed_on(6)
    second.articles_published_by(second.day_start(3))
    assert snapshot(first, range(8)).encode() == snapshot(second, range(8)).encode()


def test_different_seeds_give_different_worlds() -> None:
    one = snapshot(World(WorldConfig(seed=1, questions_per_day=10)), range(3))
    two = snapshot(World(WorldConfig(seed=2, questions_per_day=10)), range(3))
    assert one != two


def test_cue_levels_are_balanced_and_horizons_stay_in_range() -> None:
    config = WorldConfig(questions_per_day=7, min_horizon_days=2, max_horizon_days=5)
    world = World(config)
    questions = [q for day in range(20) for q in world.questions_posed_on(day)]
    counts = Counter(q.cue_level for q in questions)
    assert sorted(counts) == list(range(config.n_levels))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert {q.horizon_days for q in questions} == {2, 3, 4, 5}
    for q in questions:
        assert q.close_at - q.created_at == timedelta(days=q.horizon_days)
        assert q.resolve_at - q.close_at == timedelta(hours=config.resolution_delay_hours)
        assert world.day_of(q.created_at) == q.day


def test_question_text_states_its_true_probability_in_a_few_words() -> None:
    config = WorldConfig()
    world = World(config)
    for question in world.questions_posed_on(3):
        level = parse_cue_level(question.title, config.n_levels)
        assert level == question.cue_level
        assert world.true_probability(question.external_id) == config.cue_p_yes[level]
        assert len(question.title.split()) <= 25


def test_outcome_frequencies_match_the_true_probabilities() -> None:
    config = WorldConfig(seed=11, questions_per_day=50, cancel_rate=0.05)
    world = World(config)
    by_level: dict[float, list[float]] = {p: [] for p in config.cue_p_yes}
    cancelled = total = 0
    for day in range(100):
        for question in world.questions_posed_on(day):
            resolution = world.resolution_as_of(question.external_id, FAR_FUTURE)
            assert resolution is not None
            total += 1
            if resolution.resolution is MarketResolution.CANCEL:
                cancelled += 1
                assert resolution.value is None
            else:
                by_level[question.p_yes].append(resolution.value)
    for p_yes, values in by_level.items():
        assert len(values) > 800
        frequency = sum(values) / len(values)
        standard_error = math.sqrt(p_yes * (1 - p_yes) / len(values))
        assert abs(frequency - p_yes) < 4 * standard_error, (p_yes, frequency)
    assert abs(cancelled / total - 0.05) < 4 * math.sqrt(0.05 * 0.95 / total)


def test_no_outcome_is_visible_before_its_resolution_time() -> None:
    world = World(WorldConfig(seed=3, questions_per_day=15))
    for question in [q for day in range(4) for q in world.questions_posed_on(day)]:
        just_before = question.resolve_at - timedelta(seconds=1)
        assert world.resolution_as_of(question.external_id, just_before) is None
        reports = [
            a
            for a in world.articles_published_by(just_before, question.topic)
            if a.kind is ArticleKind.REPORT and a.question_id == question.external_id
        ]
        assert reports == []
        resolution = world.resolution_as_of(question.external_id, question.resolve_at)
        assert resolution is not None and resolution.resolved_at == question.resolve_at


def test_redrawn_outcomes_change_nothing_published_before_each_resolution() -> None:
    base = WorldConfig(seed=5, questions_per_day=20)
    world_a = World(WorldConfig(seed=5, questions_per_day=20, outcome_seed=100))
    world_b = World(WorldConfig(seed=5, questions_per_day=20, outcome_seed=200))
    ids = [q.external_id for day in range(6) for q in world_a.questions_posed_on(day)]
    differing = [
        i
        for i in ids
        if world_a.resolution_as_of(i, FAR_FUTURE).resolution
        != world_b.resolution_as_of(i, FAR_FUTURE).resolution
    ]
    assert len(differing) > 10
    for hours in range(0, 6 * 24, 7):
        at = base.start_at + timedelta(hours=hours)
        assert world_a.questions_posed_by(at) == world_b.questions_posed_by(at)
        articles_a = world_a.articles_published_by(at)
        articles_b = world_b.articles_published_by(at)
        assert [a.guid for a in articles_a] == [a.guid for a in articles_b]
        for a, b in zip(articles_a, articles_b, strict=True):
            if a.kind is ArticleKind.REPORT:
                assert world_a.question(a.question_id).resolve_at <= at
            else:
                assert a == b


def test_evidence_precedes_its_question_and_reports_the_cue_up_to_noise() -> None:
    exact = World(WorldConfig(seed=2, evidence_noise=0.0))
    for question in exact.questions_posed_on(4):
        evidence = [
            a
            for a in exact.articles_published_by(question.created_at)
            if a.question_id == question.external_id
        ]
        assert len(evidence) == exact.config.evidence_articles_per_question
        for article in evidence:
            assert article.kind is ArticleKind.EVIDENCE
            assert article.published_at < question.created_at
            assert f"as {cue_phrase(question.cue_level, 5)}." in article.summary

    noisy = World(WorldConfig(seed=2, evidence_noise=0.5, questions_per_day=40))
    agree = total = 0
    for question in [q for day in range(10) for q in noisy.questions_posed_on(day)]:
        if question.cue_level in (0, 4):
            continue  # at the ends a clipped neighbour can equal the truth
        for article in noisy.articles_published_by(question.created_at, question.topic):
            if article.question_id == question.external_id:
                total += 1
                agree += f"as {cue_phrase(question.cue_level, 5)}." in article.summary
    assert abs(agree / total - 0.5) < 0.06


def test_distractors_carry_no_cue_and_follow_the_distractor_rate() -> None:
    config = WorldConfig(seed=4, distractor_rate=0.25, publish_resolution_reports=False)
    world = World(config)
    day_end = world.day_start(5)
    kinds = Counter(
        a.kind for a in world.articles_published_by(day_end) if world.day_of(a.published_at) >= 1
    )
    assert kinds[ArticleKind.REPORT] == 0
    rate = kinds[ArticleKind.DISTRACTOR] / sum(kinds.values())
    assert abs(rate - 0.25) < 0.05
    for article in world.articles_published_by(day_end):
        if article.kind is ArticleKind.DISTRACTOR:
            assert "rate the chance" not in article.summary


def test_other_ladders_use_signal_strength_phrases() -> None:
    config = WorldConfig(cue_p_yes=(0.2, 0.5, 0.8))
    world = World(config)
    titles = [q.title for q in world.questions_posed_on(0)]
    assert any("Analysts rate the chance as signal strength 3 of 3." in t for t in titles)
    assert all(parse_cue_level(t, 3) in (0, 1, 2) for t in titles)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"start_at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"min_horizon_days": 0}, "min_horizon_days"),
        ({"min_horizon_days": 5, "max_horizon_days": 3}, "max_horizon_days"),
        ({"cue_p_yes": (0.5, 0.3)}, "strictly increasing"),
        ({"cue_p_yes": (0.0, 0.5)}, "inside"),
        ({"evidence_noise": 1.5}, "evidence_noise"),
        ({"distractor_rate": 1.0}, "distractor_rate"),
        ({"n_entities": 0}, "n_entities"),
        ({"seed": -1}, "seeds"),
    ],
)
def test_world_config_rejects_bad_values_by_name(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorldConfig(**changes)


def test_unknown_ids_raise_key_errors_naming_them() -> None:
    world = World(WorldConfig(seed=0, questions_per_day=5))
    with pytest.raises(KeyError, match="w0d1q9"):
        world.question("w0d1q9")
    with pytest.raises(KeyError, match="w1d1q1"):
        world.question("w1d1q1")  # another seed's id
    with pytest.raises(KeyError, match="nonsense"):
        world.article("nonsense")
    with pytest.raises(ValueError, match="no cue"):
        parse_cue_level("Will it rain?", 5)


def test_sim_clock_sets_and_advances_in_utc_and_refuses_bad_input() -> None:
    clock = SimClock(datetime(2026, 1, 1, tzinfo=UTC))
    assert clock.advance(days=1, hours=6) == datetime(2026, 1, 2, 6, tzinfo=UTC)
    assert clock.advance(timedelta(minutes=30)) == clock()
    assert clock.now() == datetime(2026, 1, 2, 6, 30, tzinfo=UTC)
    assert clock.set(datetime(2025, 12, 31, tzinfo=UTC)).year == 2025
    with pytest.raises(ValueError, match="forward"):
        clock.advance(hours=-1)
    with pytest.raises(ValueError, match="naive"):
        clock.set(datetime(2026, 1, 1))
