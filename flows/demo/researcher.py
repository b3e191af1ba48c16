"""The research demo's reference researcher and the warm start it demonstrates.

`ScriptedResearcher` is a policy backend (futureworld.policy.base) that plays a scripted
forecaster: it reads the context it is given (the learner's prompt and the observations the
loop appended), decides its next action and returns that text tokenized with the learner's
tokenizer. The demonstrations are the real rollout engine's trajectories of this backend over
an in-memory corpus of the warm-start world's articles, so prompt, observation framing, masks
and stops are produced by the same code as the learner's own rollouts.

The reference researches imperfectly, leaving RL both research and calibration to learn: it
searches on `search_rate` of the questions, with the entity alone (a poor query) on
`poor_query_rate` of those, opens the top result on `open_rate` of them, and answers from the
readings it actually saw (the exact posterior, futureworld.world.research, its log-odds
× `sharpening`, plus Gaussian log-odds noise); without research it answers the prior mean
with the same noise.

Choice and numeric questions are researched the same way, each query a contiguous span of
the title (so the learner's query is a copy, as for binary "<entity> <event>"): choice
"<the options> will <event>" (its poor query the first option alone), numeric "<quantity>
will <entity> report" (poor: the entity). A choice answer is the posterior over the options
given the options the evidence named (research.choice_informed_probabilities, the strength it
states), each log-probability × `sharpening` plus its own Gaussian noise, renormalised; a
numeric answer the posterior mixture's quantiles given the readings and the σ the evidence
states (research.numeric_informed_quantiles), pulled towards their median by `sharpening` and
shifted by Gaussian noise of sd σ·noise_logit/2. Without readings: 1/k each, or the prior's
quantiles, not sharpened (as binary's prior), with the same noise. Each is written in its
kind's canonical format (futureworld.answers).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from transformers import PreTrainedTokenizerBase

from flows.demo.panel import as_harvested
from futureworld.agent.engine import GroupJob, RolloutEngine
from futureworld.agent.loop import TURN_SEED_STRIDE, rollout_seed
from futureworld.agent.tools import InMemoryCorpus
from futureworld.answers import ANSWER_FORMATS
from futureworld.answers.binary import write_probability
from futureworld.domain import QUANTILE_LEVELS, GenerationSettings, Question, Trajectory
from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.streaming import SequentialStream
from futureworld.world import SimQuestion, World
from futureworld.world.config import cue_phrase
from futureworld.world.questions import SimChoiceQuestion, SimMarket, SimNumericQuestion
from futureworld.world.reference import sharpened_distribution
from futureworld.world.research import (
    choice_informed_probabilities,
    informed_p_yes,
    numeric_informed_quantiles,
    numeric_uninformed_quantiles,
    uninformed_p_yes,
)
from futureworld.world.vocabulary import CHOICE_STRENGTH_WORDS

_ASSISTANT_HEADER = "<|im_start|>assistant"
_QUESTION_LINE = re.compile(r"Question: (.+)")
_ARTICLE_ID = re.compile(r"\[id (\d+)\] ([^\n]*)")
P_RANGE = (0.01, 0.99)
"""The reference never answers beyond these (a tiny model copies digits, not infinities)."""


@dataclass(frozen=True, kw_only=True)
class ResearcherPolicy:
    """How the reference researches and how it answers."""

    search_rate: float = 0.7
    """Share of rollouts that search at all."""
    poor_query_rate: float = 0.3
    """Share of searches that query the entity alone instead of "<entity> <event>"."""
    open_rate: float = 0.3
    """Share of searches followed by opening the top result."""
    sharpening: float = 2.0
    """The answer's log-odds are this multiple of the posterior's (over-confidence)."""
    noise_logit: float = 0.5
    """Std of the Gaussian noise on the answer's log-odds."""
    plain_kind_answers: bool = False
    """Choice and numeric answers in a few stereotyped shapes: the top option's probability on
    a 0.05 grid and the rest shared equally; whole-number quantiles."""
    note_readings: bool = False
    """A binary answer after research opens with a note of the readings it counts
    (`reading_note`): "Noted: by 2026-01-07 as high." or "Noted: none.", then the answer."""

    def __post_init__(self) -> None:
        for name in ("search_rate", "poor_query_rate", "open_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.sharpening <= 0 or self.noise_logit < 0:
            raise ValueError("sharpening must be > 0 and noise_logit >= 0")


def world_corpus(world: World, at: datetime) -> tuple[InMemoryCorpus, dict[int, str]]:
    """Every article the world has published by `at`, numbered 1.. in publication order, as
    a corpus; and each number's world guid (to tell evidence apart)."""
    articles = world.articles_published_by(at)
    domain = [
        replace(a.to_domain(base_url="http://world", fetched_at=a.published_at), id=i)
        for i, a in enumerate(articles, start=1)
    ]
    return InMemoryCorpus(domain), {i: a.guid for i, a in enumerate(articles, start=1)}


def _shown_claims(text: str, claim: re.Pattern[str], *, also: str = "") -> list[re.Match[str]]:
    """The first match of `claim` in each article line shown in `text` that also holds
    `also`, one per article id (a search snippet and the opened article are one reading)."""
    found: dict[str, re.Match[str]] = {}
    for article_id, line in _ARTICLE_ID.findall(text):
        match = claim.search(line)
        if match is not None and also in line and article_id not in found:
            found[article_id] = match
    return list(found.values())


def seen_readings(text: str, question: SimQuestion, n_levels: int) -> list[int]:
    """The cue levels the articles shown in `text` report about the question (its entity, its
    event, by its close date), one per article id (a search snippet and the opened article
    are one reading)."""
    entity, event, by_date = question.entity, question.event, f"by {question.close_at:%Y-%m-%d}"
    phrases = sorted(
        ((cue_phrase(k, n_levels), k) for k in range(n_levels)), key=lambda p: -len(p[0])
    )
    alternation = "|".join(re.escape(p) for p, _ in phrases)
    claim = re.compile(
        rf"see ({alternation}) odds that {re.escape(entity)} will {re.escape(event)}"
    )
    level_of = dict(phrases)
    return [level_of[m.group(1)] for m in _shown_claims(text, claim, also=by_date)]


def reading_note(question: SimQuestion, readings: Sequence[int], n_levels: int) -> str:
    """What a researcher notes before its binary answer: each reading it counts as the
    evidence's words "by <the close date> as <the cue>", or none.

    The note spells out the step a reader has to take: the article that counts is the one
    that names the question's close date, and its cue follows "<that date> as" in its text.
    Written out, each word of the note is a copy (the date from the title, the cue from the
    text after the same words), and the answer follows from the note's cue words alone."""
    if not readings:
        return "Noted: none."
    by_date = f"by {question.close_at:%Y-%m-%d}"
    return "Noted: " + "; ".join(f"{by_date} as {cue_phrase(k, n_levels)}" for k in readings) + "."


def seen_choice_readings(text: str, question: SimChoiceQuestion) -> tuple[list[int], int | None]:
    """The options (indices) the evidence shown in `text` names as the choice question's
    favourite, one per article id, and the favourite's strength it states (None without)."""
    options = question.options
    strengths = "|".join(re.escape(w) for w in CHOICE_STRENGTH_WORDS)
    names = "|".join(re.escape(o) for o in sorted(options, key=len, reverse=True))
    claim = re.compile(
        rf"see a ({strengths}) favourite in ({names}) to {re.escape(question.event)} first "
        rf"among {re.escape(', '.join(options))} by {question.close_at:%Y-%m-%d}"
    )
    matches = _shown_claims(text, claim)
    strength = CHOICE_STRENGTH_WORDS.index(matches[-1].group(1)) if matches else None
    return [options.index(m.group(2)) for m in matches], strength


def seen_numeric_readings(
    text: str, question: SimNumericQuestion
) -> tuple[list[int], float | None]:
    """The numbers the evidence shown in `text` reports for the numeric question, one per
    article id, and the σ it states (None without)."""
    claim = re.compile(
        rf"estimate {re.escape(question.entity)} will report about (-?\d+) "
        rf"{re.escape(question.quantity)} by {question.close_at:%Y-%m-%d}, give or take "
        r"([0-9.]+)\."
    )
    matches = _shown_claims(text, claim)
    sigma = float(matches[-1].group(2)) if matches else None
    return [int(m.group(1)) for m in matches], sigma


def research_query(question: SimMarket, *, poor: bool) -> str:
    """The reference's query: a contiguous span of the title naming what the question is
    about (module docstring), or with `poor` one entity alone."""
    if isinstance(question, SimChoiceQuestion):
        if poor:
            return question.options[0]
        names = ", ".join(question.options[:-1]) + f" or {question.options[-1]}"
        return f"{names} will {question.event}"
    if isinstance(question, SimNumericQuestion):
        if poor:
            return question.entity
        return f"{question.quantity} will {question.entity} report"
    return question.entity if poor else f"{question.entity} {question.event}"


class ScriptedResearcher:
    """A backend that plays the reference researcher on the questions it is given."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        questions: Sequence[SimMarket],
        world: World,
        policy: ResearcherPolicy,
    ) -> None:
        self._tokenizer = tokenizer
        self._by_title = {q.title: q for q in questions}
        self._config = world.config
        self._policy = policy

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def describe(self) -> str:
        return "scripted reference researcher"

    def open_stream(self) -> SequentialStream:
        return SequentialStream(self.generate)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        out = []
        for row, prompt in enumerate(prompts):
            seed = None if params.seed is None else params.seed + row
            text = self.next_action(self._tokenizer.decode(list(prompt)), seed)
            ids = tuple(self._tokenizer.encode(text, add_special_tokens=False))
            if len(ids) > params.max_new_tokens:
                raise ValueError(
                    f"the reference's action {text!r} needs {len(ids)} tokens, over the turn's "
                    f"max_new_tokens {params.max_new_tokens}"
                )
            stop = next((s for s in params.stop if text.endswith(s)), None)
            out.append(
                Generation(
                    token_ids=ids,
                    logprobs=(0.0,) * len(ids),
                    finish_reason=FinishReason.STOP,
                    stop_string=stop,
                )
            )
        return out

    def next_action(self, context: str, turn_seed: int | None) -> str:
        """The reference's next turn given its whole context so far (prompt and turns)."""
        title = _QUESTION_LINE.search(context)
        if title is None or title.group(1).strip() not in self._by_title:
            raise ValueError("the scripted researcher was given a question it was not told of")
        question = self._by_title[title.group(1).strip()]
        turn = context.count(_ASSISTANT_HEADER) - 1
        # The rollout's own seed (the loop adds turn · stride per turn): one plan a rollout.
        seed = 0 if turn_seed is None else turn_seed - turn * TURN_SEED_STRIDE
        rng = random.Random(f"researcher:{seed}")
        policy = self._policy
        searches = rng.random() < policy.search_rate
        poor = rng.random() < policy.poor_query_rate
        opens = rng.random() < policy.open_rate
        noise = rng.gauss(0.0, policy.noise_logit)
        if turn == 0 and searches:
            query = research_query(question, poor=poor)
            # A leading space (the parser strips it): a byte-level BPE token for " Lorne" after
            # "Will" is another id than "Lorne" after ">", so without it the learner would have
            # to learn each name's second id; with it, copying the question's ids is the query.
            return f"<search> {query}</search>"
        if turn == 1 and opens:
            results = context.rsplit("Search results for:", 1)
            top = _ARTICLE_ID.search(results[-1]) if len(results) == 2 else None
            if top is not None:
                return f"<open>{top.group(1)}</open>"
        if isinstance(question, SimChoiceQuestion):
            named, strength = seen_choice_readings(context, question)
            probabilities = self.choice_answer(question, named, strength, rng)
            return ANSWER_FORMATS[question.kind].write(probabilities, self._domain(question))
        if isinstance(question, SimNumericQuestion):
            numbers, sigma = seen_numeric_readings(context, question)
            quantiles = self.numeric_answer(question, numbers, sigma, noise)
            return ANSWER_FORMATS[question.kind].write(quantiles, self._domain(question))
        readings = seen_readings(context, question, self._config.n_levels)
        answer = write_probability(self.answer(readings, noise))
        if policy.note_readings and turn > 0:
            return f"{reading_note(question, readings, self._config.n_levels)} {answer}"
        return answer

    def _domain(self, question: SimMarket) -> Question:
        return question.to_domain(source="manifold")

    def choice_answer(
        self,
        question: SimChoiceQuestion,
        named: Sequence[int],
        strength: int | None,
        rng: random.Random,
    ) -> tuple[float, ...]:
        """Over-confident option probabilities from the options the evidence named; 1/k each
        without a reading; each log-probability gets its own noise (drawn from `rng`)."""
        cfg, k = self._config, len(question.options)
        posterior: tuple[float, ...] = tuple(1.0 / k for _ in range(k))
        if named and strength is not None:
            posterior = choice_informed_probabilities(
                named,
                n_options=k,
                favourite_p=cfg.choice_favourite_p[strength],
                evidence_noise=cfg.evidence_noise,
            )
        probabilities = sharpened_distribution(
            posterior,
            sharpening=self._policy.sharpening,
            noise_logit=self._policy.noise_logit,
            rng=rng,
        )
        if not self._policy.plain_kind_answers:
            return probabilities
        top = max(range(k), key=lambda i: probabilities[i])
        p_top = min(0.95, max(0.3, round(probabilities[top] / 0.05) * 0.05))
        rest = round((1.0 - p_top) / (k - 1), 2)
        return tuple(round(p_top, 2) if i == top else rest for i in range(k))

    def numeric_answer(
        self,
        question: SimNumericQuestion,
        readings: Sequence[int],
        sigma: float | None,
        noise_logit: float,
    ) -> tuple[float, ...]:
        """Over-confident quantiles at QUANTILE_LEVELS from the readings and the stated σ; the
        prior's without a reading. `noise_logit` (a draw of N(0, noise_logit²)) shifts them by
        σ·noise_logit/2."""
        sigmas = self._config.numeric_sigmas
        # The prior, as binary's: not sharpened.
        quantiles = numeric_uninformed_quantiles(sigmas, QUANTILE_LEVELS)
        scale, sharpening = max(sigmas), 1.0
        if readings and sigma is not None:
            try:
                quantiles = numeric_informed_quantiles(
                    readings, sigma=sigma, levels=QUANTILE_LEVELS
                )
                scale, sharpening = sigma, self._policy.sharpening
            except ValueError:
                # Two questions can share entity, quantity and close date: their readings
                # mixed can be impossible for either, and the reference falls back on the
                # prior, as for binary questions.
                pass
        median = quantiles[QUANTILE_LEVELS.index(0.5)]
        shift = scale * noise_logit / 2.0
        spec = question.spec
        out = [
            round(
                min(
                    spec.upper,
                    max(spec.lower, median + shift + (q - median) / sharpening),
                ),
                1,
            )
            for q in quantiles
        ]
        if self._policy.plain_kind_answers:
            out = [float(round(q)) for q in out]
        return tuple(max(out[: i + 1]) for i in range(len(out)))

    def answer(self, readings: Sequence[int], noise_logit: float) -> float:
        """Over-confident P(yes) from the readings seen; the prior mean without any."""
        cfg = self._config
        try:
            # Two questions can share entity, event and close date: their readings mixed can
            # be impossible for either, and the reference then falls back on the prior.
            p = informed_p_yes(readings, cue_p_yes=cfg.cue_p_yes, evidence_noise=cfg.evidence_noise)
        except ValueError:
            readings = ()
        if readings:
            logit = self._policy.sharpening * math.log(p / (1.0 - p))
        else:
            p = uninformed_p_yes(cfg.cue_p_yes)
            logit = math.log(p / (1.0 - p))
        p_yes = 1.0 / (1.0 + math.exp(-(logit + noise_logit)))
        return min(P_RANGE[1], max(P_RANGE[0], p_yes))


def warm_start_questions(world: World, days: int) -> list[tuple[SimMarket, Question]]:
    """Each question posed on days 0..days-1 (a day's binary questions, then its choice and
    numeric ones where the world poses them), with the question exactly as harvested (an id
    by its order: the engine needs one; demonstrations are never stored by question)."""
    from flows.demo.kinds import as_harvested_kind

    out: list[tuple[SimMarket, Question]] = []
    for day in range(days):
        for sim in world.questions_posed_on(day):
            out.append((sim, replace(as_harvested(world, sim.external_id), id=len(out) + 1)))
        for kind_sim in world.kind_questions_posed_on(day):
            out.append((kind_sim, replace(as_harvested_kind(world, kind_sim), id=len(out) + 1)))
    return out


def research_demonstrations(
    tokenizer: PreTrainedTokenizerBase,
    world: World,
    questions: Sequence[tuple[SimMarket, Question]],
    settings: GenerationSettings,
    policy: ResearcherPolicy,
    *,
    seed: int,
    agent_id: int = 0,
    drills_from_day: int | None = None,
) -> list[Trajectory]:
    """The reference researcher's rollouts of `questions` through the rollout engine over the
    world's articles (each question searching them as of its cut-off), one per question; those
    of questions posed on or after `drills_from_day` cut to their first turn (`first_turn`)."""
    last = max(q.info_cutoff_at for _, q in questions)
    corpus, _ = world_corpus(world, last)
    backend = ScriptedResearcher(tokenizer, [sim for sim, _ in questions], world, policy)
    engine = RolloutEngine(backend, corpus, settings, agent_id=agent_id, policy_version=0)
    jobs = [
        GroupJob(
            question=question,
            samples=(0,),
            seeds=(rollout_seed(seed, question.id or 0, 0, 0),),
            as_of=question.info_cutoff_at,
        )
        for _, question in questions
    ]
    groups: dict[int, Trajectory] = {}
    engine.run(jobs, lambda job, group: groups.__setitem__(job.question.id, group[0]))
    drill = drills_from_day if drills_from_day is not None else math.inf
    return [
        first_turn(groups[q.id]) if sim.day >= drill else groups[q.id]
        for sim, q in questions
        if q.id is not None
    ]


def first_turn(trajectory: Trajectory) -> Trajectory:
    """The rollout up to the end of its first action: the prompt and the tokens the policy
    generated in its first turn (the observation that followed is left out). A supervised
    loss on it equals the loss on those tokens of the whole rollout."""
    end = trajectory.turns[0].token_end
    return replace(
        trajectory,
        completion_token_ids=trajectory.completion_token_ids[:end],
        loss_mask=trajectory.loss_mask[:end],
        behaviour_logprobs=trajectory.behaviour_logprobs[:end],
        turns=trajectory.turns[:1],
    )


def tokenizer_texts(
    world: World,
    questions: Sequence[tuple[SimMarket, Question]],
    settings: GenerationSettings,
    policy: ResearcherPolicy,
    *,
    seed: int,
) -> list[str]:
    """What the learner's tokenizer should learn for research: the system prompt, the
    questions and every turn text (actions, search results, opened articles) of the
    reference's rollouts, run once with a provisional tokenizer trained on the prompt and the
    world's articles (the texts do not depend on which tokenizer runs them, as long as an
    observation fits its token budget either way)."""
    from futureworld.agent.prompts import SYSTEM_PROMPT
    from futureworld.policy.tiny import train_tokenizer

    last = max(q.info_cutoff_at for _, q in questions)
    articles = [f"{a.title} {a.summary}" for a in world.articles_published_by(last)]
    titles = [q.title for _, q in questions]
    provisional = train_tokenizer([SYSTEM_PROMPT, *titles, *articles])
    trajectories = research_demonstrations(
        provisional, world, questions, settings, policy, seed=seed
    )
    return [SYSTEM_PROMPT, *titles, *(turn.text for t in trajectories for turn in t.turns)]
