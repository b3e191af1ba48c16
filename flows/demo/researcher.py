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
from futureworld.answers.binary import write_probability
from futureworld.domain import GenerationSettings, Question, Trajectory
from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.streaming import SequentialStream
from futureworld.world import SimQuestion, World
from futureworld.world.config import cue_phrase
from futureworld.world.research import informed_p_yes, uninformed_p_yes

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
    found: dict[str, int] = {}
    for article_id, line in _ARTICLE_ID.findall(text):
        match = claim.search(line)
        if match is not None and by_date in line and article_id not in found:
            found[article_id] = level_of[match.group(1)]
    return list(found.values())


class ScriptedResearcher:
    """A backend that plays the reference researcher on the questions it is given."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        questions: Sequence[SimQuestion],
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
            query = question.entity if poor else f"{question.entity} {question.event}"
            # A leading space (the parser strips it): a byte-level BPE token for " Lorne" after
            # "Will" is another id than "Lorne" after ">", so without it the learner would have
            # to learn each name's second id; with it, copying the question's ids is the query.
            return f"<search> {query}</search>"
        if turn == 1 and opens:
            results = context.rsplit("Search results for:", 1)
            top = _ARTICLE_ID.search(results[-1]) if len(results) == 2 else None
            if top is not None:
                return f"<open>{top.group(1)}</open>"
        readings = seen_readings(context, question, self._config.n_levels)
        return write_probability(self.answer(readings, noise))

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


def warm_start_questions(world: World, days: int) -> list[tuple[SimQuestion, Question]]:
    """Each question posed on days 0..days-1, with the question exactly as harvested (an id
    by its order: the engine needs one; demonstrations are never stored by question)."""
    sims = [q for day in range(days) for q in world.questions_posed_on(day)]
    return [
        (sim, replace(as_harvested(world, sim.external_id), id=n + 1)) for n, sim in enumerate(sims)
    ]


def research_demonstrations(
    tokenizer: PreTrainedTokenizerBase,
    world: World,
    questions: Sequence[tuple[SimQuestion, Question]],
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
    questions: Sequence[tuple[SimQuestion, Question]],
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
