"""The simulated world's configuration and its cue ladder (the stated evidence mapping).

Owns `WorldConfig` and the mapping between cue phrases and true probabilities; the world
generator (model.py), the server and the reference forecaster all read it from here.

Cue ladder. Every question states one cue level in its title: "Analysts rate the chance as
high." The ladder maps level k of K to a fixed, known P(yes) (`cue_p_yes[k]`; default
{0.1, 0.3, 0.5, 0.7, 0.9}). With five levels the phrases are the words "very low", "low",
"even", "high", "very high"; any other ladder length K uses "signal strength k of K"
(k = 1..K). The cue is exact: it *is* the true probability given everything published
before the question's cut-off, so a tiny model only has to learn K phrase → number pairs.

Research world (`research=True`): no question text states its cue; the cue lives only in the
noisy readings of its evidence articles, among lures about the same entity, and the best a
forecaster can do is the posterior given those readings (research.py).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import UTC, datetime

FIVE_LEVEL_WORDS = ("very low", "low", "even", "high", "very high")
CUE_SENTENCE = "Analysts rate the chance as {phrase}."
_CUE_PATTERN = re.compile(r"rate the chance as ([a-z0-9 ]+?)\.", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class WorldConfig:
    """A seeded world: the same config gives byte-identical articles, questions and outcomes."""

    seed: int = 0
    """Seeds entities, questions, cue levels, evidence and distractor articles."""
    outcome_seed: int | None = None
    """Seeds the outcome draws (and cancellations) only; None uses `seed`. Changing it redraws
    outcomes while every article and question published before a resolution stays identical."""
    start_at: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    """Midnight UTC of simulated day 0."""
    n_entities: int = 40
    """Companies, councils, teams, labs and institutes the news is about (at most 150)."""
    questions_per_day: int = 20
    """Questions posed each simulated day; cue levels are balanced across them."""
    min_horizon_days: int = 1
    """Shortest time from a question being posed to its close."""
    max_horizon_days: int = 7
    """Longest time from a question being posed to its close."""
    pose_hour: int = 6
    """Hour (UTC) of the day the first question is posed; the rest follow a minute apart."""
    resolution_delay_hours: float = 1.0
    """Hours between a question's close and its resolution."""
    cue_p_yes: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    """True P(yes) of each cue level, lowest first; strictly increasing, inside (0, 1)."""
    evidence_articles_per_question: int = 2
    """News articles carrying a noisy reading of each question's cue level."""
    evidence_lead_hours: float = 36.0
    """Evidence is published uniformly in the window this long before the question is posed."""
    evidence_noise: float = 0.3
    """Probability that an evidence article reports a neighbouring cue level instead of the true
    one (each neighbour equally likely, clipped at the ends of the ladder)."""
    distractor_rate: float = 0.3
    """Fraction of each day's articles that are irrelevant chatter (no cue, no question)."""
    crowd_noise_logit: float = 0.6
    """Std of the Gaussian noise added in logit space to the true p to form the market's crowd
    probability."""
    cancel_rate: float = 0.02
    """Fraction of questions annulled (Manifold CANCEL) instead of resolving YES/NO."""
    publish_resolution_reports: bool = True
    """Publish a news item stating each outcome at its resolution time (exercises the search
    cut-off: an agent that sees one has leaked the future)."""
    choice_questions_per_day: int = 0
    """Multiple-choice questions ("which of k entities", questions.py) posed each day after the
    binary ones; 0 keeps the world binary-only and byte-identical to earlier versions."""
    choice_options: int = 4
    """Options (entities of one topic) per choice question, 2 to 6."""
    choice_favourite_p: tuple[float, ...] = (0.4, 0.55, 0.7, 0.85)
    """True probability of the favourite at each stated strength (slight … overwhelming)."""
    numeric_questions_per_day: int = 0
    """Numeric questions (a latent quantity, questions.py) posed each day after the choice ones."""
    numeric_sigmas: tuple[float, ...] = (10.0, 20.0)
    """The spreads σ a numeric question's stated "give or take" takes."""
    research: bool = False
    """A research world: a binary question's title, description and market probability carry no
    cue (the crowd is the ladder's prior mean with the usual noise), so the cue lives only in
    its evidence articles, published before it is posed among `research_lures_per_question`
    lures about the same entity; the best forecast is then World.informed_probability, the
    posterior given the readings, and one that never searches gets World.uninformed_probability.
    False keeps every article, question, outcome and payload byte-identical to earlier
    versions."""
    research_lures_per_question: int = 2
    """Research world only: articles per question about its entity that carry no reading of it,
    published in its evidence window: alternately odds on a rival event no question asks about
    and cue-free chatter (research.py)."""
    research_unique_subjects: bool = True
    """Research world only: a binary question's subject (its entity and event) is drawn
    without replacement from a shuffled cycle of every (entity, its topic's event) pair
    (research.subject_cycle), so no subject recurs before every other has been asked
    (n_entities × 4 questions: 8 days at the defaults) and a search for a question's entity and
    event finds its own evidence ahead of any earlier question's on the same subject (equal
    word overlap, newer). False draws each subject independently, as with research off: a
    subject then recurs within days, and such a search also finds the evidence of other
    questions on it with other close dates, which only the date tells apart."""

    def __post_init__(self) -> None:
        if self.start_at.tzinfo is None or self.start_at.utcoffset() is None:
            raise ValueError(f"start_at must be timezone-aware UTC, got {self.start_at!r}")
        object.__setattr__(self, "start_at", self.start_at.astimezone(UTC))
        if self.seed < 0 or (self.outcome_seed is not None and self.outcome_seed < 0):
            raise ValueError(f"seeds must be >= 0, got {self.seed}, {self.outcome_seed}")
        if not 1 <= self.n_entities <= 150:
            raise ValueError(f"n_entities must be in [1, 150], got {self.n_entities}")
        if self.questions_per_day < 1:
            raise ValueError(f"questions_per_day must be >= 1, got {self.questions_per_day}")
        if self.questions_per_day > 24 * 60 - 60 * self.pose_hour:
            raise ValueError(f"questions_per_day {self.questions_per_day} does not fit in a day")
        if self.choice_questions_per_day < 0 or self.numeric_questions_per_day < 0:
            raise ValueError("choice_questions_per_day and numeric_questions_per_day must be >= 0")
        if self.questions_per_day_all > 24 * 60 - 60 * self.pose_hour:
            raise ValueError(f"{self.questions_per_day_all} questions a day do not fit in a day")
        if not 2 <= self.choice_options <= 6:
            raise ValueError(f"choice_options must be in [2, 6], got {self.choice_options}")
        favourite = self.choice_favourite_p
        if not favourite or any(not 1.0 / self.choice_options < p < 1.0 for p in favourite):
            raise ValueError(
                f"choice_favourite_p must lie in (1/choice_options, 1), got {favourite}"
            )
        if not self.numeric_sigmas or any(not 0.0 < s <= 40.0 for s in self.numeric_sigmas):
            raise ValueError(f"numeric_sigmas must lie in (0, 40], got {self.numeric_sigmas}")
        if not 1 <= self.min_horizon_days <= self.max_horizon_days:
            raise ValueError(
                f"need 1 <= min_horizon_days <= max_horizon_days, got "
                f"{self.min_horizon_days}, {self.max_horizon_days}"
            )
        if not 0 <= self.pose_hour <= 23:
            raise ValueError(f"pose_hour must be in [0, 23], got {self.pose_hour}")
        if self.resolution_delay_hours < 0:
            raise ValueError(
                f"resolution_delay_hours must be >= 0, got {self.resolution_delay_hours}"
            )
        levels = self.cue_p_yes
        if not 2 <= len(levels) <= 9:
            raise ValueError(f"cue_p_yes needs 2 to 9 levels, got {len(levels)}")
        increasing = all(a < b for a, b in itertools.pairwise(levels))
        if not increasing or any(not 0.0 < p < 1.0 for p in levels):
            raise ValueError(f"cue_p_yes must be strictly increasing inside (0, 1), got {levels}")
        if self.evidence_articles_per_question < 0:
            raise ValueError("evidence_articles_per_question must be >= 0")
        if self.research_lures_per_question < 0:
            raise ValueError("research_lures_per_question must be >= 0")
        if self.evidence_lead_hours <= 0:
            raise ValueError(f"evidence_lead_hours must be > 0, got {self.evidence_lead_hours}")
        for name in ("evidence_noise", "cancel_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if not 0.0 <= self.distractor_rate < 1.0:
            raise ValueError(f"distractor_rate must be in [0, 1), got {self.distractor_rate}")
        if self.crowd_noise_logit < 0:
            raise ValueError(f"crowd_noise_logit must be >= 0, got {self.crowd_noise_logit}")

    @property
    def questions_per_day_all(self) -> int:
        """Binary, choice and numeric questions posed each day, a minute apart."""
        return (
            self.questions_per_day + self.choice_questions_per_day + self.numeric_questions_per_day
        )

    @property
    def n_levels(self) -> int:
        return len(self.cue_p_yes)

    @property
    def effective_outcome_seed(self) -> int:
        return self.seed if self.outcome_seed is None else self.outcome_seed


def cue_phrase(level: int, n_levels: int) -> str:
    """The words for cue level `level` (0-based) of an `n_levels` ladder."""
    if not 0 <= level < n_levels:
        raise ValueError(f"cue level {level} is outside a ladder of {n_levels}")
    if n_levels == len(FIVE_LEVEL_WORDS):
        return FIVE_LEVEL_WORDS[level]
    return f"signal strength {level + 1} of {n_levels}"


def cue_sentence(level: int, n_levels: int) -> str:
    return CUE_SENTENCE.format(phrase=cue_phrase(level, n_levels))


def parse_cue_level(text: str, n_levels: int) -> int:
    """The cue level stated in a question's text; ValueError naming the text if it has none."""
    match = _CUE_PATTERN.search(text)
    if match is not None:
        phrase = match.group(1).strip().lower()
        for level in range(n_levels):
            if cue_phrase(level, n_levels) == phrase:
                return level
    raise ValueError(f"no cue of a {n_levels}-level ladder in question text {text!r}")


def cue_probability(text: str, config: WorldConfig) -> float:
    """The true P(yes) the cue in `text` states under `config`'s ladder."""
    return config.cue_p_yes[parse_cue_level(text, config.n_levels)]
