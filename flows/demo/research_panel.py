"""The research demo's held-out panel: questions of a research world the rounds never see,
forecast multi-turn through the rollout engine over an in-memory corpus of that world's
articles (each question searching them as of its own cut-off), and what the rollouts did.

The panel world has its own seed (flows.demo.panel.panel_seed), so no panel question, entity pairing
or article is one the learner trains on, and it poses as many questions a day as the demo's
world, so search faces the same crowd of same-entity articles. Each question carries its
informed floor (World.informed_probability) and its evidence articles' corpus ids, so a
rollout's observations can be checked for them. Seeds as in flows.demo.panel: the same per
(seed, question, sample) in every round, so rounds are compared with common random numbers.

With choice and numeric questions (`--kinds`), the panel world poses them too, their
evidence and lures in the same corpus, and each kind's panel (flows.demo.kinds) is researched
over that corpus and scored as the binary-world demo scores it (flows.demo.kind_scores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy.orm import Session

from flows.demo.kind_scores import KindPanelScore
from flows.demo.kinds import KindPanelQuestion, build_kind_panel, score_kind_panel
from flows.demo.panel import PanelScore, as_harvested, forecast_panel, panel_score
from flows.demo.panel import panel_world as demo_panel_world
from flows.demo.researcher import world_corpus
from futureworld.agent.parsing import ActionKind
from futureworld.agent.tools import InMemoryCorpus
from futureworld.domain import (
    GenerationSettings,
    ParseStatus,
    Question,
    QuestionKind,
    StopReason,
    Trajectory,
)
from futureworld.policy.base import PolicyBackend
from futureworld.scoring import brier
from futureworld.world import ArticleKind, World, WorldConfig
from storage.repositories.articles import articles_between
from storage.repositories.questions import list_questions
from storage.repositories.rollouts import rollouts_for

TOOLS = (ActionKind.SEARCH, ActionKind.OPEN)


class ResearchPath(StrEnum):
    """What a rollout's research came to, for its question."""

    FOUND = "found"
    """It searched and its observations hold one of its question's evidence articles."""
    MISSED = "missed"
    """It searched (or opened) and saw none of its question's evidence."""
    UNSEARCHED = "unsearched"
    """It made no tool call."""


def research_path(trajectory: Trajectory, evidence_ids: frozenset[int]) -> ResearchPath:
    """Whether the rollout saw one of `evidence_ids` (its question's evidence articles), made
    tool calls that showed none, or made none."""
    if seen_article_ids(trajectory) & evidence_ids:
        return ResearchPath.FOUND
    if any(t.tool_name in TOOLS for t in trajectory.turns if t.role == "assistant"):
        return ResearchPath.MISSED
    return ResearchPath.UNSEARCHED


@dataclass(frozen=True)
class ResearchPanelQuestion:
    question: Question
    """With a placeholder (negative) id: the panel is never stored."""
    outcome: float
    p_informed: float
    """The posterior given all its evidence: what perfect research forecasts."""
    p_uninformed: float
    evidence_ids: frozenset[int]
    """Corpus ids of its evidence articles."""


@dataclass(frozen=True)
class ResearchPanel:
    questions: tuple[ResearchPanelQuestion, ...]
    corpus: InMemoryCorpus
    published_at: dict[int, datetime]
    """Each corpus id's publication time (for the no-look-ahead check)."""
    kind_panels: dict[QuestionKind, tuple[KindPanelQuestion, ...]] = field(default_factory=dict)
    """Each extra kind's panel, from the same world, researched over the same corpus."""

    def head(self, n: int) -> ResearchPanel:
        """Its first `n` binary questions, over the same corpus, beside the same kind panels:
        each question keeps its place, so its rollouts' seeds are the whole panel's."""
        return replace(self, questions=self.questions[:n])


@dataclass(frozen=True)
class ResearchRound:
    """One round's panel forecasts (`score`, p_true the informed floor's p) and its research."""

    score: PanelScore
    rollouts: int
    searched: int
    """Rollouts with at least one search."""
    found_evidence: int
    """Rollouts whose observations hold one of their question's evidence articles."""
    first_turn_tool_calls: int
    """Rollouts whose first turn parsed as a search or open."""
    assistant_turns: int
    generated_tokens: int
    uninformed_brier: float
    """Brier of the prior mean on the questions that parsed (the uninformed floor)."""
    path_errors: dict[ResearchPath, tuple[float, int]] = field(default_factory=dict)
    """Per research path: the summed squared error of its answered rollouts, and their count
    (whether reading what it found pays: a policy that finds evidence and misreads it is
    rightly taught to stop searching)."""
    kinds: tuple[KindPanelScore, ...] = ()
    """Each extra kind's panel score, researched over the same corpus."""
    found_moments: tuple[float, ...] = (0.0,) * 6
    """Over the answered rollouts that found their evidence: n and the sums of a, p, a², p²
    and a·p, a the answer and p the informed floor's probability (`found_reading`)."""
    tool_errors: int = 0
    """Rollouts a failed tool call ended (StopReason.TOOL_ERROR): the corpus, not the policy,
    failed them, so a round with any is not a measure of the policy (the round log names
    them)."""
    whole: ResearchRound | None = None
    """Where this round's scores are of the panel's head and the round was scored on the
    whole panel too (the claim's first and last rounds; DemoConfig.research_panel_head): the
    whole panel's round, of binary questions only (`kinds` are this one's)."""

    @property
    def found_reading(self) -> float:
        """Correlation of the answers of the rollouts that found their evidence with the
        posterior given all of it (NaN with fewer than two, or no spread): whether the policy
        reads what it finds. A warm start that learned the search but not the reading answers
        at random after finding the evidence (seed 0 at research_sharpening 1.5, by
        benchmarks/research_reading.py's like measure on its stored rollouts: −0.06 against
        +0.68 for another draw of it; docs/results.md, "A seeded research run repeats, and the
        warm start's reading is a draw"), and RL then rightly stops its search."""
        n, a, p, aa, pp, ap = self.found_moments
        if n < 2:
            return float("nan")
        var_a, var_p = aa / n - (a / n) ** 2, pp / n - (p / n) ** 2
        if var_a <= 0.0 or var_p <= 0.0:
            return float("nan")
        return (ap / n - (a / n) * (p / n)) / (var_a * var_p) ** 0.5

    def path_brier(self, path: ResearchPath) -> float:
        """Brier of the answered rollouts that took `path` (per rollout; NaN with none)."""
        total, n = self.path_errors.get(path, (0.0, 0))
        return total / n if n else float("nan")

    @property
    def search_rate(self) -> float:
        return self.searched / self.rollouts

    @property
    def evidence_rate(self) -> float:
        return self.found_evidence / self.rollouts

    @property
    def first_turn_tool_rate(self) -> float:
        return self.first_turn_tool_calls / self.rollouts

    @property
    def turns_per_rollout(self) -> float:
        return self.assistant_turns / self.rollouts

    @property
    def tokens_per_rollout(self) -> float:
        return self.generated_tokens / self.rollouts


def panel_world(base: WorldConfig, questions_per_day: int) -> World:
    """The research world the panel of a run on `base` is drawn from: `base` as a research
    world with the demo panel's seed and no cancellations (flows.demo.panel.panel_world),
    `questions_per_day` binary questions a day and its kinds' questions as `base` poses them."""
    return demo_panel_world(replace(base, research=True), questions_per_day)


def build_research_panel(
    base: WorldConfig, n: int, questions_per_day: int, *, kind_n: int = 0
) -> ResearchPanel:
    """The first `n` binary questions of the panel world of a run on `base` (`panel_world`)
    from day 0 on, with outcomes, both floors and evidence ids, the first `kind_n` of each
    kind besides binary that `base` poses, and the corpus of every article published by the
    last cut-off of any of them."""
    world = panel_world(base, questions_per_day)
    extra = [
        kind
        for kind, per_day in (
            (QuestionKind.CHOICE, base.choice_questions_per_day),
            (QuestionKind.NUMERIC, base.numeric_questions_per_day),
        )
        if per_day > 0
    ]
    sims = []
    day = 0
    while len(sims) < n:
        sims += world.questions_posed_on(day)[: n - len(sims)]
        day += 1
    harvested = [as_harvested(world, s.external_id) for s in sims]
    kind_panels = {
        kind: tuple(
            replace(
                item,
                informed=world.informed_forecast(item.sim.external_id),
                uninformed=world.uninformed_forecast(item.sim.external_id),
            )
            for item in build_kind_panel(world, kind, kind_n)
        )
        for kind in extra
    }
    cutoffs = [q.info_cutoff_at for q in harvested]
    cutoffs += [item.question.info_cutoff_at for p in kind_panels.values() for item in p]
    corpus, guid_of = world_corpus(world, max(cutoffs))
    id_of = {guid: i for i, guid in guid_of.items()}
    published = {i: world.article(g).published_at for i, g in guid_of.items()}
    evidence: dict[str, set[int]] = {}
    for guid, i in id_of.items():
        article = world.article(guid)
        if article.kind is ArticleKind.EVIDENCE and article.question_id is not None:
            evidence.setdefault(article.question_id, set()).add(i)
    out = []
    for k, (sim, question) in enumerate(zip(sims, harvested, strict=True)):
        far = world.day_start(sim.day + 30)
        out.append(
            ResearchPanelQuestion(
                question=replace(question, id=-(k + 1)),
                outcome=world.resolution_as_of(sim.external_id, far).value,
                p_informed=world.informed_probability(sim.external_id),
                p_uninformed=world.uninformed_probability(sim.external_id),
                evidence_ids=frozenset(evidence.get(sim.external_id, ())),
            )
        )
    return ResearchPanel(tuple(out), corpus, published, kind_panels)


def forecast_research_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    panel: ResearchPanel,
    *,
    policy_version: int,
    samples: int,
    seed: int,
) -> list[list[Trajectory]]:
    """Every panel question's `samples` rollouts, all in flight at once through the engine."""
    return forecast_panel(
        backend,
        settings,
        [item.question for item in panel.questions],
        corpus=panel.corpus,
        policy_version=policy_version,
        samples=samples,
        seed=seed,
    )


def seen_article_ids(trajectory: Trajectory) -> set[int]:
    """Corpus ids of every article the rollout's observations showed it."""
    return {i for turn in trajectory.turns if turn.role == "tool" for i in turn.tool_result_ids}


def score_research_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    panel: ResearchPanel,
    *,
    round_no: int,
    policy_version: int,
    samples: int,
    seed: int,
    head: int | None = None,
    with_whole: bool = False,
) -> ResearchRound:
    """A policy forecasts the research panel; its scores and what its rollouts researched.

    With `head`, the scores are of the panel's first `head` questions, and `with_whole`
    forecasts the whole panel as well (the head's rollouts are its first ones) and keeps its
    round as `whole`; without it only the head is forecast."""
    if head is not None and head >= len(panel.questions):
        head = None
    scored = panel if head is None or with_whole else panel.head(head)
    groups = forecast_research_panel(
        backend, settings, scored, policy_version=policy_version, samples=samples, seed=seed
    )
    scores = research_round(scored, groups, round_no=round_no, policy_version=policy_version)
    if head is not None and with_whole:
        whole = scores
        scores = research_round(
            panel.head(head), groups[:head], round_no=round_no, policy_version=policy_version
        )
        scores = replace(scores, whole=whole)
    kinds = tuple(
        score_kind_panel(
            backend,
            settings,
            kind,
            kind_panel,
            round_no=round_no,
            policy_version=policy_version,
            seed=seed,
            corpus=panel.corpus,
        )
        for kind, kind_panel in panel.kind_panels.items()
    )
    return replace(scores, kinds=kinds)


def research_round(
    panel: ResearchPanel,
    groups: Sequence[Sequence[Trajectory]],
    *,
    round_no: int,
    policy_version: int,
) -> ResearchRound:
    """The scores of the panel's rollouts (`groups`, in panel order) and what they researched."""
    score = panel_score(
        [
            (group, item.outcome, item.p_informed)
            for item, group in zip(panel.questions, groups, strict=True)
        ],
        round_no=round_no,
        policy_version=policy_version,
    )
    searched = found = first_tool = turns = tokens = rollouts = tool_errors = 0
    errors: dict[ResearchPath, tuple[float, int]] = {}
    moments = [0.0] * 6
    for item, group in zip(panel.questions, groups, strict=True):
        for trajectory in group:
            rollouts += 1
            tool_errors += trajectory.stop_reason is StopReason.TOOL_ERROR
            mine = [t for t in trajectory.turns if t.role == "assistant"]
            turns += len(mine)
            tokens += sum(trajectory.loss_mask)
            searched += any(t.tool_name == ActionKind.SEARCH for t in mine)
            first_tool += bool(mine) and mine[0].tool_name in TOOLS
            path = research_path(trajectory, item.evidence_ids)
            found += path is ResearchPath.FOUND
            if trajectory.p_yes is not None and trajectory.parse_status is ParseStatus.OK:
                total, n = errors.get(path, (0.0, 0))
                errors[path] = (total + (trajectory.p_yes - item.outcome) ** 2, n + 1)
                if path is ResearchPath.FOUND:
                    a, p = trajectory.p_yes, item.p_informed
                    for k, term in enumerate((1.0, a, p, a * a, p * p, a * p)):
                        moments[k] += term
    prior = [panel.questions[n].p_uninformed for n in score.question]
    uninformed = brier(prior, score.y) if score.y else float("nan")
    return ResearchRound(
        score=score,
        rollouts=rollouts,
        searched=searched,
        found_evidence=found,
        first_turn_tool_calls=first_tool,
        assistant_turns=turns,
        generated_tokens=tokens,
        uninformed_brier=uninformed,
        path_errors=errors,
        found_moments=tuple(moments),
        tool_errors=tool_errors,
    )


def claim_scores(rounds: Sequence[ResearchRound]) -> list[PanelScore]:
    """The scores the learning claim compares: the first and the last round's, on the whole
    panel where a round's own scores are of its head."""
    return [(r.whole or r).score for r in (rounds[0], rounds[-1])]


def demonstration_research(trajectories: Sequence[Trajectory]) -> tuple[float, float]:
    """(first-turn tool-call rate, search rate) of a set of trajectories (the warm start's)."""
    first = searched = 0
    for trajectory in trajectories:
        mine = [t for t in trajectory.turns if t.role == "assistant"]
        first += bool(mine) and mine[0].tool_name in TOOLS
        searched += any(t.tool_name == ActionKind.SEARCH for t in mine)
    return first / len(trajectories), searched / len(trajectories)


@dataclass(frozen=True)
class LiveResearch:
    """What the learner's own rollouts of one round (the daily cycle's, stored) researched."""

    round: int
    rollouts: int
    searched: int
    found_evidence: int
    """Rollouts whose observations hold an article whose guid is one of the question's
    evidence articles in the world."""


def live_research(
    session: Session, agent_id: int, world: World, round_of: Callable[[datetime], int]
) -> list[LiveResearch]:
    """Per round, the stored rollouts of the agent: how many searched and found evidence
    (articles matched to the world's evidence by guid, questions by external id)."""
    trajectories = rollouts_for(session, agent_id=agent_id)
    if not trajectories:
        return []
    last = max(t.as_of for t in trajectories if t.as_of is not None)
    guid_of = {a.id: a.guid for a in articles_between(session, None, last + timedelta(days=30))}
    question_ids = {t.question_id for t in trajectories}
    external = {q.id: q.external_id for q in list_questions(session, ids=sorted(question_ids))}
    evidence: dict[str, set[str]] = {}
    for article in world.articles_published_by(last):
        if article.kind is ArticleKind.EVIDENCE and article.question_id is not None:
            evidence.setdefault(article.question_id, set()).add(article.guid)
    counts: dict[int, list[int]] = {}
    for t in trajectories:
        if t.as_of is None:
            continue
        row = counts.setdefault(round_of(t.as_of), [0, 0, 0])
        row[0] += 1
        row[1] += any(turn.tool_name == ActionKind.SEARCH for turn in t.turns)
        seen = {guid_of.get(i) for i in seen_article_ids(t)}
        row[2] += bool(seen & evidence.get(external.get(t.question_id, ""), set()))
    return [LiveResearch(r, *c) for r, c in sorted(counts.items())]
