"""Metaculus adapter: open binary, multiple-choice, numeric and date question posts and their
resolutions (API 2, /api/posts/).

GET /api/posts/?limit=&offset=&statuses=open&forecast_type=… (one parameter per type) with
`Authorization: Token …` returns {"results": [post], "next": url|null}; GET /api/posts/{id}/
returns one post. A post's `question` carries type, status, times, `resolution` and the
community `aggregations` ({method: {"latest": {"forecast_values", "centers", …}}}); shapes as
Metaculus's own client reads them (forecasting-tools, data_models/questions.py).

Mapping per question type:
- binary → binary; the crowd is the latest recency-weighted `centers[0]` (else
  forecast_values[1]). Resolution yes → 1, no → 0.
- multiple_choice → choice: options are `options` in order (unordered); the crowd is the
  latest forecast_values (one probability per option), divided by their sum. Resolution: the
  winning option's text → its index.
- numeric and date → numeric on [scaling.range_min, scaling.range_max] with
  `open_lower_bound` / `open_upper_bound` and `unit`; a date question is on a time axis (POSIX
  seconds; bounds and resolutions are timestamps or ISO dates). `scaling.zero_point` None is a
  linear scale, 0 a log scale (ln x); another zero point (a shifted log scale) is skipped
  (skipped_shifted_log_scale). The crowd's quantiles are read off the latest community CDF
  (forecast_values: the CDF at evenly spaced points of the range's unit axis, location 0 at
  range_min, 1 at range_max) by linear interpolation at QUANTILE_LEVELS; a level whose
  probability lies beyond the range (mass past an open bound) is put at that bound, the
  furthest the CDF says anything about. Resolution: the number (or date); below_lower_bound /
  above_upper_bound → that bound (the exact value is unknown).
- annulled / ambiguous → annulled, for every type. Discrete, group and conditional posts are
  skipped (skipped_unsupported_kind).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    OutcomeStatus,
    Question,
    QuestionKind,
)
from futureworld.sources import base, paging
from futureworld.sources.http import join_url

SOURCE = "metaculus"
DEFAULT_BASE_URL = "https://www.metaculus.com"
ANNULLED_RESOLUTIONS = frozenset({"annulled", "ambiguous"})
KIND_OF_TYPE = {
    "binary": QuestionKind.BINARY,
    "multiple_choice": QuestionKind.CHOICE,
    "numeric": QuestionKind.NUMERIC,
    "date": QuestionKind.NUMERIC,
}
"""The question types harvested, and the question kind each becomes (module docstring)."""


def _headers(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Token {token}"} if token else None


def _latest(question: dict[str, Any]) -> list[dict[str, Any]]:
    aggregations = question.get("aggregations") or {}
    found = [(aggregations.get(m) or {}).get("latest") for m in ("recency_weighted", "unweighted")]
    return [latest for latest in found if latest]


def community_p_yes(question: dict[str, Any]) -> float | None:
    """The latest recency-weighted community P(yes) (`centers[0]`, else forecast_values[1])."""
    for latest in _latest(question):
        centers = latest.get("centers") or []
        if centers:
            return base.clamp_probability(centers[0])
        values = latest.get("forecast_values") or []
        if len(values) == 2:
            return base.clamp_probability(values[1])
    return None


def _number(value: Any, name: str) -> float:
    if isinstance(value, str):
        parsed = base.from_iso(value) if not _is_number(value) else None
        number = parsed.timestamp() if parsed is not None else float(value)
    else:
        number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} {value!r} is not a finite number")
    return number


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def numeric_spec(question: dict[str, Any]) -> NumericSpec:
    """The range of a numeric or date question (module docstring); ValueError naming what is
    unsupported or malformed."""
    scaling = question["scaling"]
    zero_point = scaling.get("zero_point")
    if zero_point is not None and float(zero_point) != 0.0:
        raise ValueError(f"shifted log scale (zero_point {zero_point})")
    return NumericSpec(
        lower=_number(scaling["range_min"], "range_min"),
        upper=_number(scaling["range_max"], "range_max"),
        open_lower=bool(question.get("open_lower_bound", False)),
        open_upper=bool(question.get("open_upper_bound", False)),
        log_scale=zero_point is not None,
        unit=str(question.get("unit") or ""),
        time_axis=question.get("type") == "date",
    )


def _from_unit(spec: NumericSpec, x: float) -> float:
    """The value at position x of the unit axis (the inverse of NumericSpec.normalise)."""
    if spec.log_scale:
        return spec.lower * (spec.upper / spec.lower) ** x
    return spec.lower + x * (spec.upper - spec.lower)


def community_quantiles(question: dict[str, Any], spec: NumericSpec) -> list[float] | None:
    """The latest community CDF's values at QUANTILE_LEVELS (module docstring), or None."""
    for latest in _latest(question):
        cdf = [float(v) for v in latest.get("forecast_values") or []]
        if len(cdf) < 2:
            continue
        if not all(math.isfinite(v) for v in cdf) or any(b < a for a, b in itertools.pairwise(cdf)):
            raise ValueError("the community CDF is not a non-decreasing list of numbers")
        step = 1.0 / (len(cdf) - 1)
        out = []
        for level in QUANTILE_LEVELS:
            if level <= cdf[0]:
                x = 0.0
            elif level >= cdf[-1]:
                x = 1.0
            else:
                k = next(i for i in range(1, len(cdf)) if cdf[i] >= level)
                lo, hi = cdf[k - 1], cdf[k]
                x = (k - 1 + (level - lo) / (hi - lo)) * step
            out.append(_from_unit(spec, x))
        return out
    return None


def community_probabilities(question: dict[str, Any], n_options: int) -> list[float] | None:
    """The latest community probability per option, divided by their sum, or None."""
    for latest in _latest(question):
        values = latest.get("forecast_values") or []
        if len(values) != n_options:
            continue
        probabilities = [base.clamp_probability(v) for v in values]
        total = math.fsum(p for p in probabilities if p is not None)
        if None in probabilities or total <= 0.0:
            return None
        return [p / total for p in probabilities if p is not None]
    return None


def _binary_fields(question: dict[str, Any]) -> dict[str, Any]:
    return {"crowd_probability": community_p_yes(question), "extra": {}}


def _choice_fields(question: dict[str, Any]) -> dict[str, Any]:
    listed = question["options"]
    options = tuple(base.required_text(listed, i, name=f"options[{i}]") for i in range(len(listed)))
    extra: dict[str, Any] = {"ordered_options": False}
    crowd = community_probabilities(question, len(options))
    if crowd is not None:
        extra["crowd_probabilities"] = crowd
    return {"options": options, "extra": extra}


def _numeric_fields(question: dict[str, Any]) -> dict[str, Any]:
    spec = numeric_spec(question)
    extra = spec.to_extra()
    quantiles = community_quantiles(question, spec)
    if quantiles is not None:
        extra["crowd_quantiles"] = quantiles
    return {"extra": extra}


_KIND_FIELDS: dict[QuestionKind, Callable[[dict[str, Any]], dict[str, Any]]] = {
    QuestionKind.BINARY: _binary_fields,
    QuestionKind.CHOICE: _choice_fields,
    QuestionKind.NUMERIC: _numeric_fields,
}
"""A question's Question fields of its kind: options, crowd forecast and the kind's extra."""


def post_to_question(post: dict[str, Any], base_url: str, *, now: datetime) -> Question:
    """A question post of a harvested type to a Question of its kind (module docstring);
    KeyError/ValueError when malformed (FieldError: a null, empty or wrongly typed id, title or
    option). The title is the post's, else (absent or null) its question's."""
    question = post["question"]
    post_id = base.required_id(post, "id")
    if post.get("title") is None:
        title = base.required_text(question, "title", name="question.title")
    else:
        title = base.required_text(post, "title")
    kind = KIND_OF_TYPE[question.get("type", "binary")]
    fields = _KIND_FIELDS[kind](question)
    created_at = (
        base.from_iso(post.get("published_at")) or base.from_iso(post.get("created_at")) or now
    )
    categories = ((post.get("projects") or {}).get("category")) or []
    domain = str(categories[0].get("name") or "") if categories else ""
    criteria = question.get("resolution_criteria") or ""
    if question.get("fine_print"):
        criteria = f"{criteria}\n\n{question['fine_print']}".strip()
    return Question(
        source=SOURCE,
        external_id=post_id,
        kind=kind,
        title=title,
        background=question.get("description") or "",
        resolution_criteria=criteria,
        url=join_url(base_url, f"/questions/{post_id}/"),
        domain=domain,
        created_at=created_at,
        info_cutoff_at=now,
        close_at=base.from_iso(question.get("scheduled_close_time")),
        resolve_by=base.from_iso(question.get("scheduled_resolve_time")),
        crowd_probability=fields.get("crowd_probability"),
        options=fields.get("options", ()),
        extra={"question_id": question.get("id"), **fields["extra"]},
    )


def _fetch_page(listing: paging.Listing, offset: int | None) -> base.Page:
    offset = offset or 0
    params = {
        "limit": listing.page_size,
        "offset": offset,
        "statuses": "open",
        "forecast_type": list(KIND_OF_TYPE),
    }
    page = listing.client.get_json(
        SOURCE, listing.url, params=params, headers=_headers(listing.token)
    )
    results = base.listed_items(page, "results", source=SOURCE, url=listing.url)
    more = bool(page.get("next")) and bool(results)
    return base.Page(items=results, next_cursor=offset + len(results) if more else None)


def _to_question(listing: paging.Listing, post: Any) -> Question:
    reason = _skip_reason(post, listing.now)
    if reason:
        raise base.SkipItem(reason)
    with base.malformed_item(f"{SOURCE}: post {post.get('id')!r}"):
        if post["question"].get("type") in ("numeric", "date"):
            zero_point = (post["question"].get("scaling") or {}).get("zero_point")
            if zero_point is not None and float(zero_point) != 0.0:
                raise base.SkipItem("shifted_log_scale")
        question = post_to_question(post, listing.base_url, now=listing.now)
    return question


harvest_open = paging.paged_harvest_open(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/api/posts/",
    item="post",
    default_page_size=100,
    fetch_page=_fetch_page,
    to_question=_to_question,
    doc="""Offset-page open posts of the harvested types (module docstring); group, conditional
    and discrete posts are skipped and counted.""",
)


def _skip_reason(post: Any, now: datetime) -> str | None:
    if not isinstance(post, dict) or "id" not in post:
        return "malformed"
    question = post.get("question")
    if not isinstance(question, dict) or question.get("type") not in KIND_OF_TYPE:
        return "unsupported_kind"
    if question.get("status", "open") != "open" or question.get("resolution") is not None:
        return "closed"
    return base.close_skip_reason(question.get("scheduled_close_time"), base.from_iso, now)


def _kind_outcome(question: dict[str, Any], raw: str) -> float:
    """A choice or numeric question's resolution as the option index or the number."""
    if question.get("type") == "multiple_choice":
        options = [str(o).strip() for o in question["options"]]
        if raw.strip() not in options:
            raise ValueError(f"resolution {raw!r} is none of the options {options}")
        return float(options.index(raw.strip()))
    spec = numeric_spec(question)
    if raw.lower() == "below_lower_bound":
        return spec.lower
    if raw.lower() == "above_upper_bound":
        return spec.upper
    return _number(raw, "resolution")


def post_to_resolution(post: dict[str, Any], *, now: datetime) -> base.SourceResolution | None:
    """yes → 1, no → 0, an option → its index, a number or date → the number, annulled or
    ambiguous → annulled (module docstring); None while unresolved."""
    question = post["question"]
    resolution = question.get("resolution")
    if resolution is None or resolution == "":
        return None
    raw = str(resolution)
    resolution = raw.lower()
    if resolution in ANNULLED_RESOLUTIONS:
        status, value = OutcomeStatus.ANNULLED, None
    elif question.get("type", "binary") != "binary":
        status, value = OutcomeStatus.RESOLVED, _kind_outcome(question, raw)
    elif resolution in ("yes", "no"):
        status, value = OutcomeStatus.RESOLVED, 1.0 if resolution == "yes" else 0.0
    else:
        raise ValueError(f"unknown binary resolution {question.get('resolution')!r}")
    return paging.payload_resolution(
        SOURCE,
        post,
        post["id"],
        (status, value),
        resolved_at=base.from_iso(question.get("actual_resolve_time")),
        now=now,
    )


fetch_resolutions = paging.per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/api/posts/{id}/",
    item="post",
    to_resolution=post_to_resolution,
    headers=_headers,
)
