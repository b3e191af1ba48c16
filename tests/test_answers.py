"""The answer-format registry: one entry per question kind; what each writes it parses back
(exactly, or within the canonical text's stated precision); every example parses and is the
one its system prompt shows; another kind's answer is WRONG_FORMAT; and the prompts are
byte-identical to those the agents learned (digests taken before the formats were one unit).
"""

from __future__ import annotations

import ast
import hashlib
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import futureworld.answers
from futureworld.agent.demonstrations import answer_text
from futureworld.agent.parsing import ActionKind, action_stop_strings, parse_action
from futureworld.agent.prompts import SYSTEM_PROMPTS, render_question
from futureworld.answers import ANSWER_FORMATS, parse_final_answer
from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)

AT = datetime(2026, 3, 1, 12, tzinfo=UTC)
DAY_S = 86_400.0
BINARY = ANSWER_FORMATS[QuestionKind.BINARY]
CHOICE = ANSWER_FORMATS[QuestionKind.CHOICE]
NUMERIC = ANSWER_FORMATS[QuestionKind.NUMERIC]


def question(kind: QuestionKind, **fields: object) -> Question:
    return Question(
        source="sim",
        external_id="x",
        title="Will it?",
        background="Because.",
        resolution_criteria="YES if so.",
        created_at=AT,
        info_cutoff_at=AT,
        resolve_by=AT + timedelta(days=40),
        kind=kind,
        id=1,
        **fields,  # type: ignore[arg-type]
    )


def choice_question(n_options: int = 3) -> Question:
    return question(QuestionKind.CHOICE, options=tuple(f"option {i}" for i in range(n_options)))


def numeric_question(spec: NumericSpec) -> Question:
    return question(QuestionKind.NUMERIC, extra=spec.to_extra())


DATES = NumericSpec(
    lower=datetime(2026, 4, 1, tzinfo=UTC).timestamp(),
    upper=datetime(2026, 6, 30, tzinfo=UTC).timestamp(),
    time_axis=True,
)
PROMPT_QUESTIONS = {
    "binary": question(QuestionKind.BINARY),
    "choice": question(QuestionKind.CHOICE, options=("Arden", "Borel", "Calder")),
    "ordered": question(
        QuestionKind.CHOICE, options=("0-9", "10+"), extra={"ordered_options": True}
    ),
    "numeric": numeric_question(NumericSpec(lower=0.0, upper=250.5, unit="mm")),
    "log": numeric_question(
        NumericSpec(
            lower=1.0, upper=1e6, open_lower=True, open_upper=True, log_scale=True, unit="USD"
        )
    ),
    "dates": numeric_question(DATES),
}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_registry_holds_one_format_per_kind() -> None:
    assert set(ANSWER_FORMATS) == set(QuestionKind)
    for kind, answers in ANSWER_FORMATS.items():
        assert answers.kind is kind
    closing = [answers.closing_tag for answers in ANSWER_FORMATS.values()]
    assert len(set(closing)) == len(closing)


# sha256 of each kind's system prompt, and of the system prompt, a NUL and the question
# message of PROMPT_QUESTIONS (full, brief), computed with the prompts of commit 79583cb,
# before the answer formats were one unit.
SYSTEM_PROMPT_DIGESTS = {
    QuestionKind.BINARY: "4f24f6313cfeb1fbfa1c2f95901a068c648b8d1e75c7531dd9e511a4e3bb636b",
    QuestionKind.CHOICE: "c19e0bd06c3fb5f8ff0b95a22e3e4d4b37a0e088de75362b0c2841569c8eaf86",
    QuestionKind.NUMERIC: "351f0378b38174fc398a3c32194e970317a658dd888d96b1ba2e108f6d023198",
}
PROMPT_DIGESTS = {
    ("binary", False): "ec30291630a0c09ffbaea5905dea96e55db09960cc2a07a8a2f8c321663faeb9",
    ("binary", True): "5da721f9e19ac2370849520f106affad74f53c42c1e31f846c10e2d852df3db0",
    ("choice", False): "39d8d4f84b4a7b482a0a7cd76d80903e8e0b70652640522dbe2c3107f1a13853",
    ("choice", True): "4addb0f16cb735ef71ef13e0bb4118c824d625010709b426a5df51e39395109e",
    ("ordered", False): "b302181ce575ba43b4c31c04b07c9066768f700b770987713d62acba322c52e4",
    ("ordered", True): "3809ad3d2b81840b02f24b51848a703c1321ed978c9a7377982cd4cb31e66fc7",
    ("numeric", False): "7d3632eb05a36f9b10fb2f570d46dd6c05722c7b4b53a268df2fabd8b8cc93b0",
    ("numeric", True): "e98ca54353888c8d3af5f4d980a7ea8250bd4058abc529ea81a9185f7014babe",
    ("log", False): "b4888ba2b2ceebbdadbe96866ad90a669b9af75d54682c87272f29e8110f9b0a",
    ("log", True): "7ba1dc9717bde0613921143d7a9ebf1db50c832b480cdac75125e6ff2fc66d5e",
    ("dates", False): "5f3cfc9b19ae7a55f907613dd5a16ae881a28926217c102adeff1a95f27b871b",
    ("dates", True): "0d8621e5a897e3e8841f90d69bc266fe49cde0be820d3a1ab0f808b850f9598c",
}
# sha256 of the demonstrations' canonical answers below, joined by newlines, as of 79583cb.
DEMONSTRATIONS_DIGEST = "3085ab146e045425aa480e1b000ea7376b5757fbcd0b918b03696a67c6fa9167"


def test_system_prompts_are_byte_identical_to_the_ones_the_agents_learned() -> None:
    assert {kind: sha256(SYSTEM_PROMPTS[kind]) for kind in QuestionKind} == SYSTEM_PROMPT_DIGESTS


def test_question_messages_are_byte_identical_to_the_ones_the_agents_learned() -> None:
    rendered = {
        (name, brief): sha256(
            SYSTEM_PROMPTS[q.kind] + "\x00" + render_question(q, as_of=AT, brief=brief)
        )
        for name, q in PROMPT_QUESTIONS.items()
        for brief in (False, True)
    }
    assert rendered == PROMPT_DIGESTS


def test_demonstration_answers_are_byte_identical_to_the_ones_the_agents_learned() -> None:
    binary = PROMPT_QUESTIONS["binary"]
    texts = [BINARY.write(k / 100, binary) for k in range(101)]
    texts += [answer_text(0.123456), answer_text(1 / 3)]
    texts += [
        CHOICE.write(f, PROMPT_QUESTIONS["choice"])
        for f in ((0.2, 0.5, 0.3), (1 / 3,) * 3, (0.125, 0.875))
    ]
    spans = (0.05, 0.25, 0.5, 0.75, 0.95)
    texts += [
        NUMERIC.write(
            (1.0, 2.5, 3.25, 100.0, 250.5), numeric_question(NumericSpec(lower=0.0, upper=250.5))
        ),
        NUMERIC.write(
            (1 / 3, 0.5, 1e17, 2e17, 3e17), numeric_question(NumericSpec(lower=0.0, upper=1e18))
        ),
        NUMERIC.write(
            tuple(DATES.lower + f * (DATES.upper - DATES.lower) for f in spans),
            numeric_question(DATES),
        ),
    ]
    assert sha256("\n".join(texts)) == DEMONSTRATIONS_DIGEST


EXAMPLE_QUESTIONS = {
    QuestionKind.BINARY: PROMPT_QUESTIONS["binary"],
    QuestionKind.CHOICE: choice_question(3),
    QuestionKind.NUMERIC: numeric_question(NumericSpec(lower=0.0, upper=100.0)),
}


@pytest.mark.parametrize("kind", list(QuestionKind))
def test_each_example_parses_is_in_its_prompt_and_is_wrong_for_the_other_kinds(kind) -> None:
    answers = ANSWER_FORMATS[kind]
    assert answers.example in SYSTEM_PROMPTS[kind] and answers.instruction in SYSTEM_PROMPTS[kind]
    answer = parse_final_answer(f"Done. {answers.example}", EXAMPLE_QUESTIONS[kind])
    assert answer.status is ParseStatus.OK
    assert answers.write(answers.forecast_of(answer), EXAMPLE_QUESTIONS[kind]).endswith(
        answers.closing_tag
    )
    for other in QuestionKind:
        if other is not kind:
            wrong = parse_final_answer(answers.example, EXAMPLE_QUESTIONS[other])
            assert wrong.status is ParseStatus.WRONG_FORMAT
            assert parse_action(answers.example, other).kind is ActionKind.NONE
    assert action_stop_strings(kind)[-1] == answers.closing_tag
    assert parse_action(answers.example, kind).kind is ActionKind.ANSWER


@pytest.mark.parametrize("kind", list(QuestionKind))
def test_an_opened_tag_never_closed_is_malformed(kind) -> None:
    answers = ANSWER_FORMATS[kind]
    cut_off = answers.example.removesuffix(answers.closing_tag)
    assert parse_final_answer(cut_off, EXAMPLE_QUESTIONS[kind]).status is ParseStatus.MALFORMED
    assert parse_final_answer("no idea", EXAMPLE_QUESTIONS[kind]).status is ParseStatus.MISSING


@pytest.mark.parametrize("kind", list(QuestionKind))
def test_the_uniform_forecast_is_an_answer_its_exact_text_gives_back(kind) -> None:
    answers = ANSWER_FORMATS[kind]
    q = EXAMPLE_QUESTIONS[kind]
    uniform = answers.uniform(q)
    expected = answers.answer(uniform, q)
    assert expected.status is ParseStatus.OK
    assert parse_final_answer(answers.write(uniform, q, exact=True), q) == expected


def test_the_forecast_field_is_read_from_trajectories_too() -> None:
    t = Trajectory(question_id=1, agent_id=1, policy_version=0, sample_index=0, p_yes=0.0)
    assert BINARY.forecast_of(t) == 0.0  # p = 0 is a forecast, not a missing one
    assert CHOICE.forecast_of(t) is None and NUMERIC.forecast_of(t) is None


# Exact text: parse(write(x, exact=True)) == answer(x), bit for bit, for every kind.

unit_floats = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(p=unit_floats)
def test_binary_exact_text_round_trips(p: float) -> None:
    q = EXAMPLE_QUESTIONS[QuestionKind.BINARY]
    assert parse_final_answer(BINARY.write(p, q, exact=True), q) == BINARY.answer(p, q)


@st.composite
def distributions(draw: st.DrawFn) -> tuple[float, ...]:
    raw = draw(st.lists(unit_floats, min_size=2, max_size=8).filter(lambda r: math.fsum(r) > 0))
    total = math.fsum(raw)
    return tuple(p / total for p in raw)


@given(probabilities=distributions())
def test_choice_exact_text_round_trips(probabilities: tuple[float, ...]) -> None:
    q = choice_question(len(probabilities))
    text = CHOICE.write(probabilities, q, exact=True)
    assert parse_final_answer(text, q) == CHOICE.answer(probabilities, q)


SPECS = (
    NumericSpec(lower=-50.0, upper=1e6),
    NumericSpec(lower=1e-3, upper=1e12, log_scale=True),
    DATES,
)


@given(spec=st.sampled_from(SPECS), data=st.data())
def test_numeric_exact_text_round_trips(spec: NumericSpec, data: st.DataObject) -> None:
    values = data.draw(
        st.lists(st.floats(spec.lower, spec.upper), min_size=5, max_size=5).map(sorted)
    )
    q = numeric_question(spec)
    text = NUMERIC.write(tuple(values), q, exact=True)
    assert parse_final_answer(text, q) == NUMERIC.answer(tuple(values), q)


# Canonical text, the precision it is written with: binary and choice two decimals, so
# probabilities on the 0.01 grid come back exactly (others within 0.005); numeric values
# exactly below 1e16, to 15 significant digits above, and to the UTC day on a time axis.


@given(k=st.integers(0, 100), p=unit_floats)
def test_binary_canonical_text_has_two_decimals(k: int, p: float) -> None:
    q = EXAMPLE_QUESTIONS[QuestionKind.BINARY]
    assert parse_final_answer(BINARY.write(k / 100, q), q) == BINARY.answer(k / 100, q)
    assert abs(parse_final_answer(BINARY.write(p, q), q).p_yes - p) <= 0.005 + 1e-12


@given(weights=st.lists(st.integers(0, 100), min_size=2, max_size=8).filter(any))
def test_choice_canonical_text_on_the_grid_round_trips(weights: list[int]) -> None:
    # Hundredths summing to 1: largest-remainder rounding of the weights.
    total = sum(weights)
    cents = [w * 100 // total for w in weights]
    order = sorted(range(len(weights)), key=lambda i: -(weights[i] * 100 % total))
    for i in order[: 100 - sum(cents)]:
        cents[i] += 1
    probabilities = tuple(c / 100 for c in cents)
    q = choice_question(len(probabilities))
    assert parse_final_answer(CHOICE.write(probabilities, q), q) == CHOICE.answer(probabilities, q)


@given(values=st.lists(st.floats(-1e15, 1e15), min_size=5, max_size=5).map(sorted))
def test_numeric_canonical_text_is_exact_below_1e16(values: list[float]) -> None:
    q = numeric_question(NumericSpec(lower=-1e15, upper=1e15))
    assert parse_final_answer(NUMERIC.write(tuple(values), q), q).quantiles == tuple(values)


@given(values=st.lists(st.floats(1e16, 1e20), min_size=5, max_size=5).map(sorted))
def test_numeric_canonical_text_has_15_digits_above_1e16(values: list[float]) -> None:
    q = numeric_question(NumericSpec(lower=0.0, upper=1e20))
    answer = parse_final_answer(NUMERIC.write(tuple(values), q), q)
    assert answer.status is ParseStatus.OK
    assert answer.quantiles == pytest.approx(values, rel=1e-14)


@example(values=[1775001600.0] * 4 + [1782777599.9999998])  # 0.2 µs before midnight
@given(values=st.lists(st.floats(DATES.lower, DATES.upper), min_size=5, max_size=5).map(sorted))
def test_numeric_canonical_text_on_a_time_axis_is_the_utc_day(values: list[float]) -> None:
    q = numeric_question(DATES)
    answer = parse_final_answer(NUMERIC.write(tuple(values), q), q)
    assert answer.quantiles == tuple(v - v % DAY_S for v in values)


def test_a_numeric_answer_needs_a_value_per_level() -> None:
    with pytest.raises(ValueError, match=f"need {len(QUANTILE_LEVELS)} quantiles, got 2"):
        NUMERIC.write((1.0, 2.0), EXAMPLE_QUESTIONS[QuestionKind.NUMERIC])


def test_the_answer_formats_import_only_the_domain() -> None:
    """futureworld.answers sits in the core: no agent, policy, model or storage."""
    package = Path(futureworld.answers.__file__).parent
    ours = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                ours.add(node.module)
            elif isinstance(node, ast.Import):
                ours.update(alias.name for alias in node.names)
    allowed = {"futureworld.domain", "__future__", "abc", "dataclasses", "decimal", "typing"}
    allowed |= {"itertools", "math", "re", "collections.abc", "datetime"}
    assert {m for m in ours if not m.startswith("futureworld.answers")} <= allowed


def test_only_a_one_probability_answer_elicits_beliefs() -> None:
    assert BINARY.belief_prefix == "Current estimate: <probability>"
    assert BINARY.belief_prefix.endswith(BINARY.open_tags[0])  # the belief closes the tag
    assert CHOICE.belief_prefix is None and NUMERIC.belief_prefix is None
