from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureworld.agent.parsing import ActionKind, parse_action, parse_answer
from futureworld.domain import ParseStatus

probabilities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(p=probabilities, digits=st.integers(min_value=0, max_value=6), boxed=st.booleans())
def test_any_probability_written_as_a_decimal_parses_back(p: float, digits: int, boxed: bool):
    written = f"{p:.{digits}f}"
    text = f"\\boxed{{{written}}}" if boxed else f"<probability> {written} </probability>"
    value, status = parse_answer(f"I reckon {text}")
    assert status is ParseStatus.OK and value == float(written)


@given(
    p=st.one_of(
        st.floats(min_value=1.000001, max_value=1e12), st.floats(min_value=-1e12, max_value=-1e-6)
    )
)
def test_numbers_outside_the_unit_interval_are_out_of_range(p: float):
    assert parse_answer(f"<probability>{p:.6f}</probability>") == (None, ParseStatus.OUT_OF_RANGE)


@given(text=st.text())
def test_arbitrary_text_never_raises_and_without_tags_is_missing(text: str):
    value, status = parse_answer(text)
    assert status in set(ParseStatus)
    assert (value is None) == (status is not ParseStatus.OK)
    if "<probability>" not in text and "\\boxed{" not in text:
        assert status is ParseStatus.MISSING


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("0", 0.0),
        ("1", 1.0),
        ("0.", 0.0),
        (".5", 0.5),
        ("+0.25", 0.25),
        ("1.000", 1.0),
        ("-0", 0.0),
    ],
)
def test_edge_forms_of_valid_probabilities(content: str, expected: float):
    assert parse_answer(f"<probability>{content}</probability>") == (expected, ParseStatus.OK)


@pytest.mark.parametrize("content", ["", "1e-1", "73%", "maybe", "0.5.1", "1/2", "nan", "inf"])
def test_non_decimal_answers_are_malformed(content: str):
    assert parse_answer(f"<probability>{content}</probability>") == (None, ParseStatus.MALFORMED)


def test_the_last_answer_counts_and_an_unclosed_tag_is_malformed():
    text = "<probability>0.2</probability> no, \\boxed{0.8}"
    assert parse_answer(text) == (0.8, ParseStatus.OK)
    assert parse_answer("<probability>0.7") == (None, ParseStatus.MALFORMED)
    assert parse_answer("-0.1 in words") == (None, ParseStatus.MISSING)


def test_parse_action_reads_the_first_complete_action():
    assert parse_action("hmm <search> fed rates </search>").kind is ActionKind.SEARCH
    assert parse_action("hmm <search> fed rates </search>").argument == "fed rates"
    assert parse_action("<open>12</open><search>x</search>").argument == "12"
    assert parse_action("<open>12</open>").kind is ActionKind.OPEN
    assert parse_action("so <probability>0.3</probability>").kind is ActionKind.ANSWER
    assert parse_action("\\boxed{0.3}").argument == "0.3"
    assert parse_action("<search>unclosed").kind is ActionKind.NONE
    assert parse_action("").kind is ActionKind.NONE
