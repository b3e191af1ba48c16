"""The demo's held-out panel comes from a world of its own, dated in the calendar the rounds
live in: its questions are not the live world's, and their dates are no further from the
rounds' than the live questions' own (a panel of far-future dates measured the policy on
date tokens it never saw: 0.61 of one version's answers parsed there, 0.99 in 2026)."""

from __future__ import annotations

from flows.demo.config import DemoConfig
from flows.demo.kinds import build_kind_panel
from flows.demo.panel import (
    PANEL_QUESTIONS_PER_DAY,
    as_harvested,
    build_panel,
    panel_seed,
    panel_world,
)
from futureworld.domain import QuestionKind
from futureworld.world import World


def test_the_panel_is_another_worlds_questions_in_the_rounds_calendar() -> None:
    config = DemoConfig(research=False, kinds=(QuestionKind.BINARY, QuestionKind.CHOICE))
    live = World(config.world_config(seed=3, questions_per_day=config.questions_per_day))
    source = panel_world(config.world_config(seed=3), 600)
    assert source.config.seed == panel_seed(3) != 3 and source.config.cancel_rate == 0.0
    assert source.config.questions_per_day == PANEL_QUESTIONS_PER_DAY

    panel = build_panel(source, 600)
    assert len(panel) == 600 and panel == build_panel(source, 600)  # fixed, round after round
    days = -(-600 // PANEL_QUESTIONS_PER_DAY)
    first, last = live.day_start(0), live.day_start(days + config.max_horizon_days + 30)
    assert all(first <= item.question.info_cutoff_at <= last for item in panel)
    assert min(item.question.info_cutoff_at for item in panel) < live.day_start(2)

    live_titles = {
        as_harvested(live, sim.external_id).title
        for day in range(config.rounds)
        for sim in live.questions_posed_on(day)
    }
    shared = sum(item.question.title in live_titles for item in panel)
    assert shared <= 0.05 * len(panel), shared  # chance coincidences of entity, event and date

    kinds = build_kind_panel(source, QuestionKind.CHOICE, 50)
    assert all(first <= item.question.info_cutoff_at <= last for item in kinds)
