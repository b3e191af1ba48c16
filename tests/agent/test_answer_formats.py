"""The choice and numeric answer formats: property tests of the parsers (hypothesis), each
failure's parse status, and the per-kind actions and stop strings."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureworld.agent.parsing import (
    ACTION_STOP_STRINGS,
    ActionKind,
    action_stop_strings,
    parse_action,
    parse_final_answer,
)
from futureworld.answers import ANSWER_FORMATS
from futureworld.domain import (
    CHOICE_SUM_TOLERANCE,
    QUANTILE_LEVELS,
    NumericSpec,
    ParseStatus,
    Question,
    QuestionKind,
)

AT = datetime(2026, 3, 1, tzinfo=UTC)
CHOICE = ANSWER_FORMATS[QuestionKind.CHOICE]
NUMERIC = ANSWER_FORMATS[QuestionKind.NUMERIC]


def choice_question(n_options: int = 3) -> Question:
    return Question(
        source="sim",
        external_id="c1",
        title="Which team wins?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=QuestionKind.CHOICE,
        options=tuple(f"team {i}" for i in range(n_options)),
    )


def numeric_question(spec: NumericSpec | None = None) -> Question:
    spec = spec or NumericSpec(lower=0.0, upper=100.0, unit="units")
    return Question(
        source="sim",
        external_id="n1",
        title="How many?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=QuestionKind.NUMERIC,
        extra=spec.to_extra(),
    )


@st.composite
def choice_vectors(draw: st.DrawFn) -> list[float]:
    n = draw(st.integers(min_value=2, max_value=8))
    weights = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n).filter(any))
    total = sum(weights)
    return [w / total for w in weights]


@given(probabilities=choice_vectors(), lower=st.booleans())
def test_any_written_distribution_parses_back_normalised(probabilities: list[float], lower: bool):
    question = choice_question(len(probabilities))
    text = CHOICE.write(tuple(probabilities), question)
    if lower:
        text = text.replace("A:", "a:")
    answer = parse_final_answer(f"So: {text}", question)
    assert answer.status is ParseStatus.OK
    written = [round(p, 2) for p in probabilities]
    assert answer.probabilities == pytest.approx([w / sum(written) for w in written])
    assert math.fsum(answer.probabilities) == pytest.approx(1.0)
    best = max(answer.probabilities)
    assert answer.choice == answer.probabilities.index(best)  # the lowest label on ties
    assert answer.p_yes == best and answer.quantiles == ()


@given(scale=st.floats(min_value=0.0, max_value=3.0), n=st.integers(2, 6))
def test_sums_near_one_are_renormalised_and_others_are_bad_sums(scale: float, n: int):
    written = [f"{scale / n:.6f}"] * n
    text = "<probabilities>" + ", ".join(f"{chr(65 + i)}: {p}" for i, p in enumerate(written))
    answer = parse_final_answer(text + "</probabilities>", choice_question(n))
    total = math.fsum(float(p) for p in written)
    if total > 0 and abs(total - 1.0) <= CHOICE_SUM_TOLERANCE:
        assert answer.status is ParseStatus.OK
        assert answer.probabilities == pytest.approx([1 / n] * n)
    elif abs(abs(total - 1.0) - CHOICE_SUM_TOLERANCE) > 1e-9:
        assert answer.status in (ParseStatus.BAD_SUM, ParseStatus.OUT_OF_RANGE)
        assert (answer.status is ParseStatus.OUT_OF_RANGE) == (float(written[0]) > 1.0)


@pytest.mark.parametrize(
    ("content", "status"),
    [
        ("A: 0.5, B: 0.5", ParseStatus.OK),
        ("A: 1", ParseStatus.OK),  # options left out have probability 0
        ("A: 0.5; B: 0.3\nC: 0.2", ParseStatus.OK),
        ("A: 0.5, D: 0.5", ParseStatus.UNKNOWN_OPTION),
        ("A: 0.5, A: 0.5", ParseStatus.DUPLICATE),
        ("A: 0.2, B: 0.2", ParseStatus.BAD_SUM),
        ("A: 0, B: 0", ParseStatus.BAD_SUM),
        ("A: 1.5", ParseStatus.OUT_OF_RANGE),
        ("A: 50%, B: 50%", ParseStatus.MALFORMED),
        ("A 0.5, B 0.5", ParseStatus.MALFORMED),
        ("", ParseStatus.MALFORMED),
    ],
)
def test_each_choice_failure_has_its_status(content: str, status: ParseStatus):
    answer = parse_final_answer(f"<probabilities>{content}</probabilities>", choice_question())
    assert answer.status is status
    assert (answer.probabilities == ()) == (status is not ParseStatus.OK)


def test_missing_unclosed_and_other_kinds_tags_are_told_apart():
    question = choice_question()
    assert parse_final_answer("no idea", question).status is ParseStatus.MISSING
    assert parse_final_answer("<probabilities>A: 0.5", question).status is ParseStatus.MALFORMED
    wrong = parse_final_answer("<probability>0.4</probability>", question)
    assert wrong.status is ParseStatus.WRONG_FORMAT
    numeric = numeric_question()
    assert parse_final_answer("\\boxed{0.3}", numeric).status is ParseStatus.WRONG_FORMAT
    binary = Question(source="s", external_id="b", title="t", created_at=AT, info_cutoff_at=AT)
    assert parse_final_answer("<quantiles>5%: 1</quantiles>", binary).status is (
        ParseStatus.WRONG_FORMAT
    )
    assert parse_final_answer("<probability>0.4</probability>", binary).p_yes == 0.4
    later = "<probabilities>A: 1</probabilities> no: <probabilities>B: 1</probabilities>"
    assert parse_final_answer(later, question).choice == 1  # the last answer counts


sorted_values = st.lists(
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=5, max_size=5
).map(sorted)


@given(values=sorted_values, shuffle=st.randoms(use_true_random=False))
def test_monotone_quantiles_within_bounds_parse_back_in_any_order(values: list[float], shuffle):
    entries = [
        f"{round(level * 100)}%: {v!r}" for level, v in zip(QUANTILE_LEVELS, values, strict=True)
    ]
    shuffle.shuffle(entries)
    answer = parse_final_answer(f"<quantiles>{', '.join(entries)}</quantiles>", numeric_question())
    assert answer.status is ParseStatus.OK
    assert answer.quantiles == tuple(values)
    assert answer.p_yes is None and answer.choice is None


@given(values=sorted_values)
def test_canonical_quantile_text_round_trips(values: list[float]):
    spec = NumericSpec(lower=0.0, upper=100.0)
    text = NUMERIC.write(tuple(values), numeric_question(spec))
    assert parse_final_answer(text, numeric_question(spec)).quantiles == tuple(values)


@given(values=sorted_values, i=st.integers(0, 3))
def test_decreasing_quantiles_are_not_monotone(values: list[float], i: int):
    if values[i] == values[i + 1]:
        values[i + 1] += 1.0
    values[i], values[i + 1] = values[i + 1], values[i]
    text = NUMERIC.write(tuple(values), numeric_question(NumericSpec(lower=0.0, upper=200.0)))
    assert parse_final_answer(text, numeric_question()).status is ParseStatus.NOT_MONOTONE


@given(text=st.text())
def test_arbitrary_text_never_raises(text: str):
    for question in (choice_question(), numeric_question()):
        answer = parse_final_answer(text, question)
        assert answer.status in set(ParseStatus)
        if "<quantiles>" not in text and "<probabilities>" not in text:
            assert answer.status in (ParseStatus.MISSING, ParseStatus.WRONG_FORMAT)


@pytest.mark.parametrize(
    ("content", "spec", "status"),
    [
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4, 95%: 5", None, ParseStatus.OK),
        ("5%: 1e1, 25%: 2E1, 50%: 30, 75%: 40, 95%: 50", None, ParseStatus.OK),
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4", None, ParseStatus.WRONG_LEVELS),
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4, 90%: 5", None, ParseStatus.WRONG_LEVELS),
        ("5%: 1, 5%: 2, 50%: 3, 75%: 4, 95%: 5", None, ParseStatus.DUPLICATE),
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4, 95%: 500", None, ParseStatus.OUT_OF_RANGE),
        ("5%: -1, 25%: 2, 50%: 3, 75%: 4, 95%: 5", None, ParseStatus.OUT_OF_RANGE),
        (
            "5%: -1, 25%: 2, 50%: 3, 75%: 4, 95%: 500",
            NumericSpec(lower=0, upper=100, open_lower=True, open_upper=True),
            ParseStatus.OK,
        ),
        (
            "5%: 0, 25%: 2, 50%: 3, 75%: 4, 95%: 5",
            NumericSpec(lower=1, upper=1000, open_lower=True, log_scale=True),
            ParseStatus.OUT_OF_RANGE,
        ),
        ("5%: ten, 25%: 2, 50%: 3, 75%: 4, 95%: 5", None, ParseStatus.MALFORMED),
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4, 95%: inf", None, ParseStatus.MALFORMED),
        ("5: 1, 25: 2, 50: 3, 75: 4, 95: 5", None, ParseStatus.MALFORMED),
        ("5%: 1, 25%: 2, 50%: 3, 75%: 4, 95%: 2026-01-01", None, ParseStatus.MALFORMED),
    ],
)
def test_each_quantile_failure_has_its_status(
    content: str, spec: NumericSpec | None, status: ParseStatus
):
    answer = parse_final_answer(f"<quantiles>{content}</quantiles>", numeric_question(spec))
    assert answer.status is status


def test_date_questions_answer_with_dates_on_the_time_axis():
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 12, 31, tzinfo=UTC)
    spec = NumericSpec(lower=start.timestamp(), upper=end.timestamp(), time_axis=True)
    days = ("2026-02-01", "2026-03-01", "2026-03-15", "2026-04-01", "2026-06-30")
    text = "<quantiles>" + ", ".join(
        f"{round(level * 100)}%: {day}" for level, day in zip(QUANTILE_LEVELS, days, strict=True)
    )
    answer = parse_final_answer(text + "</quantiles>", numeric_question(spec))
    assert answer.status is ParseStatus.OK
    assert answer.quantiles[2] == datetime(2026, 3, 15, tzinfo=UTC).timestamp()
    assert NUMERIC.write(answer.quantiles, numeric_question(spec)) == text + "</quantiles>"
    late = text.replace("2026-06-30", "2027-06-30") + "</quantiles>"
    assert parse_final_answer(late, numeric_question(spec)).status is ParseStatus.OUT_OF_RANGE


def test_actions_and_stop_strings_follow_the_question_kind():
    assert action_stop_strings(QuestionKind.BINARY) == ACTION_STOP_STRINGS
    assert action_stop_strings(QuestionKind.CHOICE)[-1] == "</probabilities>"
    assert action_stop_strings(QuestionKind.NUMERIC)[-1] == "</quantiles>"
    text = "<probabilities>A: 1</probabilities>"
    assert parse_action(text, QuestionKind.CHOICE).kind is ActionKind.ANSWER
    assert parse_action(text, QuestionKind.CHOICE).argument == "A: 1"
    assert parse_action(text).kind is ActionKind.NONE  # binary: not its answer
    numeric = "<quantiles>5%: 1</quantiles>"
    assert parse_action(numeric, QuestionKind.NUMERIC).kind is ActionKind.ANSWER
    assert parse_action("<probability>0.2</probability>", QuestionKind.NUMERIC).kind is (
        ActionKind.NONE
    )
    assert parse_action("<search>x</search>", QuestionKind.CHOICE).kind is ActionKind.SEARCH
