"""The kinds demo's parts, fast: its choice and numeric panels as the harvest sees them,
their scores against a slow reference, the paired claim, the reference forecaster of the warm
start, the per-kind rewards of its update; and the default demo keeps its binary settings."""

from __future__ import annotations

import json
import math
import random

import pytest

from flows.demo.config import DemoConfig
from flows.demo.kind_report import kind_claim
from flows.demo.kinds import build_kind_panel, score_kind_panel
from flows.stages.training import TrainOptions, _merged_replay_batch
from futureworld import scoring
from futureworld.domain import (
    QUANTILE_LEVELS,
    GenerationSettings,
    QuestionKind,
    ReplayBatch,
    ScoredRollout,
    Trajectory,
)
from futureworld.policy.base import FinishReason, Generation
from futureworld.policy.local import LocalBackend
from futureworld.policy.streaming import SequentialStream
from futureworld.policy.tiny import init_tiny_model
from futureworld.rewards import RewardFn
from futureworld.rl.config import TrainConfig
from futureworld.world import SimChoiceQuestion, SimNumericQuestion, World, WorldConfig
from futureworld.world.reference import choice_reference, kind_sft_examples, numeric_reference

WORLD = World(
    WorldConfig(
        seed=3, questions_per_day=2, choice_questions_per_day=3, numeric_questions_per_day=3
    )
)
SETTINGS = GenerationSettings(max_turns=1, max_new_tokens=64, brief_prompt=True)
CHOICE = "<probabilities>A: 0.7, B: 0.1, C: 0.1, D: 0.1</probabilities>"
NUMERIC = "<quantiles>5%: 60, 25%: 80, 50%: 100, 75%: 120, 95%: 140</quantiles>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return LocalBackend.from_pretrained(init_tiny_model(tmp_path_factory.mktemp("m"))).tokenizer


class FixedAnswers:
    """A stand-in model that answers every choice question with CHOICE and every numeric one
    with NUMERIC, telling them apart by the stop strings of the request."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    @property
    def tokenizer(self):
        return self._tokenizer

    def describe(self) -> str:
        return "fixed"

    def open_stream(self) -> SequentialStream:
        return SequentialStream(self.generate)

    def generate(self, prompts, params):
        text = CHOICE if "</probabilities>" in params.stop else NUMERIC
        ids = tuple(self._tokenizer.encode(text, add_special_tokens=False))
        return [
            Generation(token_ids=ids, logprobs=(-0.1,) * len(ids), finish_reason=FinishReason.STOP)
            for _ in prompts
        ]


def test_kind_panels_hold_the_worlds_questions_as_harvested() -> None:
    for kind, sim_type in (
        (QuestionKind.CHOICE, SimChoiceQuestion),
        (QuestionKind.NUMERIC, SimNumericQuestion),
    ):
        panel = build_kind_panel(WORLD, kind, 7)
        assert len(panel) == 7 and len({p.question.external_id for p in panel}) == 7
        for n, item in enumerate(panel):
            assert item.question.kind is kind and item.question.id == -(n + 1)
            assert isinstance(item.sim, sim_type)
            assert item.question.title == item.sim.title
            assert item.question.crowd_forecast is not None
    again = build_kind_panel(WORLD, QuestionKind.NUMERIC, 7)
    assert [p.question for p in again] == [p.question for p in panel]  # deterministic


def test_kind_panel_scores_equal_a_slow_reference(tokenizer) -> None:
    backend = FixedAnswers(tokenizer)
    choice_panel = build_kind_panel(WORLD, QuestionKind.CHOICE, 6)
    score = score_kind_panel(
        backend, SETTINGS, QuestionKind.CHOICE, choice_panel, round_no=0, policy_version=1, seed=0
    )
    assert score.parse_rate == 1.0 and score.question == tuple(range(6))
    forecast = (0.7, 0.1, 0.1, 0.1)
    for s, item in zip(score.score, choice_panel, strict=True):
        y = int(item.outcome)
        assert s == pytest.approx(sum((p - (i == y)) ** 2 for i, p in enumerate(forecast)))
    truth = [
        sum((p - (i == int(it.outcome))) ** 2 for i, p in enumerate(it.sim.probabilities))
        for it in choice_panel
    ]
    assert score.true_score == pytest.approx(sum(truth) / len(truth))
    hits = [float(int(item.outcome) == 0) for item in choice_panel]
    assert score.calibration == pytest.approx(scoring.expected_calibration_error([0.7] * 6, hits))

    numeric_panel = build_kind_panel(WORLD, QuestionKind.NUMERIC, 6)
    score = score_kind_panel(
        backend, SETTINGS, QuestionKind.NUMERIC, numeric_panel, round_no=0, policy_version=1, seed=0
    )
    quantiles = (60.0, 80.0, 100.0, 120.0, 140.0)
    for s, item in zip(score.score, numeric_panel, strict=True):
        upper = item.question.numeric_spec.upper
        slow = (
            sum(
                (float(item.outcome <= q) - t) * (q - item.outcome)
                for t, q in zip(QUANTILE_LEVELS, quantiles, strict=True)
            )
            * 2
            / len(QUANTILE_LEVELS)
            / upper
        )
        assert s == pytest.approx(slow)
    inside = [60.0 <= item.outcome <= 140.0 for item in numeric_panel]
    assert score.calibration == pytest.approx(sum(inside) / 6)


def test_the_claim_is_paired_and_needs_its_interval_below_zero(tokenizer) -> None:
    backend = FixedAnswers(tokenizer)
    panel = build_kind_panel(WORLD, QuestionKind.CHOICE, 8)
    first = score_kind_panel(
        backend, SETTINGS, QuestionKind.CHOICE, panel, round_no=0, policy_version=1, seed=0
    )
    same = kind_claim([first, first])
    assert same is not None and same.score.difference == 0.0 and not same.improved
    better = type(first)(
        **{**first.__dict__, "round": 1, "score": tuple(s / 2 for s in first.score)}
    )
    claim = kind_claim([first, better])
    assert claim is not None and claim.improved and claim.score.ci[1] < 0
    assert "improved" in claim.summary()


def test_the_reference_is_over_confident_in_every_kind() -> None:
    examples = kind_sft_examples(WORLD, 2, sharpening=3.0)
    assert {e.question.kind for e in examples} == {QuestionKind.CHOICE, QuestionKind.NUMERIC}
    for day in range(2):
        for sim in WORLD.kind_questions_posed_on(day):
            if isinstance(sim, SimChoiceQuestion):
                p = choice_reference(sim, sharpening=3.0)
                assert math.isclose(sum(p), 1.0, abs_tol=1e-3)
                assert p[sim.favourite] >= sim.probabilities[sim.favourite]
                assert choice_reference(sim, sharpening=1.0) == pytest.approx(
                    sim.probabilities, abs=1e-3
                )
            else:
                q = numeric_reference(sim, sharpening=3.0)
                truth = sim.true_quantiles()
                assert q[4] - q[0] < truth[4] - truth[0]
                assert q == tuple(sorted(q))
    rng = random.Random(0)
    with pytest.raises(ValueError, match="sharpening"):
        choice_reference(examples_sim(), sharpening=0.0, rng=rng)


def examples_sim() -> SimChoiceQuestion:
    return next(s for s in WORLD.kind_questions_posed_on(0) if isinstance(s, SimChoiceQuestion))


def test_the_one_turn_demo_keeps_its_binary_settings_and_kinds_add_rewards() -> None:
    default = DemoConfig(research=False)
    assert default.kinds == (QuestionKind.BINARY,)
    assert default.generation.max_new_tokens == 12 and default.update.kind_rewards == ()
    assert default.world_config(seed=0) == WorldConfig(seed=0)
    kinds = DemoConfig(research=False, kinds=("binary", "choice", "numeric"))
    assert kinds.update.rewards == (RewardFn.BRIER, RewardFn.RLCR, RewardFn.CRPS)
    assert kinds.generation.max_new_tokens == kinds.kind_max_new_tokens
    world = kinds.world_config(seed=0)
    assert world.choice_questions_per_day == world.numeric_questions_per_day == 10
    with pytest.raises(ValueError, match="binary"):
        DemoConfig(kinds=("choice",))
    with pytest.raises(ValueError, match="one reward per question kind"):
        TrainOptions(
            config=TrainConfig(reward_fn=RewardFn.BRIER), kind_rewards=(RewardFn.LOG_SCORE,)
        )


def _group(question_id: int, created: int) -> tuple[ScoredRollout, ...]:
    from datetime import UTC, datetime, timedelta

    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=created)
    return tuple(
        ScoredRollout(
            trajectory=Trajectory(
                question_id=question_id,
                agent_id=1,
                policy_version=0,
                sample_index=s,
                created_at=at,
                id=10 * question_id + s,
            ),
            reward=-0.1,
            outcome_value=1.0,
            outcome_revision=1,
            staleness=0,
        )
        for s in range(2)
    )


def test_groups_of_several_rewards_merge_in_replay_order() -> None:
    binary = ReplayBatch(groups=(_group(1, 0), _group(2, 5)), skipped_small_groups=1)
    choice = ReplayBatch(groups=(_group(3, 2), _group(4, 9)), remaining_groups=2)
    merged = _merged_replay_batch([binary, choice], max_groups=3)
    assert [g[0].trajectory.question_id for g in merged.groups] == [1, 3, 2]
    assert merged.skipped_small_groups == 1 and merged.remaining_groups == 3
    assert _merged_replay_batch([binary], None) is binary


def test_the_demo_command_refuses_unknown_or_binaryless_kinds(tmp_path) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    for kinds, message in (("binary,dice", "dice"), ("choice,numeric", "binary")):
        result = CliRunner().invoke(app, ["demo", "--kinds", kinds, "--out", str(tmp_path)])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "state").exists()  # refused before anything ran


def test_the_kinds_demo_runs_end_to_end(prefect_harness, tmp_path) -> None:
    """`futureworld demo --kinds binary,choice,numeric` at a small size: the world poses the
    three kinds, the warm start, cycles and updates carry them, and every round scores a panel
    per kind into the report (mechanics only: this size cannot show learning)."""
    from flows.demo.run import run_demo

    config = DemoConfig(
        out_dir=tmp_path / "demo",
        research=False,
        kinds=("binary", "choice", "numeric"),
        rounds=2,
        questions_per_day=6,
        samples=2,
        panel_questions=40,
        kind_questions_per_day=4,
        kind_panel_questions=12,
        sft_days=2,
        sft_epochs=2,
    )
    result = run_demo(config)
    assert [m.round for m in result.rounds] == [0, 1]
    assert set(result.kind_scores) == {QuestionKind.CHOICE, QuestionKind.NUMERIC}
    for kind, rounds in result.kind_scores.items():
        assert [r.round for r in rounds] == [0, 1]
        assert all(len(r.score) + r.unparsed == 12 for r in rounds), kind
    metrics = json.loads((result.out_dir / "metrics.json").read_text())
    assert {"choice", "numeric"} <= set(metrics["kinds"])
    for kind in ("choice", "numeric"):
        assert (result.out_dir / f"{kind}_by_round.png").stat().st_size > 0
    assert "Choice and numeric questions" in (result.out_dir / "report.md").read_text()
