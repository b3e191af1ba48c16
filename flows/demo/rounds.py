"""One round's scoring of the demo's held-out panels, apart from the cycle that trained it.

`round_policy` names the round's served policy version (its checkpoint, fixed once written,
read before the next cycle registers a newer one); `score_round` loads it and forecasts the
binary panel and each kind's panel (`score_research_round`: the research panel, multi-turn
over its world's articles). Scoring reads no database, so the demo runs it in a
worker process (`panel_scorer`) beside the next round's cycle.

Decision: a process, not a thread. Both the cycle's update (one rollout a row: many small
ops) and the panel's decode loop spend much of their time in Python, so on a thread they
queue for the interpreter lock; measured on 2 cores, a thread left the round time where it
was, while the process runs the two side by side.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING

from flows.context import PipelineContext
from flows.demo.kind_scores import KindPanelScore
from flows.demo.kinds import KindPanelQuestion, score_kind_panel
from flows.demo.panel import PanelQuestion, PanelScore, score_panel
from flows.demo.research_panel import ResearchPanel, ResearchRound, score_research_panel
from futureworld.domain import GenerationSettings, QuestionKind
from futureworld.policy.loading import BackendSpec, load_backend
from storage.engine import session_scope
from storage.repositories.agents import get_policy_version

if TYPE_CHECKING:
    from flows.demo.config import DemoConfig

ROUND_PROCESSES = 2
"""Processes a round runs side by side: the cycle's (this one) and the panel scorer's; each
takes its share of the cores for torch (futureworld.torch_threads)."""

RoundPolicy = tuple[BackendSpec, GenerationSettings, int]
"""How to load a policy version, its sampling settings and its version number."""

RoundScores = tuple[PanelScore, dict[QuestionKind, KindPanelScore]]
"""The binary panel's score and each extra kind's."""


def round_policy(ctx: PipelineContext, agent: str, version: int | None = None) -> RoundPolicy:
    """The agent's served policy version (or its version `version`, a past round's), with its
    sampling settings."""
    learner = ctx.agent(agent)
    if version is None:
        policy = ctx.current_version(learner)
    else:
        with session_scope(ctx.engine) as session:
            policy = get_policy_version(session, learner.id or 0, version)
    return ctx.backend_spec(learner, policy), learner.generation, policy.version


@contextmanager
def panel_scorer() -> Iterator[ProcessPoolExecutor]:
    """The worker process `score_round` runs in (spawned: no state shared with the caller).

    Left normally, it finishes the panel in flight; left by an exception (a failed cycle,
    Ctrl-C, SIGTERM through the CLI), the worker is killed first: the executor's own exit
    would wait out the whole panel before the demo could end."""
    executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    worker = executor.submit(os.getpid).result()  # the one worker, started now
    try:
        yield executor
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # it has ended already
            os.kill(worker, signal.SIGKILL)
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    executor.shutdown(wait=True)


def score_round(
    policy: RoundPolicy,
    panel: Sequence[PanelQuestion],
    kind_panels: dict[QuestionKind, Sequence[KindPanelQuestion]],
    round_no: int,
    config: DemoConfig,
) -> RoundScores:
    """A round's policy forecasts the held-out panel and each kind's panel."""
    spec, generation, version = policy
    backend = load_backend(spec)
    score = score_panel(
        backend,
        generation,
        panel,
        round_no=round_no,
        policy_version=version,
        samples=config.panel_samples,
        seed=config.seed,
    )
    kinds = {
        kind: score_kind_panel(
            backend,
            generation,
            kind,
            kind_panel,
            round_no=round_no,
            policy_version=version,
            seed=config.seed,
        )
        for kind, kind_panel in kind_panels.items()
    }
    return score, kinds


def score_research_round(
    policy: RoundPolicy, panel: ResearchPanel, round_no: int, config: DemoConfig
) -> ResearchRound:
    """A round's policy researches and forecasts the research panel: its head, and the whole
    panel too in the rounds the claim compares (DemoConfig.research_round_panel_questions)."""
    spec, generation, version = policy
    return score_research_panel(
        load_backend(spec),
        generation,
        panel,
        round_no=round_no,
        policy_version=version,
        samples=config.panel_samples,
        seed=config.seed,
        head=config.research_panel_head(),
        with_whole=config.research_round_scores_whole(round_no),
    )
