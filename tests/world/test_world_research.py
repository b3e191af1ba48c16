"""The research world: question texts state no cue, the evidence does, and the two floors."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections import Counter
from datetime import UTC, datetime

import pytest

from futureworld.agent.tools import InMemoryCorpus
from futureworld.domain import QUANTILE_LEVELS
from futureworld.world import (
    ArticleKind,
    SimChoiceQuestion,
    SimNumericQuestion,
    SimQuestion,
    World,
    WorldConfig,
    research_floors,
    sft_examples,
)
from futureworld.world.config import FIVE_LEVEL_WORDS, cue_phrase, parse_cue_level
from futureworld.world.payloads import (
    article_html,
    full_market,
    kind_market,
    lite_market,
    rss_document,
)
from futureworld.world.reference import kind_research_floors
from futureworld.world.research import (
    LURE_EVENTS,
    choice_informed_probabilities,
    informed_p_yes,
    level_posterior,
    numeric_informed_quantiles,
    numeric_uninformed_quantiles,
    reading_likelihood,
    uninformed_p_yes,
)
from futureworld.world.vocabulary import CHOICE_STRENGTH_WORDS, EVENTS, NUMERIC_MEANS
from storage.engine import session_scope
from storage.repositories.articles import Visibility, insert_articles
from storage.search import ArticleCorpus

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
BASE_URL = "http://127.0.0.1:9"
RESEARCH = WorldConfig(seed=0, research=True)


# -- the posterior, against a slow, obvious enumeration -------------------------------------------


def noisy_readings(level: int, n_levels: int, noise: float) -> list[tuple[int, float]]:
    """The world's noise process spelled out: stay with 1 − ε, else step ±1 (ε/2 each), clip."""
    top = n_levels - 1
    return [
        (level, 1.0 - noise),
        (min(top, max(0, level - 1)), noise / 2.0),
        (min(top, max(0, level + 1)), noise / 2.0),
    ]


def brute_force_p_yes(
    readings: tuple[int, ...], cue_p_yes: tuple[float, ...], noise: float
) -> float | None:
    """Σ_k π(k) Π_i P(r_i | k) p_yes(k) / Σ_k π(k) Π_i P(r_i | k), π uniform, by enumeration;
    None when no level can give the readings."""
    n_levels = len(cue_p_yes)
    numerator = denominator = 0.0
    for level in range(n_levels):
        joint = 1.0 / n_levels
        for reading in readings:
            joint *= sum(p for r, p in noisy_readings(level, n_levels, noise) if r == reading)
        numerator += joint * cue_p_yes[level]
        denominator += joint
    return numerator / denominator if denominator > 0 else None


@pytest.mark.parametrize(
    ("cue_p_yes", "noise"),
    [
        ((0.1, 0.3, 0.5, 0.7, 0.9), 0.3),
        ((0.2, 0.5, 0.8), 0.3),
        ((0.2, 0.5, 0.8), 0.9),
        ((0.25, 0.75), 0.5),
        ((0.05, 0.2, 0.4, 0.6, 0.8, 0.95, 0.97), 0.1),
    ],
)
def test_informed_probability_equals_a_brute_force_enumeration_over_levels(
    cue_p_yes: tuple[float, ...], noise: float
) -> None:
    n_levels = len(cue_p_yes)
    ends = (0, n_levels - 1)
    cases = [(), (0,), (n_levels - 1,), ends, (0, 0), (n_levels - 1,) * 3]
    cases += list(itertools.product(range(n_levels), repeat=2))
    for readings in cases:
        expected = brute_force_p_yes(readings, cue_p_yes, noise)
        if expected is None:
            with pytest.raises(ValueError, match="impossible"):
                informed_p_yes(readings, cue_p_yes=cue_p_yes, evidence_noise=noise)
            continue
        got = informed_p_yes(readings, cue_p_yes=cue_p_yes, evidence_noise=noise)
        assert got == pytest.approx(expected, abs=1e-12), readings


def test_three_level_ladder_posterior_by_hand() -> None:
    # ε = 0.3 on {0.2, 0.5, 0.8}: P(r=0 | k) = (0.85, 0.15, 0) (level 0's down-step clips to 0).
    assert [reading_likelihood(0, k, 3, 0.3) for k in range(3)] == pytest.approx([0.85, 0.15, 0])
    assert [reading_likelihood(2, k, 3, 0.3) for k in range(3)] == pytest.approx([0, 0.15, 0.85])
    assert [reading_likelihood(1, k, 3, 0.3) for k in range(3)] == pytest.approx([0.15, 0.7, 0.15])
    posterior = level_posterior((0, 0), n_levels=3, evidence_noise=0.3)
    weights = (0.85**2, 0.15**2, 0.0)
    assert posterior == pytest.approx(tuple(w / sum(weights) for w in weights))
    p = informed_p_yes((0, 0), cue_p_yes=(0.2, 0.5, 0.8), evidence_noise=0.3)
    assert p == pytest.approx((0.85**2 * 0.2 + 0.15**2 * 0.5) / (0.85**2 + 0.15**2))
    # No readings: the prior mean, the uninformed floor.
    assert informed_p_yes((), cue_p_yes=(0.2, 0.5, 0.8), evidence_noise=0.3) == pytest.approx(0.5)
    assert uninformed_p_yes((0.1, 0.2, 0.9)) == pytest.approx(0.4)


def test_readings_no_level_can_give_are_refused() -> None:
    # Without noise a reading is the level itself: two different readings are impossible.
    with pytest.raises(ValueError, match="impossible"):
        informed_p_yes((0, 2), cue_p_yes=(0.2, 0.5, 0.8), evidence_noise=0.0)
    with pytest.raises(ValueError, match="outside"):
        reading_likelihood(3, 0, 3, 0.3)


def test_the_worlds_readings_follow_the_noise_model_the_posterior_assumes() -> None:
    world = World(RESEARCH)
    counts: Counter[tuple[int, int]] = Counter()
    for day in range(150):
        for question in world.questions_posed_on(day):
            for reading in world.evidence_readings(question.external_id):
                counts[question.cue_level, reading] += 1
    for level in range(RESEARCH.n_levels):
        total = sum(counts[level, r] for r in range(RESEARCH.n_levels))
        assert total > 1000
        for reading in range(RESEARCH.n_levels):
            expected = reading_likelihood(
                reading, level, RESEARCH.n_levels, RESEARCH.evidence_noise
            )
            assert abs(counts[level, reading] / total - expected) < 0.04, (level, reading)


def test_world_informed_probability_is_the_posterior_of_the_readings_its_articles_print() -> None:
    world = World(WorldConfig(seed=4, research=True, cue_p_yes=(0.2, 0.5, 0.8)))
    phrases = {cue_phrase(k, 3): k for k in range(3)}
    for day in range(5):
        for question in world.questions_posed_on(day):
            printed = tuple(
                phrases[re.search(r" as (signal strength \d of 3)\.$", a.summary).group(1)]
                for a in world.articles_published_by(question.created_at)
                if a.question_id == question.external_id and a.kind is ArticleKind.EVIDENCE
            )
            assert printed == world.evidence_readings(question.external_id)
            assert len(printed) == world.config.evidence_articles_per_question
            expected = brute_force_p_yes(printed, (0.2, 0.5, 0.8), world.config.evidence_noise)
            assert world.informed_probability(question.external_id) == pytest.approx(expected)
            assert world.uninformed_probability(question.external_id) == pytest.approx(0.5)


# -- what the question says and what the news says -----------------------------------------------


def questions(world: World, days: range) -> list[SimQuestion]:
    return [q for day in days for q in world.questions_posed_on(day)]


def test_no_research_question_text_or_payload_states_its_cue() -> None:
    world = World(RESEARCH)
    cue_words = re.compile(r"\b(" + "|".join(FIVE_LEVEL_WORDS) + r")\b", re.IGNORECASE)
    for question in questions(world, range(12)):
        now = question.resolve_at
        resolution = world.resolution_as_of(question.external_id, now)
        served = [
            question.title,
            question.description,
            question.slug,
            json.dumps(lite_market(question, None, now=question.created_at, base_url=BASE_URL)),
            json.dumps(full_market(question, resolution, now=now, base_url=BASE_URL)),
            json.dumps(repr(question.to_domain())),
        ]
        for text in served:
            with pytest.raises(ValueError, match="no cue"):
                parse_cue_level(text, RESEARCH.n_levels)
            assert cue_words.search(text) is None, text
    # The same questions with research off state it, so the checks above can fail.
    plain = World(WorldConfig(seed=0))
    for question in questions(plain, range(2)):
        assert parse_cue_level(question.title, 5) == question.cue_level
        assert parse_cue_level(question.description, 5) == question.cue_level


def test_a_research_worlds_crowd_says_nothing_about_the_level() -> None:
    def crowd_by_level(config: WorldConfig) -> list[float]:
        by_level: dict[int, list[float]] = {}
        for question in questions(World(config), range(100)):
            by_level.setdefault(question.cue_level, []).append(question.crowd_probability)
        return [sum(v) / len(v) for _, v in sorted(by_level.items())]

    research = crowd_by_level(RESEARCH)
    assert max(research) - min(research) < 0.03
    assert all(abs(m - 0.5) < 0.02 for m in research)
    plain = crowd_by_level(WorldConfig(seed=0))
    assert plain[-1] - plain[0] > 0.5


def test_every_question_has_its_evidence_before_its_cutoff_naming_its_entity_and_event() -> None:
    world = World(RESEARCH)
    for question in questions(world, range(10)):
        cutoff = question.to_domain().info_cutoff_at
        assert cutoff == question.created_at
        evidence = [
            a
            for a in world.articles_published_by(question.resolve_at)
            if a.question_id == question.external_id and a.kind is ArticleKind.EVIDENCE
        ]
        assert len(evidence) == RESEARCH.evidence_articles_per_question
        visible = {a.guid for a in world.articles_published_by(cutoff)}
        for article in evidence:
            assert article.published_at < cutoff
            assert article.guid in visible
            for text in (article.title, article.summary):
                assert question.entity in text and question.event in text
            assert f"by {question.close_at:%Y-%m-%d}" in article.summary
            assert parse_cue_level(
                f"rate the chance as {cue_phrase(article.cue_reading, 5)}.", 5
            ) == (article.cue_reading)


def test_lures_about_the_same_entity_carry_no_reading_of_the_question() -> None:
    world = World(RESEARCH)
    question_events = {e for events in EVENTS.values() for e in events}
    lure_events = {e for events in LURE_EVENTS.values() for e in events}
    assert not question_events & lure_events
    for question in questions(world, range(10)):
        prefix = f"w0-dx-d{question.day}-q{question.index}-"
        mine = [
            a for a in world.articles_published_by(question.created_at) if a.guid.startswith(prefix)
        ]
        assert len(mine) == RESEARCH.research_lures_per_question
        for lure in mine:
            assert lure.kind is ArticleKind.DISTRACTOR and lure.question_id is None
            assert lure.cue_reading is None and question.event not in lure.summary
            assert question.entity in lure.title and question.entity in lure.summary
            assert lure.published_at < question.created_at
        odds, chatter = sorted(mine, key=lambda a: a.guid)
        assert any(event in odds.title for event in LURE_EVENTS[question.topic])
        with pytest.raises(ValueError):
            parse_cue_level(chatter.summary, 5)


def test_research_world_is_the_plain_world_paired_question_by_question() -> None:
    """Cue levels, dates, outcomes and readings are the plain world's, question by question;
    the subject too where subjects are drawn per question, and a subject of the cycle else."""
    plain = World(WorldConfig(seed=0))
    drawn = World(dataclasses.replace(RESEARCH, research_unique_subjects=False))
    cycled = World(RESEARCH)
    for research in (drawn, cycled):
        pairs = zip(questions(research, range(5)), questions(plain, range(5)), strict=True)
        for r, p in pairs:
            assert (r.external_id, r.cue_level, r.close_at) == (
                p.external_id,
                p.cue_level,
                p.close_at,
            )
            assert research.resolution_as_of(r.external_id, FAR_FUTURE) == (
                plain.resolution_as_of(p.external_id, FAR_FUTURE)
            )
            assert research.evidence_readings(r.external_id) == (
                plain.evidence_readings(p.external_id)
            )
            subject = p.title.rsplit("?", 1)[0].replace(f"{p.entity} {p.event}", "{}")
            assert r.title == subject.format(f"{r.entity} {r.event}") + "?"
            if research is drawn:
                assert (r.entity, r.event) == (p.entity, p.event)
    subjects = [(q.entity, q.event) for q in questions(cycled, range(5))]
    assert subjects != [(q.entity, q.event) for q in questions(drawn, range(5))]


def test_a_research_subject_recurs_only_after_every_subject_was_asked() -> None:
    """The subject cycle: each (entity, its topic's event) once per n_entities × 4 questions,
    so an "<entity> <event>" search shows exactly its question's two evidence articles; with
    subjects drawn per question it often shows another question's on the same subject."""
    config = dataclasses.replace(RESEARCH, n_entities=25, questions_per_day=20)
    world = World(config)
    every = {(e.name, event) for e in world.entities for event in EVENTS[e.topic]}
    assert len(every) == 100
    asked = [(q.entity, q.event) for q in questions(world, range(10))]
    assert len(asked) == 200
    assert set(asked[:100]) == every and set(asked[100:]) == every
    assert asked[:100] != asked[100:]  # each cycle its own order

    def clean_searches(world: World) -> float:
        at = world.day_start(8)
        corpus = InMemoryCorpus(
            dataclasses.replace(a.to_domain(base_url=BASE_URL, fetched_at=a.published_at), id=i)
            for i, a in enumerate(world.articles_published_by(at), start=1)
        )
        asked = [q for q in questions(world, range(1, 7)) if q.created_at <= at]
        clean = 0
        for question in asked:
            found = corpus.search(f"{question.entity} {question.event}", question.created_at, 2)
            clean += all(
                f"{question.entity} will {question.event} by {question.close_at:%Y-%m-%d}"
                in a.summary
                for a in found
            )
        return clean / len(asked)

    wide = dataclasses.replace(RESEARCH, n_entities=150, questions_per_day=40)
    cycled = clean_searches(World(wide))
    drawn = clean_searches(World(dataclasses.replace(wide, research_unique_subjects=False)))
    assert cycled >= 0.95 and drawn <= cycled - 0.05, (cycled, drawn)


def test_search_for_the_entity_and_event_finds_the_evidence_as_of_the_cutoff(engine) -> None:
    world = World(RESEARCH)
    published = world.articles_published_by(world.day_start(7))
    with session_scope(engine) as session:
        insert_articles(
            session,
            [a.to_domain(base_url=BASE_URL, fetched_at=a.published_at) for a in published],
            visibility=Visibility.STATED,
        )
    corpus = ArticleCorpus(engine)
    asked = questions(world, range(4, 6))
    hits = entity_only_first = 0
    for question in asked:
        evidence = {
            a.guid
            for a in world.articles_published_by(question.created_at)
            if a.question_id == question.external_id
        }
        found = corpus.search(f"{question.entity} {question.event}", question.created_at, k=5)
        assert all(a.published_at <= question.created_at for a in found)
        hits += bool(evidence & {a.guid for a in found})
        by_entity = corpus.search(question.entity, question.created_at, k=1)
        entity_only_first += bool(by_entity) and by_entity[0].guid in evidence
    # Measured: 0.96 (Postgres) and 0.98 (SQLite) for entity and event; the entity alone finds
    # the lures and chatter first far more often.
    assert hits / len(asked) >= 0.9
    assert entity_only_first / len(asked) <= 0.5


# -- the floors ------------------------------------------------------------------------------------


def test_informed_floor_is_below_the_uninformed_floor_on_a_panel() -> None:
    world = World(RESEARCH)
    panel = [q.external_id for q in questions(world, range(20))]
    floors = research_floors(world, panel)
    assert 380 <= floors.n_questions <= 400
    assert floors.uninformed_brier == pytest.approx(0.25)
    assert floors.informed_brier < floors.uninformed_brier - 0.04
    # The expected informed Brier with two readings at ε = 0.3 is 0.175 (0.5 − E[q²]).
    assert abs(floors.informed_brier - 0.175) < 0.03
    with pytest.raises(ValueError, match="at least one"):
        research_floors(world, [])


def test_warm_start_data_is_refused_for_a_research_world() -> None:
    with pytest.raises(ValueError, match="research world"):
        sft_examples(World(RESEARCH), 1)


def test_lures_per_question_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="research_lures_per_question"):
        WorldConfig(research=True, research_lures_per_question=-1)


# -- research off: byte-identical to the world before the option ----------------------------------


def served_digest(config: WorldConfig, days: int) -> str:
    """sha256 over every market payload (lite and full, open and resolved) of the questions
    posed in `days` days, the RSS document and every article page of `days` + 8 days."""
    world = World(config)
    digest = hashlib.sha256()
    end = world.day_start(days)
    for now in (end, FAR_FUTURE):
        for question in world.markets_posed_by(end):
            resolution = world.resolution_as_of(question.external_id, now)
            if isinstance(question, SimQuestion):
                payloads = [
                    lite_market(question, resolution, now=now, base_url=BASE_URL),
                    full_market(question, resolution, now=now, base_url=BASE_URL),
                ]
            else:
                payloads = [
                    kind_market(question, resolution, now=now, base_url=BASE_URL, full=full)
                    for full in (False, True)
                ]
            for payload in payloads:
                digest.update(json.dumps(payload, sort_keys=True).encode())
    articles = world.articles_published_by(world.day_start(days + 8))
    digest.update(
        rss_document(
            title="t", link=BASE_URL, description="d", articles=articles, base_url=BASE_URL,
            built_at=end,
        )
    )  # fmt: skip
    for article in articles:
        digest.update(article_html(article))
    return digest.hexdigest()


def test_with_research_off_the_world_is_byte_identical_to_before_the_option() -> None:
    # Digests computed with the code of commit 79583cb, before the research option existed:
    # seed 0, four days of markets (80 binary; with kinds 104 of every kind), payloads open
    # and resolved, and the RSS and HTML of every article of the first twelve days.
    assert served_digest(WorldConfig(seed=0), 4) == (
        "8de45b84087fb0fa976f4911be5e0eea3faeed0a8783c49dee61443953437e05"
    )
    kinds = WorldConfig(seed=0, choice_questions_per_day=3, numeric_questions_per_day=3)
    assert served_digest(kinds, 4) == (
        "479f1aad4cf79e900ad268806c4e0b4283931bfac76700f1ece9c5b1734c2a38"
    )
    assert served_digest(RESEARCH, 4) != served_digest(WorldConfig(seed=0), 4)


def test_entity_names_never_contain_a_cue_word() -> None:
    # A cue word inside a name would make the text checks above meaningless.
    world = World(WorldConfig(n_entities=150))
    words = {w for name in (e.name for e in world.entities) for w in name.lower().split()}
    assert len(world.entities) == 150
    assert not words & {w for phrase in FIVE_LEVEL_WORDS for w in phrase.split()}


# -- choice and numeric questions -----------------------------------------------------------------

KIND_RESEARCH = WorldConfig(
    seed=0, research=True, questions_per_day=4, choice_questions_per_day=4,
    numeric_questions_per_day=4,
)  # fmt: skip


def brute_force_choice(named: tuple[int, ...], k: int, p_fav: float, noise: float) -> list[float]:
    """Σ_f π(f) Π_i P(n_i | f) p_f(j), normalised, with the naming process spelled out."""

    def p_named(n: int, f: int) -> float:
        # Keep the favourite with 1 − ε; else pick one of the other k − 1 uniformly.
        return (1.0 - noise) * (n == f) + noise * sum(
            1.0 / (k - 1) for o in range(k) if o != f and o == n
        )

    joint = [1.0 / k * math.prod(p_named(n, f) for n in named) for f in range(k)]
    return [
        sum(joint[f] * (p_fav if j == f else (1.0 - p_fav) / (k - 1)) for f in range(k))
        / sum(joint)
        for j in range(k)
    ]


def test_choice_informed_probabilities_equal_a_brute_force_enumeration() -> None:
    for k, p_fav, noise in ((4, 0.7, 0.3), (2, 0.55, 0.3), (3, 0.85, 0.9), (6, 0.4, 0.0)):
        for named in [(), (0,), (k - 1, k - 1), (0, 1), *itertools.product(range(k), repeat=2)]:
            if noise == 0.0 and len(set(named)) > 1:
                with pytest.raises(ValueError, match="impossible"):
                    choice_informed_probabilities(
                        named, n_options=k, favourite_p=p_fav, evidence_noise=noise
                    )
                continue
            got = choice_informed_probabilities(
                named, n_options=k, favourite_p=p_fav, evidence_noise=noise
            )
            assert got == pytest.approx(brute_force_choice(named, k, p_fav, noise), abs=1e-12)
            assert sum(got) == pytest.approx(1.0)


def slow_reading_likelihood(reading: int, mean: float, sigma: float) -> float:
    """∫ over [r − ½, r + ½] of the N(μ, (σ/2)²) density, by Simpson's rule."""
    sd, n = sigma / 2.0, 400
    xs = [reading - 0.5 + i / n for i in range(n + 1)]
    f = [math.exp(-(((x - mean) / sd) ** 2) / 2.0) / (sd * math.sqrt(2.0 * math.pi)) for x in xs]
    return (1.0 / n / 3.0) * sum(
        v * (1 if i in (0, n) else 4 if i % 2 else 2) for i, v in enumerate(f)
    )


def mixture_cdf(x: float, weights: list[float], sigma: float) -> float:
    """Σ_μ w_μ Φ((x − μ)/σ) / Σ_μ w_μ, with Φ from the error function."""
    total = sum(weights)
    return sum(
        w / total * 0.5 * (1.0 + math.erf((x - mu) / (sigma * math.sqrt(2.0))))
        for w, mu in zip(weights, NUMERIC_MEANS, strict=True)
    )


def test_numeric_informed_quantiles_are_the_posterior_mixtures_quantiles() -> None:
    levels = (0.05, 0.25, 0.5, 0.75, 0.95)
    for sigma, readings in ((10.0, (96, 101)), (20.0, (30,)), (20.0, (150, 171, 160)), (10.0, ())):
        weights = [
            math.prod(slow_reading_likelihood(r, mu, sigma) for r in readings)
            for mu in NUMERIC_MEANS
        ]
        quantiles = numeric_informed_quantiles(readings, sigma=sigma, levels=levels)
        assert list(quantiles) == sorted(quantiles)
        for level, q in zip(levels, quantiles, strict=True):
            assert 0.0 < q < 200.0
            assert mixture_cdf(q, weights, sigma) == pytest.approx(level, abs=1e-4), (
                sigma,
                readings,
                level,
            )
    assert numeric_uninformed_quantiles((10.0, 20.0), (0.5,)) == pytest.approx((100.0,))


def test_numeric_informed_quantiles_are_calibrated_on_the_worlds_outcomes() -> None:
    world = World(KIND_RESEARCH)
    below: Counter[float] = Counter()
    n = 0
    for day in range(150):
        for question in world.kind_questions_posed_on(day):
            if not isinstance(question, SimNumericQuestion):
                continue
            outcome = world.resolution_as_of(question.external_id, FAR_FUTURE).value
            if outcome is None:
                continue
            n += 1
            for level, q in zip(
                QUANTILE_LEVELS, world.informed_forecast(question.external_id), strict=True
            ):
                below[level] += outcome <= q
    assert n > 500
    for level in QUANTILE_LEVELS:
        assert abs(below[level] / n - level) < 0.04, level


def test_no_research_choice_or_numeric_text_or_payload_states_its_cue() -> None:
    world = World(KIND_RESEARCH)
    cue = re.compile(r"favourite|expect about|give or take|" + "|".join(CHOICE_STRENGTH_WORDS))
    for day in range(8):
        for question in world.kind_questions_posed_on(day):
            resolution = world.resolution_as_of(question.external_id, FAR_FUTURE)
            texts = [question.title, question.description, repr(question.to_domain())]
            for full in (False, True):
                payload = kind_market(
                    question, resolution, now=FAR_FUTURE, base_url=BASE_URL, full=full
                )
                texts.append(json.dumps(payload))
            for text in texts:
                assert cue.search(text) is None, text
    plain = World(dataclasses.replace(KIND_RESEARCH, research=False))
    assert all(cue.search(q.title) for q in plain.kind_questions_posed_on(0))


def test_research_kind_crowds_say_nothing_about_the_truth() -> None:
    world = World(KIND_RESEARCH)
    favourite_crowd, numeric_error, numeric_spread = [], [], []
    for day in range(100):
        for q in world.kind_questions_posed_on(day):
            if isinstance(q, SimChoiceQuestion):
                favourite_crowd.append(q.crowd_probabilities[q.favourite] - 1.0 / len(q.options))
            else:
                numeric_error.append(q.crowd_value - 100.0)
                numeric_spread.append(q.mean - 100.0)
    assert abs(sum(favourite_crowd) / len(favourite_crowd)) < 0.02
    assert abs(sum(numeric_error) / len(numeric_error)) < 2.0
    # The crowd no longer follows μ: no correlation between the crowd's value and μ.
    covariance = sum(a * b for a, b in zip(numeric_error, numeric_spread, strict=True))
    assert abs(covariance / len(numeric_error)) < 60.0


def test_kind_evidence_precedes_the_cutoff_and_names_the_entities_among_lures() -> None:
    world = World(KIND_RESEARCH)
    for day in range(8):
        for question in world.kind_questions_posed_on(day):
            cutoff = question.to_domain().info_cutoff_at
            visible = world.articles_published_by(cutoff)
            evidence = [a for a in visible if a.question_id == question.external_id]
            assert len(evidence) == KIND_RESEARCH.evidence_articles_per_question
            assert tuple(a.cue_reading for a in evidence) == world.evidence_readings(
                question.external_id
            )
            key = f"d{day}-{question.external_id[-2:]}"
            lures = [a for a in visible if a.guid.startswith(f"w0-dx-{key}-")]
            assert len(lures) == KIND_RESEARCH.research_lures_per_question
            if isinstance(question, SimChoiceQuestion):
                strength = CHOICE_STRENGTH_WORDS[question.strength]
                for article in evidence:
                    named = question.options[article.cue_reading]
                    assert f"a {strength} favourite in {named} to {question.event}" in article.title
                    assert all(option in article.summary for option in question.options)
                names = question.options
            else:
                for article in evidence:
                    assert question.entity in article.title and question.quantity in article.title
                    assert f"about {article.cue_reading} {question.quantity}" in article.summary
                    assert f"give or take {question.sigma:g}" in article.summary
                names = (question.entity,)
            for article in evidence + lures:
                assert article.published_at < cutoff
            for lure in lures:
                assert lure.question_id is None and lure.cue_reading is None
                assert any(name in lure.title for name in names)


def test_kind_informed_floors_are_below_their_uninformed_floors() -> None:
    world = World(KIND_RESEARCH)
    ids = [q.external_id for day in range(60) for q in world.kind_questions_posed_on(day)]
    floors = kind_research_floors(world, ids)
    assert floors.n_choice > 200 and floors.n_numeric > 200
    assert floors.choice_uninformed_brier == pytest.approx(0.75)
    assert floors.choice_informed_brier < floors.choice_uninformed_brier - 0.05
    assert floors.numeric_informed_crps < 0.6 * floors.numeric_uninformed_crps
    with pytest.raises(ValueError, match="binary"):
        kind_research_floors(world, [world.questions_posed_on(0)[0].external_id])
    with pytest.raises(KeyError, match="binary"):
        world.informed_forecast(world.questions_posed_on(0)[0].external_id)
