"""The simulated world: which questions, articles and outcomes exist on which day, and what of
them is public at an instant. Nothing here does I/O; the questions are drawn in questions.py,
their news in articles.py, their outcomes in outcomes.py, served over HTTP by server.py.

Latent process. Each simulated day d at `pose_hour` UTC the world poses `questions_per_day`
binary questions. Each has a latent cue level k (balanced across levels: level = (d·Q + i) mod
K, shuffled within the day), a horizon h ~ U{min..max} days, close = posed + h days,
resolution = close + delay; the outcome is y ~ Bernoulli(cue_p_yes[k]) (or CANCEL with
`cancel_rate`). The title states k exactly and the articles carry noisy readings of it, so
P(y = 1 | everything public at the cut-off) = cue_p_yes[k]: the stated true probability.

Research world (`research=True`). Titles drop the cue and the crowd is centred on the prior,
so the evidence articles are all a forecaster can learn k from; P(y = 1 | public) is then the
posterior `informed_probability` (research.py), below which no forecaster's expected Brier can
go. Entities, cue levels, evidence and outcomes are the same as with research off for the same
seed (the lures draw from a stream of their own), so the two worlds are paired question by
question. Choice and numeric questions do the same: `informed_forecast` /
`uninformed_forecast` are their two floors.

Other kinds. With `choice_questions_per_day` or `numeric_questions_per_day` > 0 the world also
poses multiple-choice and numeric questions (ids w<seed>d<day>c<i> and …n<i>), a minute apart
after the day's binary questions, with their own streams, evidence and reports.
`questions_posed_on`/`questions_posed_by` stay binary-only (the reference forecaster and the
demo's panel are binary-only); `markets_posed_by` lists every kind, as the market API does.

Determinism. Every draw comes from `random.Random(str)` streams keyed by (seed, day, index),
so the same config gives byte-identical output in any process, in any order of access.
"""

from __future__ import annotations

import math
import random
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from futureworld.domain import QUANTILE_LEVELS, require_utc
from futureworld.world.articles import (
    SimArticle,
    binary_evidence,
    distractor_articles,
    kind_evidence,
    lure_articles,
    report_article,
)
from futureworld.world.config import WorldConfig
from futureworld.world.outcomes import (
    KindResolution,
    Resolution,
    draw_kind_resolution,
    draw_resolution,
)
from futureworld.world.questions import (
    QuestionTiming,
    SimChoiceQuestion,
    SimKindQuestion,
    SimNumericQuestion,
    SimQuestion,
    make_binary_question,
    make_choice_question,
    make_numeric_question,
)
from futureworld.world.research import (
    choice_informed_probabilities,
    informed_p_yes,
    numeric_informed_quantiles,
    numeric_uninformed_quantiles,
    subject_cycle,
    uninformed_p_yes,
)
from futureworld.world.vocabulary import EVENTS, Entity, Topic, build_entities

CREATOR_USERNAME = "simworld"
_ID_PATTERN = re.compile(r"^w(\d+)d(\d+)([qcn])(\d+)$")


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
        self._subject_cycles: dict[int, tuple[tuple[Entity, str], ...]] = {}
        self._subjects = sum(len(EVENTS[entity.topic]) for entity in self.entities)
        """A research subject cycle's length: every entity with every event of its topic."""
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
            questions = tuple(q for q in self.kind_questions_posed_on(day) if q.letter == letter)
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
        resolutions: dict[str, Resolution | KindResolution] = {}
        outcomes = {"outcome_seed": cfg.effective_outcome_seed, "cancel_rate": cfg.cancel_rate}
        for index, level in enumerate(levels):
            rng = random.Random(f"{cfg.seed}:question:{day}:{index}")
            question = make_binary_question(
                rng,
                cfg,
                self.entities,
                day=day,
                index=index,
                level=level,
                day_start=self.day_start(day),
                subject=self._research_subject(day * n_per_day + index),
            )
            questions.append(question)
            articles.extend(binary_evidence(rng, question, cfg))
            resolution = draw_resolution(question, **outcomes)
            articles.extend(self._question_articles(question, resolution))
            resolutions[question.external_id] = resolution
        articles.extend(distractor_articles(day, self.day_start(day), self.entities, cfg))
        kind_questions = self._make_kind_questions(day)
        for kind_question in kind_questions:
            kind_resolution = draw_kind_resolution(kind_question, **outcomes)
            resolutions[kind_question.external_id] = kind_resolution
            articles.extend(kind_evidence(kind_question, cfg))
            articles.extend(self._question_articles(kind_question, kind_resolution))
        return _Day(tuple(questions), tuple(articles), resolutions, kind_questions)

    def _research_subject(self, n: int) -> tuple[Entity, str] | None:
        """The n-th binary question's subject from the research cycle (research.subject_cycle),
        or None where subjects are drawn per question."""
        cfg = self.config
        if not (cfg.research and cfg.research_unique_subjects):
            return None
        number, position = divmod(n, self._subjects)
        cycle = self._subject_cycles.get(number)
        if cycle is None:  # under self._lock: called while a day is generated
            cycle = self._subject_cycles[number] = subject_cycle(cfg.seed, self.entities, number)
        return cycle[position]

    def _question_articles(
        self,
        question: SimQuestion | SimKindQuestion,
        resolution: Resolution | KindResolution,
    ) -> list[SimArticle]:
        """A question's articles after its evidence: its lures and its report, as configured."""
        cfg = self.config
        articles = lure_articles(question, cfg) if cfg.research else []
        if cfg.publish_resolution_reports:
            articles.append(report_article(question, resolution, cfg))
        return articles

    def _make_kind_questions(self, day: int) -> tuple[SimKindQuestion, ...]:
        cfg = self.config
        made: list[SimKindQuestion] = []
        for kind, count in (
            (SimChoiceQuestion, cfg.choice_questions_per_day),
            (SimNumericQuestion, cfg.numeric_questions_per_day),
        ):
            for index in range(count):
                rng = random.Random(f"{cfg.seed}:question-{kind.letter}:{day}:{index}")
                timing = QuestionTiming(
                    seed=cfg.seed,
                    day=day,
                    index=index,
                    created_at=self.day_start(day)
                    + timedelta(hours=cfg.pose_hour, minutes=cfg.questions_per_day + len(made)),
                    horizon_days=rng.randint(cfg.min_horizon_days, cfg.max_horizon_days),
                    resolution_delay_hours=cfg.resolution_delay_hours,
                )
                if kind is SimChoiceQuestion:
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
