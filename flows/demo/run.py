"""`futureworld demo`: the whole delayed-reward loop on the simulated world, offline, on CPU.

tiny model from a config → SFT warm start on an over-confident (and noisy) reference
forecaster → R rounds of the daily cycle through the Prefect flows (harvest from the world's
RSS feeds and Manifold-compatible API over loopback → resolve → backfill → replay-and-train on
the groups that resolved, stale or not → predict) while the simulated clock advances a day per
round, and after each cycle the round's policy forecasts a fixed held-out panel → per-round
metrics and a report folder.

The defaults were tuned with benchmarks/learning_curve.py so that a 64-wide, 2-layer model
visibly learns on 2 CPU cores: brief prompts (the title states the cue), dr_grpo at lr 1e-3
with 40 rollouts (5 questions) per optimiser step and the AdamW moments carried from version
to version; a group's rollouts share a training row of up to 2048 tokens, so its prompt is
forwarded once (futureworld.rl.forward). The panel is large (2000 questions, one
sample each) because the claim is judged on realised outcomes: calibration is worth a few
hundredths of Brier, and only a big panel, compared pairwise, tells that from luck.
Everything lives under `--out`; a rerun starts afresh, and `--resume` continues a demo killed
after its warm start from where it stopped (flows.demo.resume). `out/demo.log` gets one line per
round (elapsed time, policy version, the panel's Brier and ECE), written as the round ends,
so progress is visible in a log whether or not anyone watches a terminal.

A round's panels are scored in a worker process while the next round's cycle runs
(flows.demo.rounds): on 2 cores a round costs about the longer of the two rather than their
sum. At most one panel is in flight; its log line is written when it finishes, one cycle
later. Each of the two takes half the cores for torch's threads (FW_TORCH_THREADS overrides):
torch's default of every core each would have them fight over the same two.

`kinds` (`--kinds binary,choice,numeric`) has the world also pose choice and numeric questions
(`kind_questions_per_day` of each a day): they are harvested, forecast, resolved and rewarded
like the binary ones, the warm start adds the reference's answers to them, each round's
update trains every question on its own kind's reward (brier, rlcr, crps), answers get
`kind_max_new_tokens` tokens, and each round's policy is also scored on a held-out panel per
kind (flows.demo.kinds). Binary questions are always posed; the default (binary only) demo
runs exactly as it did before kinds existed.

`research` (`--research`) runs the demo on a research world (no question states its cue; its
evidence articles do): the learner answers in up to `research_max_turns` brief turns with
search and open (the daily cycle's predict searches the demo's SQLite store of harvested
articles), the warm start is the rollout engine's own trajectories of a scripted reference
researcher over the warm world's articles (flows.demo.researcher), and each round's policy
researches a held-out research panel over its world's articles (flows.demo.research_panel);
the report adds each round's research rates, both floors and the gap closed. With `kinds`
on a research world, the choice and numeric questions are researched too: the reference
researches them in the warm start (flows.demo.researcher), the panel world poses them and
each round researches their panels over the same corpus (flows.demo.research_panel), scored
and reported as without research (their floor there is the true distribution's score, below
the informed one). Every report lists the versions and the promotion gate's verdicts; the
gate holds out `validation_fraction` of the live questions (FW_VALIDATION_FRACTION of the
flows) and is sized by `DemoConfig.gate_sizes` (FW_GATE_*: smaller on the research world,
whose rollouts are several turns).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, WARM_START_VERSION, DemoConfig
from flows.demo.gate_report import LineageRow, lineage_report, lineage_rows
from flows.demo.kind_report import KindClaim, kind_claim, kind_report
from flows.demo.kind_scores import KindPanelScore
from flows.demo.kinds import build_kind_panel
from flows.demo.panel import (
    CYCLE_HOUR,
    PanelScore,
    build_panel,
    panel_world,
)
from flows.demo.report import (
    LearningClaim,
    RoundLog,
    RoundMetrics,
    learning_claim,
    panel_brier_ece,
    round_metrics,
    write_report,
)
from flows.demo.research_panel import (
    ResearchRound,
    build_research_panel,
    claim_scores,
    demonstration_research,
    live_research,
)
from flows.demo.research_report import (
    ResearchSummary,
    research_header,
    research_report,
    research_summary,
)
from flows.demo.resume import DATABASE, DemoState, load_state
from flows.demo.rounds import (
    ROUND_PROCESSES,
    RoundPolicy,
    RoundScores,
    panel_scorer,
    round_policy,
    score_research_round,
    score_round,
)
from flows.demo.warm_start import warm_start
from flows.settings import Settings
from flows.stages.promotion import version_lineage
from flows.tracking import Tracker, log_version_scores, open_tracker
from futureworld.domain import QuestionKind
from futureworld.torch_threads import torch_thread_count
from storage.engine import session_scope


@dataclass(frozen=True)
class DemoResult:
    rounds: list[RoundMetrics]
    report: Path
    out_dir: Path
    claim: LearningClaim | None
    kind_scores: dict[QuestionKind, list[KindPanelScore]] = field(default_factory=dict)
    """Each extra kind's panel score per round."""
    kind_claims: dict[QuestionKind, KindClaim | None] = field(default_factory=dict)
    research: ResearchSummary | None = None
    """The research demo's per-round research and floors (None with research off)."""
    lineage: list[LineageRow] = field(default_factory=list)
    """Every version of the learner: status, the gate's verdict, the rounds that served it."""

    @property
    def learned(self) -> bool:
        return self.claim is not None and self.claim.learned


Progress = Callable[[str, int, int], None]
"""progress(step description, completed, total)."""


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoResult:
    from flows.orchestration.pipeline import daily_cycle_flow, resolve_and_backfill_flow
    from futureworld.world import SimClock, World, serve_world

    report = progress or (lambda _step, _done, _total: None)
    total = config.rounds + 3
    out_dir = config.out_dir.resolve()
    state = out_dir / "state"
    # A resume is refused before anything in the state changes (flows.demo.resume).
    saved = load_state(state, config) if config.resume else None
    if saved is None:
        if state.exists():
            shutil.rmtree(state)
        state.mkdir(parents=True)
    else:
        saved.restore_database()
    world = World(
        config.world_config(
            seed=config.seed,
            questions_per_day=config.questions_per_day,
            max_horizon_days=config.max_horizon_days,
        )
    )
    panels_from = panel_world(config.world_config(seed=config.seed), config.panel_questions)
    start_at = world.day_start(0) + timedelta(hours=CYCLE_HOUR)
    clock = SimClock(start_at)
    settings = Settings(
        data_dir=state,
        db_url=f"sqlite:///{state / DATABASE}",
        validation_fraction=config.validation_fraction,
        **config.gate_sizes,
    )
    if config.report_to is not None:
        settings = settings.model_copy(update={"report_to": config.report_to})

    if saved is None:
        report("tiny model and SFT warm start", 0, total)
        demonstrations = warm_start(config, settings, as_of=clock.now())
        saved = DemoState.start(
            state,
            config,
            warm_start_version=WARM_START_VERSION,
            demonstration_research=demonstration_research(demonstrations)
            if config.research
            else None,
        )
        resumed = ""
    else:
        resumed = (
            f"resuming {state}: warm start v{saved.warm_start_version} kept, {saved.cycled} "
            f"of {config.rounds} rounds cycled, {len(saved.scored_rounds())} panel scores kept"
        )
        report(resumed, 1 + saved.cycled, total)
    # The warm start had the cores to itself; each round's cycle shares them with its panel
    # scorer's process, the flows through FW_TORCH_THREADS, the scorer through the spec.
    threads = torch_thread_count(workers=ROUND_PROCESSES, override=settings.torch_threads)
    settings = settings.model_copy(update={"torch_threads": threads})
    engine = open_engine(settings)
    ctx = build_context(settings, engine, as_of=clock.now())

    research_panel = None
    if config.research:
        panel = []
        research_panel = build_research_panel(
            config.world_config(seed=config.seed, max_horizon_days=config.max_horizon_days),
            config.research_panel_questions,
            config.questions_per_day,
            kind_n=config.kind_panel_questions,
        )
        kind_panels = {}  # researched with the research panel, over its world's corpus
    else:
        panel = build_panel(panels_from, config.panel_questions)
        kind_panels = {
            kind: build_kind_panel(panels_from, kind, config.kind_panel_questions)
            for kind in config.extra_kinds
        }
    panels: list[PanelScore] = []
    research_rounds: list[ResearchRound] = []
    kind_scores: dict[QuestionKind, list[KindPanelScore]] = {k: [] for k in config.extra_kinds}
    log_path = out_dir / "demo.log"
    earlier = log_path.read_text() if resumed and log_path.exists() else ""
    round_log = RoundLog(log_path)
    if resumed:  # the killed run's lines stay, then the resume says what it kept
        log_path.write_text(f"{earlier}{resumed}\n")

    tracker = open_tracker(settings, LEARNER, "demo-panel", _tracked_config(config))

    def record(scores: RoundScores | ResearchRound, *, kept: bool = False) -> None:
        panel = scores.score if isinstance(scores, ResearchRound) else scores[0]
        log_version_scores(tracker, panel.round, panel_scores(panel), prefix="demo")
        if isinstance(scores, ResearchRound):
            panels.append(scores.score)
            research_rounds.append(scores)
            for score in scores.kinds:
                kind_scores[score.kind].append(score)
        else:
            panels.append(scores[0])
            for kind, score in scores[1].items():
                kind_scores[kind].append(score)
        if kept:
            return
        if isinstance(scores, ResearchRound):
            round_log.write(scores.score, list(scores.kinds), research=scores)
        else:
            round_log.write(scores[0], list(scores[1].values()))
        saved.round_scored(scores)

    for scores in saved.scored_rounds():
        record(scores, kept=True)

    with (
        _finished(tracker),
        serve_world(world, clock) as server,
        _flow_environment(settings, server),
        panel_scorer() as scorer,
    ):

        def submit(policy: RoundPolicy, round_no: int) -> Future:
            if research_panel is not None:
                return scorer.submit(score_research_round, policy, research_panel, round_no, config)
            return scorer.submit(score_round, policy, panel, kind_panels, round_no, config)

        scoring: Future | None = None
        for left in saved.unscored_rounds():
            # A resumed round whose panel was in flight: scored from the version it served.
            policy = round_policy(ctx, LEARNER, left.policy_version)
            if scoring is not None:
                record(scoring.result())
            scoring = submit(policy, left.round)
        for r in range(saved.cycled, config.rounds):
            clock.set(start_at + timedelta(days=r))
            report(f"round {r}: daily cycle on {clock.now().date()}", 1 + r, total)
            daily_cycle_flow(
                as_of=clock.now().isoformat(),
                sources=["manifold"],
                feeds=[server.feed_urls["all"]],
                samples=config.samples,
                train=config.update,
            )
            # The round's policy is scored while the next cycle runs (one panel in flight:
            # each round waits for the previous round's scores).
            policy = round_policy(ctx, LEARNER)
            saved.round_cycled(r, policy[2])
            if scoring is not None:
                record(scoring.result())
            scoring = submit(policy, r)
        if scoring is not None:
            record(scoring.result())
        report("final resolution and the report", 1 + config.rounds, total)
        clock.set(start_at + timedelta(days=config.rounds + config.max_horizon_days + 1))
        resolve_and_backfill_flow(as_of=clock.now().isoformat())

    start_day = world.day_start(0).date()

    def round_of(at: datetime) -> int:
        return (at.date() - start_day).days

    metrics = round_metrics(ctx.at(clock.now()), LEARNER, panels, round_of=round_of)
    header = (
        f"# FutureWorld demo\n\nseed {config.seed}; {config.rounds} rounds; "
        f"{config.questions_per_day} questions/day, G = {config.samples}, horizons 1–"
        f"{config.max_horizon_days} days; estimator {config.estimator}. Each round's policy is "
        f"scored on the same held-out panel of {config.panel_questions} questions × "
        f"{config.panel_samples} sample{'s' if config.panel_samples > 1 else ''}; the true-p "
        "Brier is the floor."
    )
    ends = claim_scores(research_rounds) if config.research else [panels[0], panels[-1]]
    claim = learning_claim(ends)
    kind_claims = {kind: kind_claim(scores) for kind, scores in kind_scores.items()}
    extra_markdown, extra_json = kind_report(kind_scores, kind_claims, out_dir)
    sections: dict[str, object] = {}
    research = None
    if config.research:
        header = research_header(config)
        assert saved.demonstration_research is not None
        with session_scope(engine) as session:
            live = live_research(session, ctx.agent(LEARNER).id or 0, world, round_of)
        research = research_summary(research_rounds, saved.demonstration_research, live)
        research_markdown, sections["research"] = research_report(research, out_dir)
        extra_markdown = "\n\n".join(m for m in (research_markdown, extra_markdown) if m)
    lineage = lineage_rows(version_lineage(ctx, LEARNER), metrics)
    lineage_markdown, sections["lineage"] = lineage_report(lineage, config.validation_fraction)
    path = write_report(
        out_dir,
        metrics,
        ends,
        claim,
        header=header,
        extra_markdown="\n\n".join(m for m in (extra_markdown, lineage_markdown) if m),
        extra_json=extra_json,
        sections=sections,
    )
    engine.dispose()
    report("done", total, total)
    return DemoResult(
        rounds=metrics,
        report=path,
        out_dir=out_dir,
        claim=claim,
        kind_scores=kind_scores,
        kind_claims=kind_claims,
        research=research,
        lineage=lineage,
    )


def panel_scores(score: PanelScore) -> dict[str, float]:
    """A round's panel figures for the tracker (under demo/, x-axis the round)."""
    scores = {"panel/parse_rate": score.parse_rate, "panel/policy_version": score.policy_version}
    if score.p_yes:  # a round may parse nothing
        scores["panel/brier"], scores["panel/ece"] = panel_brier_ece(score)
    return scores


def _tracked_config(config: DemoConfig) -> dict[str, Any]:
    return {
        "seed": config.seed,
        "rounds": config.rounds,
        "research": config.research,
        "validation_fraction": config.validation_fraction,
        "train": config.update.config.to_json(),
    }


@contextmanager
def _finished(tracker: Tracker) -> Iterator[None]:
    """The demo's tracker run, finished when the rounds end (marked failed on an error)."""
    try:
        yield
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()


@contextmanager
def _flow_environment(settings: Settings, server: Any) -> Iterator[None]:
    """The Prefect flows build their settings from the environment: point them at the demo's
    database and world, and hold out the demo's validation share for the promotion gate at
    the demo's gate sizes, for the duration of the rounds, then put the environment back."""
    values = {
        "FW_VALIDATION_FRACTION": repr(settings.validation_fraction),
        "FW_GATE_MAX_QUESTIONS": str(settings.gate_max_questions),
        "FW_GATE_MAX_UNRESOLVED": str(settings.gate_max_unresolved),
        "FW_GATE_MAX_TRAINED": str(settings.gate_max_trained),
        "FW_DATA_DIR": str(settings.data_dir),
        "FW_DB_URL": settings.database_url,
        "FW_MANIFOLD_BASE_URL": server.manifold_base_url,
        "FW_HTTP_RATE_PER_S": "0",  # the world is on loopback: no politeness delay
        "FW_REPORT_TO": str(settings.report_to),  # every update logs to the demo's tracker
        "FW_TRACKING_DIR": str(settings.tracking_root),
    }
    if settings.torch_threads is not None:
        values["FW_TORCH_THREADS"] = str(settings.torch_threads)
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
