"""Metaculus multiple_choice, numeric and date posts in the API 2 shapes Metaculus's own client
reads (options, scaling.range_min/range_max/zero_point, open bounds, the community CDF in
aggregations.*.latest.forecast_values): harvested as choice and numeric questions with the
community's forecast, resolved to the option index or the number."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from futureworld.domain import QUANTILE_LEVELS, OutcomeStatus, QuestionKind
from futureworld.sources import metaculus
from tests.sources.loopback_server import Reply
from tests.sources.test_metaculus import NOW, offset_pages, post


def choice_post(i: int, *, resolution=None, values=(0.2, 0.5, 0.3)) -> dict:
    p = post(i, qtype="multiple_choice", resolution=resolution)
    p["question"]["options"] = ["Labour", "Conservative", "Other"]
    p["question"]["group_variable"] = "Party"
    p["question"]["aggregations"] = {
        "recency_weighted": {"latest": {"forecast_values": list(values), "centers": None}}
    }
    return p


def linear_cdf(points: int = 201) -> list[float]:
    """The CDF of a uniform distribution on the unit axis (location 0 to 1)."""
    return [k / (points - 1) for k in range(points)]


def numeric_post(i: int, *, resolution=None, zero_point=None, cdf=None, **question) -> dict:
    p = post(i, qtype="numeric", resolution=resolution)
    p["question"].update(
        scaling={
            "range_min": 10.0,
            "range_max": 1000.0,
            "zero_point": zero_point,
            "inbound_outcome_count": 200,
        },
        open_lower_bound=False,
        open_upper_bound=True,
        unit="GW",
        aggregations={"recency_weighted": {"latest": {"forecast_values": cdf or linear_cdf()}}},
    )
    p["question"].update(question)
    return p


def date_post(i: int, *, resolution=None) -> dict:
    p = post(i, qtype="date", resolution=resolution)
    lower = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    upper = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    p["question"].update(
        scaling={"range_min": lower, "range_max": upper, "zero_point": None},
        open_lower_bound=True,
        open_upper_bound=True,
        aggregations={"recency_weighted": {"latest": {"forecast_values": linear_cdf(11)}}},
    )
    return p


def test_choice_numeric_and_date_posts_are_harvested_with_the_community_forecast(server, client):
    discrete = post(5, qtype="discrete")
    shifted = numeric_post(6, zero_point=-5.0)
    posts = [post(0), choice_post(1), numeric_post(2), date_post(3), discrete, shifted]
    server.route("/api/posts/", offset_pages(posts, [server.base_url]))
    result = metaculus.harvest_open(client, server.base_url, now=NOW, page_size=10)
    by_id = {q.external_id: q for q in result.questions}
    assert list(by_id) == ["1000", "1001", "1002", "1003"] and result.errors == []
    assert result.counts["skipped_unsupported_kind"] == 1
    assert result.counts["skipped_shifted_log_scale"] == 1
    choice = by_id["1001"]
    assert choice.kind is QuestionKind.CHOICE
    assert choice.options == ("Labour", "Conservative", "Other")
    assert choice.crowd_forecast == pytest.approx((0.2, 0.5, 0.3))
    numeric = by_id["1002"]
    spec = numeric.numeric_spec
    assert (spec.lower, spec.upper, spec.open_lower, spec.open_upper) == (10, 1000, False, True)
    assert not spec.log_scale and spec.unit == "GW"
    # A uniform CDF on a linear axis: the quantile at τ is 10 + τ·990.
    expected = [10.0 + t * 990.0 for t in QUANTILE_LEVELS]
    assert numeric.crowd_forecast == pytest.approx(expected)
    date = by_id["1003"].numeric_spec
    assert date.time_axis and date.open_lower and date.open_upper
    assert by_id["1003"].crowd_forecast[2] == pytest.approx(
        (
            datetime(2026, 1, 1, tzinfo=UTC).timestamp()
            + datetime(2027, 1, 1, tzinfo=UTC).timestamp()
        )
        / 2
    )


def test_a_log_scale_cdf_is_read_on_ln_x_and_mass_past_an_open_bound_sits_at_it(server, client):
    # Half the mass below the range (open lower bound in this post), the rest uniform on ln x.
    cdf = [0.5 + 0.5 * k / 200 for k in range(201)]
    log = numeric_post(2, zero_point=0.0, cdf=cdf, open_lower_bound=True)
    server.route("/api/posts/", offset_pages([log], [server.base_url]))
    [question] = metaculus.harvest_open(client, server.base_url, now=NOW).questions
    spec = question.numeric_spec
    assert spec.log_scale and spec.open_lower
    q05, q25, q50, q75, q95 = question.crowd_forecast
    assert q05 == q25 == pytest.approx(10.0)  # beyond the open lower bound: at the bound
    assert q50 == pytest.approx(10.0)
    assert q75 == pytest.approx(100.0)  # halfway up the CDF's upper half: halfway on ln x
    assert spec.normalise(q95) == pytest.approx(0.9)


def test_a_post_with_a_broken_cdf_is_reported_and_the_rest_kept(server, client):
    broken = numeric_post(2, cdf=[0.0, 0.6, 0.4, 1.0])
    server.route("/api/posts/", offset_pages([broken, post(0)], [server.base_url]))
    result = metaculus.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["1000"]
    assert result.counts["skipped_malformed"] == 1 and "1002" in result.errors[0]


def test_choice_numeric_and_date_resolutions(server, client):
    replies = {
        1: choice_post(1, resolution="Conservative"),
        2: numeric_post(2, resolution="412.5"),
        3: numeric_post(3, resolution="above_upper_bound"),
        4: date_post(4, resolution="2026-07-02T00:00:00Z"),
        5: choice_post(5, resolution="annulled"),
        6: choice_post(6, resolution="Liberal"),
        7: numeric_post(7, resolution="below_lower_bound"),
    }
    for i, payload in replies.items():
        server.route(f"/api/posts/{1000 + i}/", [Reply(200, payload)])
    ids = [str(1000 + i) for i in replies]
    result = metaculus.fetch_resolutions(client, server.base_url, ids, now=NOW)
    by_id = {r.external_id: r for r in result.resolutions}
    assert by_id["1001"].value == 1.0
    assert by_id["1002"].value == 412.5
    assert by_id["1003"].value == 1000.0
    assert by_id["1004"].value == datetime(2026, 7, 2, tzinfo=UTC).timestamp()
    assert by_id["1005"].status is OutcomeStatus.ANNULLED and by_id["1005"].value is None
    assert by_id["1007"].value == 10.0
    assert "1006" not in by_id
    assert len(result.errors) == 1 and "Liberal" in result.errors[0]
