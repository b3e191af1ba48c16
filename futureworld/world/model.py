"""The simulated world: seeded entities, daily news, forecasting questions and their outcomes.

Owns generation and time-gated lookup; serving over HTTP lives in server.py, the cue ladder
and configuration in config.py. Nothing here does I/O.

Latent process. Each simulated day d at `pose_hour` UTC the world poses `questions_per_day`
binary questions "Will <entity> <event> by <date>? Analysts rate the chance as <cue>." Each has
a latent cue level k (balanced across levels: level = (d·Q + i) mod K, shuffled within the
day), a horizon h ~ U{min..max} days, close = posed + h days, resolution = close + delay. The
outcome is y ~ Bernoulli(cue_p_yes[k]) (or CANCEL with `cancel_rate`), drawn from a separate
random stream (`outcome_seed`) so nothing published before the resolution depends on it.

True probability. Articles carry only noisy readings of k, and the title states k exactly,
so P(y = 1 | everything public at the cut-off) = cue_p_yes[k]: the stated true probability.

News. Per question, `evidence_articles_per_question` articles published uniformly in the
`evidence_lead_hours` before it is posed, each reporting the true level with probability
1 − `evidence_noise` and otherwise a neighbouring level. Distractors (`distractor_rate` of the
day's articles) are cue-free chatter about the same entities. At each resolution a report
article states the outcome (`publish_resolution_reports`) — only visible from then on.

Determinism. Every draw comes from `random.Random(str)` streams keyed by (seed, day, index),
so the same config gives byte-identical output in any process, in any order of access.

Research world (`research=True`, research.py). Titles and descriptions drop the cue sentence
and the crowd probability is centred on the ladder's prior mean, so a question's text and
market carry nothing about k; the evidence articles (unchanged, and carrying the question's
entity name and event words, so a search for them finds them) are all a forecaster can learn
k from, and `research_lures_per_question` lures about the same entity (odds on a rival event
no question asks about, and chatter) share their window. P(y = 1 | public) is then the
posterior `informed_probability`, below which no forecaster's expected Brier can go; p_yes
stays the latent cue_p_yes[k] the outcome is drawn from. Entities, cue levels, evidence and
outcomes are the same as with research off for the same seed (the lures draw from a stream of
their own), so the two worlds are paired question by question. Choice and numeric questions
do the same (kinds.py): `informed_forecast` / `uninformed_forecast` are their two floors.

Other kinds. With `choice_questions_per_day` or `numeric_questions_per_day` > 0 the world also
poses multiple-choice and numeric questions (kinds.py; ids w<seed>d<day>c<i> and …n<i>),
a minute apart after the day's binary questions, with their own streams, evidence and reports.
`questions_posed_on`/`questions_posed_by` stay binary-only (the reference forecaster and the
demo's panel are binary-only); `markets_posed_by` lists every kind, as the market API does.
"""

from __future__ import annotations

import math
import random
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from futureworld.domain import QUANTILE_LEVELS, Article, Question, QuestionKind, require_utc
from futureworld.world.config import WorldConfig, cue_phrase, cue_sentence
from futureworld.world.kinds import (
    KindResolution,
    KindTiming,
    SimChoiceQuestion,
    SimKindQuestion,
    SimNumericQuestion,
    draw_kind_resolution,
    kind_evidence_texts,
    kind_report_texts,
    make_choice_question,
    make_numeric_question,
)
from futureworld.world.research import (
    choice_informed_probabilities,
    informed_p_yes,
    lure_texts,
    numeric_informed_quantiles,
    numeric_uninformed_quantiles,
    uninformed_p_yes,
)
from futureworld.world.vocabulary import (
    DISTRACTOR_EVENTS,
    EVENTS,
    EVIDENCE_SOURCES,
    Entity,
    Topic,
    build_entities,
)

CREATOR_USERNAME = "simworld"
_ID_PATTERN = re.compile(r"^w(\d+)d(\d+)([qcn])(\d+)$")


class MarketResolution(StrEnum):
    """Manifold's binary resolutions; the world produces YES, NO and CANCEL."""

    YES = "YES"
    NO = "NO"
    CANCEL = "CANCEL"
    MKT = "MKT"


class ArticleKind(StrEnum):
    EVIDENCE = "evidence"
    """A noisy reading of one question's cue level, published before the question."""
    DISTRACTOR = "distractor"
    """Chatter about an entity that carries no reading of any question (in a research world
    also a lure: odds on a rival event no question asks about)."""
    REPORT = "report"
    """The outcome of one question, published at its resolution."""


@dataclass(frozen=True, kw_only=True)
class SimQuestion:
    """A posed question as the public sees it: no outcome, only the stated true probability."""

    external_id: str
    day: int
    index: int
    entity: str
    topic: Topic
    event: str
    cue_level: int
    p_yes: float
    """cue_p_yes of its level, the outcome's probability: also the true probability given the
    information public before resolution, except in a research world (informed_probability)."""
    title: str
    description: str
    slug: str
    horizon_days: int
    created_at: datetime
    close_at: datetime
    resolve_at: datetime
    crowd_probability: float
    """The market's noisy crowd P(yes): sigmoid(logit(p_yes) + N(0, crowd_noise_logit²))."""

    def to_domain(
        self, *, source: str = "manifold", url: str = "", info_cutoff_at: datetime | None = None
    ) -> Question:
        """The domain Question a harvest of this market yields (cut-off defaults to posing)."""
        return Question(
            source=source,
            external_id=self.external_id,
            kind=QuestionKind.BINARY,
            title=self.title,
            background=self.description,
            resolution_criteria=self.description,
            url=url,
            domain=self.topic.value,
            created_at=self.created_at,
            info_cutoff_at=info_cutoff_at or self.created_at,
            close_at=self.close_at,
            resolve_by=self.resolve_at,
            crowd_probability=self.crowd_probability,
            extra={"group_slugs": [self.topic.value]},
        )


@dataclass(frozen=True, kw_only=True)
class SimArticle:
    guid: str
    kind: ArticleKind
    topic: Topic
    title: str
    summary: str
    body: str
    published_at: datetime
    question_id: str | None = None
    """The question this article is evidence for or reports on; None for distractors."""
    cue_reading: int | None = None
    """The cue level an evidence article reports (0-based); None for every other article."""

    @property
    def path(self) -> str:
        return f"/articles/{self.guid}"

    def to_domain(self, *, base_url: str, fetched_at: datetime) -> Article:
        return Article(
            feed=f"{base_url.rstrip('/')}/feeds/{self.topic.value}.xml",
            guid=self.guid,
            link=f"{base_url.rstrip('/')}{self.path}",
            title=self.title,
            summary=self.summary,
            body=self.body,
            published_at=self.published_at,
            fetched_at=fetched_at,
        )


@dataclass(frozen=True, kw_only=True)
class Resolution:
    external_id: str
    resolution: MarketResolution
    resolved_at: datetime

    @property
    def value(self) -> float | None:
        """1.0 for YES, 0.0 for NO, None for an annulment."""
        return {MarketResolution.YES: 1.0, MarketResolution.NO: 0.0}.get(self.resolution)


@dataclass(frozen=True)
class _Day:
    questions: tuple[SimQuestion, ...]
    articles: tuple[SimArticle, ...]
    resolutions: dict[str, Resolution | KindResolution] = field(repr=False)
    """Private: handed out only through World.resolution_as_of, after resolve_at."""
    kind_questions: tuple[SimKindQuestion, ...] = ()
    """Choice then numeric questions, when the config asks for them."""


class World:
    """A lazily generated, cached, thread-safe seeded world; see the module docstring."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = config or WorldConfig()
        self.entities: tuple[Entity, ...] = build_entities(self.config.seed, self.config.n_entities)
        self._days: dict[int, _Day] = {}
        self._lock = threading.Lock()

    # -- time ---------------------------------------------------------------------------------

    def day_start(self, day: int) -> datetime:
        return self.config.start_at + timedelta(days=day)

    def day_of(self, at: datetime) -> int:
        """The simulated day `at` falls in (negative before day 0)."""
        at = require_utc(at, "at")
        return math.floor((at - self.config.start_at) / timedelta(days=1))

    # -- public, time-gated views ---------------------------------------------------------------

    def questions_posed_on(self, day: int) -> tuple[SimQuestion, ...]:
        return self._day(day).questions if day >= 0 else ()

    def questions_posed_by(self, at: datetime) -> list[SimQuestion]:
        """Every question with created_at ≤ at, oldest first."""
        at = require_utc(at, "at")
        found = [
            q
            for day in range(self.day_of(at) + 1)
            for q in self.questions_posed_on(day)
            if q.created_at <= at
        ]
        return sorted(found, key=lambda q: (q.created_at, q.external_id))

    def kind_questions_posed_on(self, day: int) -> tuple[SimKindQuestion, ...]:
        """The day's choice and numeric questions (empty unless the config asks for them)."""
        return self._day(day).kind_questions if day >= 0 else ()

    def markets_posed_by(self, at: datetime) -> list[SimQuestion | SimKindQuestion]:
        """Every question of every kind with created_at ≤ at, oldest first."""
        at = require_utc(at, "at")
        found: list[SimQuestion | SimKindQuestion] = [
            q
            for day in range(self.day_of(at) + 1)
            for q in (*self.questions_posed_on(day), *self.kind_questions_posed_on(day))
            if q.created_at <= at
        ]
        return sorted(found, key=lambda q: (q.created_at, q.external_id))

    def articles_published_by(self, at: datetime, topic: Topic | None = None) -> list[SimArticle]:
        """Every article with published_at ≤ at (optionally of one topic), oldest first."""
        at = require_utc(at, "at")
        lead = timedelta(hours=self.config.evidence_lead_hours)
        found = [
            a
            for day in range(self.day_of(at + lead) + 1)
            for a in self._day(day).articles
            if a.published_at <= at and (topic is None or a.topic is topic)
        ]
        return sorted(found, key=lambda a: (a.published_at, a.guid))

    def question(self, external_id: str) -> SimQuestion:
        """The binary question with this id, posed or not; KeyError naming the id if none."""
        found = self.market(external_id)
        if not isinstance(found, SimQuestion):
            raise KeyError(f"world question {external_id!r} is not a binary question")
        return found

    def market(self, external_id: str) -> SimQuestion | SimKindQuestion:
        """The question of any kind with this id, posed or not; KeyError naming the id."""
        day, letter, index = self._parse_id(external_id)
        if letter == "q":
            questions: tuple[SimQuestion | SimKindQuestion, ...] = self.questions_posed_on(day)
        else:
            kind = SimChoiceQuestion if letter == "c" else SimNumericQuestion
            questions = tuple(q for q in self.kind_questions_posed_on(day) if isinstance(q, kind))
        if index >= len(questions):
            raise KeyError(f"world seed {self.config.seed} has no question {external_id!r}")
        return questions[index]

    def article(self, guid: str) -> SimArticle:
        """The article with this guid (its day is part of the guid); KeyError if none."""
        match = re.match(r"^w\d+-(?:ev|dx|rp)-d(\d+)-", guid)
        if match is not None:
            for candidate in self._day(int(match.group(1))).articles:
                if candidate.guid == guid:
                    return candidate
        raise KeyError(f"world seed {self.config.seed} has no article {guid!r}")

    def true_probability(self, external_id: str) -> float:
        return self.question(external_id).p_yes

    def evidence_readings(self, external_id: str) -> tuple[int, ...]:
        """What the question's evidence articles visible at its cut-off (its created_at) report,
        oldest first: cue levels (binary), option indices (choice) or numbers (numeric)."""
        question = self.market(external_id)
        return tuple(
            a.cue_reading
            for a in sorted(self._day(question.day).articles, key=lambda a: a.published_at)
            if a.question_id == external_id
            and a.cue_reading is not None
            and a.published_at <= question.created_at
        )

    def informed_probability(self, external_id: str) -> float:
        """P(yes | the readings of the evidence visible at the question's cut-off), exact under
        the uniform level prior and the world's noise model (research.py): the forecast of an
        agent that finds and reads all of it. In a research world the best public forecast."""
        cfg = self.config
        return informed_p_yes(
            self.evidence_readings(external_id),
            cue_p_yes=cfg.cue_p_yes,
            evidence_noise=cfg.evidence_noise,
        )

    def uninformed_probability(self, external_id: str) -> float:
        """The ladder's prior mean of P(yes) (the same for every binary question, named by id so
        it reads like informed_probability): the forecast of an agent that never searches."""
        self.question(external_id)
        return uninformed_p_yes(self.config.cue_p_yes)

    def informed_forecast(
        self, external_id: str, levels: tuple[float, ...] = QUANTILE_LEVELS
    ) -> tuple[float, ...]:
        """A choice or numeric question's forecast given its evidence visible at its cut-off
        (research.py): the probability of each option, or the outcome's quantiles at `levels`.
        In a research world the best public forecast, as informed_probability is for binary."""
        question = self.market(external_id)
        readings = self.evidence_readings(external_id)
        if isinstance(question, SimChoiceQuestion):
            return choice_informed_probabilities(
                readings,
                n_options=len(question.options),
                favourite_p=self.config.choice_favourite_p[question.strength],
                evidence_noise=self.config.evidence_noise,
            )
        if isinstance(question, SimNumericQuestion):
            return numeric_informed_quantiles(readings, sigma=question.sigma, levels=levels)
        raise KeyError(f"world question {external_id!r} is binary: use informed_probability")

    def uninformed_forecast(
        self, external_id: str, levels: tuple[float, ...] = QUANTILE_LEVELS
    ) -> tuple[float, ...]:
        """The prior forecast of a choice (1/k each) or numeric (quantiles at `levels`) question:
        what an agent that never searches can say."""
        question = self.market(external_id)
        if isinstance(question, SimChoiceQuestion):
            return tuple(1.0 / len(question.options) for _ in question.options)
        if isinstance(question, SimNumericQuestion):
            return numeric_uninformed_quantiles(self.config.numeric_sigmas, levels)
        raise KeyError(f"world question {external_id!r} is binary: use uninformed_probability")

    def resolution_as_of(
        self, external_id: str, at: datetime
    ) -> Resolution | KindResolution | None:
        """The question's resolution if it has happened by `at`, else None (any kind; a
        binary question's is a Resolution)."""
        at = require_utc(at, "at")
        question = self.market(external_id)
        if at < question.resolve_at:
            return None
        return self._day(question.day).resolutions[external_id]

    # -- generation -----------------------------------------------------------------------------

    def _parse_id(self, external_id: str) -> tuple[int, str, int]:
        match = _ID_PATTERN.match(external_id)
        if match is None or int(match.group(1)) != self.config.seed:
            raise KeyError(f"world seed {self.config.seed} has no question {external_id!r}")
        return int(match.group(2)), match.group(3), int(match.group(4))

    def _day(self, day: int) -> _Day:
        with self._lock:
            cached = self._days.get(day)
            if cached is None:
                cached = self._days[day] = self._generate_day(day)
            return cached

    def _generate_day(self, day: int) -> _Day:
        cfg = self.config
        n_per_day = cfg.questions_per_day
        levels = [(day * n_per_day + i) % cfg.n_levels for i in range(n_per_day)]
        random.Random(f"{cfg.seed}:cues:{day}").shuffle(levels)
        questions: list[SimQuestion] = []
        articles: list[SimArticle] = []
        resolutions: dict[str, Resolution] = {}
        for index, level in enumerate(levels):
            rng = random.Random(f"{cfg.seed}:question:{day}:{index}")
            question = self._make_question(rng, day, index, level)
            questions.append(question)
            articles.extend(self._make_evidence(rng, question))
            if cfg.research:
                key = f"d{question.day}-q{question.index}"
                articles.extend(self._make_lures(key, (question.entity,), question))
            resolution = self._draw_resolution(question)
            resolutions[question.external_id] = resolution
            if cfg.publish_resolution_reports:
                articles.append(self._make_report(question, resolution))
        articles.extend(self._make_distractors(day))
        kind_questions = self._make_kind_questions(day)
        for question in kind_questions:
            resolution = draw_kind_resolution(
                question, outcome_seed=cfg.effective_outcome_seed, cancel_rate=cfg.cancel_rate
            )
            resolutions[question.external_id] = resolution
            articles.extend(self._make_kind_articles(question, resolution))
        return _Day(tuple(questions), tuple(articles), resolutions, kind_questions)

    def _make_kind_questions(self, day: int) -> tuple[SimKindQuestion, ...]:
        cfg = self.config
        made: list[SimKindQuestion] = []
        for letter, count in (
            ("c", cfg.choice_questions_per_day),
            ("n", cfg.numeric_questions_per_day),
        ):
            for index in range(count):
                rng = random.Random(f"{cfg.seed}:question-{letter}:{day}:{index}")
                timing = KindTiming(
                    seed=cfg.seed,
                    day=day,
                    index=index,
                    created_at=self.day_start(day)
                    + timedelta(hours=cfg.pose_hour, minutes=cfg.questions_per_day + len(made)),
                    horizon_days=rng.randint(cfg.min_horizon_days, cfg.max_horizon_days),
                    resolution_delay_hours=cfg.resolution_delay_hours,
                )
                if letter == "c":
                    made.append(
                        make_choice_question(
                            rng,
                            timing,
                            self.entities,
                            n_options=cfg.choice_options,
                            favourite_p=cfg.choice_favourite_p,
                            crowd_noise_logit=cfg.crowd_noise_logit,
                            research=cfg.research,
                        )
                    )
                else:
                    made.append(
                        make_numeric_question(
                            rng,
                            timing,
                            self.entities,
                            sigmas=cfg.numeric_sigmas,
                            research=cfg.research,
                        )
                    )
        return tuple(made)

    def _make_kind_articles(
        self, question: SimKindQuestion, resolution: KindResolution
    ) -> list[SimArticle]:
        cfg = self.config
        letter = "c" if isinstance(question, SimChoiceQuestion) else "n"
        key = f"d{question.day}-{letter}{question.index}"
        rng = random.Random(f"{cfg.seed}:evidence-{key}")
        articles = []
        for j in range(cfg.evidence_articles_per_question):
            headline, summary, reading = kind_evidence_texts(
                rng, question, evidence_noise=cfg.evidence_noise, research=cfg.research
            )
            published_at = question.created_at - timedelta(
                seconds=rng.randint(60, int(cfg.evidence_lead_hours * 3600))
            )
            articles.append(
                SimArticle(
                    guid=f"w{cfg.seed}-ev-{key}-{j}",
                    kind=ArticleKind.EVIDENCE,
                    topic=question.topic,
                    title=headline,
                    summary=summary,
                    body=f"{summary} The assessment was shared on {published_at:%Y-%m-%d}.",
                    published_at=published_at,
                    question_id=question.external_id,
                    cue_reading=reading,
                )
            )
        if cfg.research:
            names = (
                question.options if isinstance(question, SimChoiceQuestion) else (question.entity,)
            )
            articles.extend(self._make_lures(key, names, question))
        if cfg.publish_resolution_reports:
            title, summary = kind_report_texts(question, resolution)
            articles.append(
                SimArticle(
                    guid=f"w{cfg.seed}-rp-{key}",
                    kind=ArticleKind.REPORT,
                    topic=question.topic,
                    title=title,
                    summary=summary,
                    body=summary,
                    published_at=question.resolve_at,
                    question_id=question.external_id,
                )
            )
        return articles

    def _make_question(self, rng: random.Random, day: int, index: int, level: int) -> SimQuestion:
        cfg = self.config
        entity = rng.choice(self.entities)
        event = rng.choice(EVENTS[entity.topic])
        horizon = rng.randint(cfg.min_horizon_days, cfg.max_horizon_days)
        created_at = self.day_start(day) + timedelta(hours=cfg.pose_hour, minutes=index)
        close_at = created_at + timedelta(days=horizon)
        p_yes = cfg.cue_p_yes[level]
        # A research world's crowd has not researched: its centre says nothing about the level.
        centre = uninformed_p_yes(cfg.cue_p_yes) if cfg.research else p_yes
        noisy = _sigmoid(_logit(centre) + rng.gauss(0.0, cfg.crowd_noise_logit))
        external_id = f"w{cfg.seed}d{day}q{index}"
        by_date = f"{close_at:%Y-%m-%d}"
        cue = "" if cfg.research else " " + cue_sentence(level, cfg.n_levels)
        title = f"Will {entity.name} {event} by {by_date}?{cue}"
        stem = re.sub(r"[^a-z0-9]+", "-", f"{entity.name} {event} by {by_date}".lower())
        return SimQuestion(
            external_id=external_id,
            day=day,
            index=index,
            entity=entity.name,
            topic=entity.topic,
            event=event,
            cue_level=level,
            p_yes=p_yes,
            title=title,
            description=(
                f"Resolves YES if {entity.name} does {event} before {close_at:%Y-%m-%d %H:%M} "
                f"UTC, NO otherwise.{cue}"
            ),
            slug=f"{stem.strip('-')}-{external_id}",
            horizon_days=horizon,
            created_at=created_at,
            close_at=close_at,
            resolve_at=close_at + timedelta(hours=cfg.resolution_delay_hours),
            crowd_probability=round(min(0.99, max(0.01, noisy)), 4),
        )

    def _make_evidence(self, rng: random.Random, question: SimQuestion) -> list[SimArticle]:
        cfg = self.config
        lead_s = int(cfg.evidence_lead_hours * 3600)
        articles = []
        for j in range(cfg.evidence_articles_per_question):
            reported = question.cue_level
            if rng.random() < cfg.evidence_noise:
                reported = min(cfg.n_levels - 1, max(0, reported + rng.choice((-1, 1))))
            phrase = cue_phrase(reported, cfg.n_levels)
            source = rng.choice(EVIDENCE_SOURCES)
            published_at = question.created_at - timedelta(seconds=rng.randint(60, lead_s))
            headline = f"{source} see {phrase} odds that {question.entity} will {question.event}"
            summary = (
                f"{source} rate the chance that {question.entity} will {question.event} "
                f"by {question.close_at:%Y-%m-%d} as {phrase}."
            )
            articles.append(
                SimArticle(
                    guid=f"w{cfg.seed}-ev-d{question.day}-q{question.index}-{j}",
                    kind=ArticleKind.EVIDENCE,
                    topic=question.topic,
                    title=headline,
                    summary=summary,
                    body=f"{summary} The assessment was shared on {published_at:%Y-%m-%d}.",
                    published_at=published_at,
                    question_id=question.external_id,
                    cue_reading=reported,
                )
            )
        return articles

    def _make_lures(
        self, key: str, names: tuple[str, ...], question: SimQuestion | SimKindQuestion
    ) -> list[SimArticle]:
        """A research world's lures of one question: about its entities (`names`), in its
        evidence window, carrying no reading of it (research.lure_texts)."""
        cfg = self.config
        q = question
        rng = random.Random(f"{cfg.seed}:lures-{key}")
        articles = []
        for j in range(cfg.research_lures_per_question):
            headline, summary = lure_texts(
                rng,
                j,
                entity=names[0] if len(names) == 1 else rng.choice(names),
                topic=q.topic,
                by_date=f"{q.close_at:%Y-%m-%d}",
                n_levels=cfg.n_levels,
            )
            lead_s = int(cfg.evidence_lead_hours * 3600)
            published_at = q.created_at - timedelta(seconds=rng.randint(60, lead_s))
            articles.append(
                SimArticle(
                    guid=f"w{cfg.seed}-dx-{key}-{j}",
                    kind=ArticleKind.DISTRACTOR,
                    topic=q.topic,
                    title=headline,
                    summary=summary,
                    body=f"{summary} The note was shared on {published_at:%Y-%m-%d}.",
                    published_at=published_at,
                )
            )
        return articles

    def _draw_resolution(self, question: SimQuestion) -> Resolution:
        cfg = self.config
        # A stream of its own: redrawing outcomes leaves every published text unchanged.
        rng = random.Random(f"{cfg.effective_outcome_seed}:outcome:{question.day}:{question.index}")
        cancelled, yes = rng.random() < cfg.cancel_rate, rng.random() < question.p_yes
        if cancelled:
            resolution = MarketResolution.CANCEL
        else:
            resolution = MarketResolution.YES if yes else MarketResolution.NO
        return Resolution(
            external_id=question.external_id,
            resolution=resolution,
            resolved_at=question.resolve_at,
        )

    def _make_report(self, question: SimQuestion, resolution: Resolution) -> SimArticle:
        q = question
        if resolution.resolution is MarketResolution.CANCEL:
            title = f"Question on {q.entity} withdrawn"
            summary = f"The question whether {q.entity} would {q.event} was withdrawn."
        else:
            did = "did" if resolution.resolution is MarketResolution.YES else "did not"
            title = f"{q.entity} {did} {q.event}"
            summary = f"Confirmed on {q.resolve_at:%Y-%m-%d}: {q.entity} {did} {q.event}."
        return SimArticle(
            guid=f"w{self.config.seed}-rp-d{q.day}-q{q.index}",
            kind=ArticleKind.REPORT,
            topic=q.topic,
            title=title,
            summary=summary,
            body=summary,
            published_at=q.resolve_at,
            question_id=q.external_id,
        )

    def _make_distractors(self, day: int) -> list[SimArticle]:
        cfg = self.config
        base = cfg.questions_per_day * max(1, cfg.evidence_articles_per_question)
        count = round(base * cfg.distractor_rate / (1.0 - cfg.distractor_rate))
        rng = random.Random(f"{cfg.seed}:distractors:{day}")
        articles = []
        for j in range(count):
            entity = rng.choice(self.entities)
            event = rng.choice(DISTRACTOR_EVENTS)
            published_at = self.day_start(day) + timedelta(seconds=rng.randint(0, 86399))
            summary = f"{entity.name} {event} this week, a spokesperson said."
            articles.append(
                SimArticle(
                    guid=f"w{cfg.seed}-dx-d{day}-{j}",
                    kind=ArticleKind.DISTRACTOR,
                    topic=entity.topic,
                    title=f"{entity.name} {event}",
                    summary=summary,
                    body=f"{summary} No further details were given.",
                    published_at=published_at,
                )
            )
        return articles


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
