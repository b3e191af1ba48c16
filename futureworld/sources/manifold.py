"""Manifold Markets adapter: open binary, multiple-choice and pseudo-numeric markets as
Questions, their resolutions as SourceResolutions.

API (docs.manifold.markets/api; shapes in common/src/api/market-types.ts, LiteMarket and
FullMarket): GET /v0/markets?limit=&before=<last id> lists LiteMarkets newest first; GET
/v0/market/{id} returns one FullMarket. Times are epoch milliseconds. The simulated world
serves the same shapes, so this adapter reads exactly the documented fields.

Mapping per outcomeType:
- BINARY → a binary question; `probability` is the crowd's P(yes). Resolution YES → 1,
  NO → 0, MKT → resolutionProbability, CANCEL → annulled.
- MULTIPLE_CHOICE (cpmm-multi-1 with shouldAnswersSumToOne: exactly one answer wins) → a choice
  question whose options are the answers' texts ordered by their `index`, unordered
  (ordered_options false). A LiteMarket carries no answers, so harvest fetches the market's
  FullMarket for them (one request per listed choice market; a failed fetch skips that market
  alone, counted as skipped_failed_fetch). The crowd forecast is the answers' `probability`,
  divided by their sum. The answer ids are kept in extra["answer_ids"]. Resolution: CHOOSE_ONE
  sets `resolution` to the winning answer's id → its position among the answers ordered by
  index (an answer added after harvest that wins lies beyond the stored options, and backfill
  reports it as unscorable); CANCEL → annulled; a split resolution (CHOOSE_MULTIPLE, shown as
  MKT) has no single winning option → annulled. Markets whose answers do not sum to one
  (independent YES/NO answers) are skipped (skipped_independent_answers).
- PSEUDO_NUMERIC (cpmm-1 on a scale) → a numeric question on the closed range [min, max],
  log scale when isLogScale. The market trades a probability p of the scale, so the value it
  pays out at never lies beyond a bound: the range is closed. The crowd forecast is the
  market's `value` as a point mass (all five quantiles equal), the only number the API gives.
  Resolution MKT → `resolutionValue` when present (a documented contract field), else the
  value at resolutionProbability on the scale, clipped to the range; CANCEL → annulled.
- Anything else (POLL, BOUNTIED_QUESTION, NUMBER, STONK, free response …) is skipped
  (skipped_unsupported_kind).
"""

from __future__ import annotations

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
from futureworld.sources.http import SourceError, join_url

SOURCE = "manifold"
DEFAULT_BASE_URL = "https://api.manifold.markets"
MAX_PAGE_SIZE = 1000
KIND_OF_OUTCOME_TYPE = {
    "BINARY": QuestionKind.BINARY,
    "MULTIPLE_CHOICE": QuestionKind.CHOICE,
    "PSEUDO_NUMERIC": QuestionKind.NUMERIC,
}
"""The outcome types harvested, and the question kind each becomes (module docstring)."""


def _sorted_answers(market: dict[str, Any]) -> list[dict[str, Any]]:
    answers = market["answers"]
    if not isinstance(answers, list) or not answers:
        raise ValueError("a multiple-choice market needs a non-empty `answers` list")
    return sorted(answers, key=lambda a: float(a["index"]))


def _choice_fields(market: dict[str, Any]) -> dict[str, Any]:
    answers = _sorted_answers(market)
    probabilities = [base.clamp_probability(a.get("probability")) for a in answers]
    extra: dict[str, Any] = {
        "ordered_options": False,
        "answer_ids": [str(a["id"]) for a in answers],
    }
    total = math.fsum(p for p in probabilities if p is not None)
    if None not in probabilities and total > 0.0:
        extra["crowd_probabilities"] = [p / total for p in probabilities if p is not None]
    options = tuple(
        base.required_text(a, "text", name=f"text of answer {a.get('id')!r}") for a in answers
    )
    return {"options": options, "extra": extra}


def numeric_spec(market: dict[str, Any]) -> NumericSpec:
    """The closed range of a PSEUDO_NUMERIC market (module docstring)."""
    return NumericSpec(
        lower=float(market["min"]),
        upper=float(market["max"]),
        log_scale=bool(market.get("isLogScale") or False),
    )


def _scale_value(spec: NumericSpec, p: float) -> float:
    """The value at position p of the market's scale (linear, or on ln x)."""
    if spec.log_scale:
        return math.exp(math.log(spec.lower) + p * (math.log(spec.upper) - math.log(spec.lower)))
    return spec.lower + p * (spec.upper - spec.lower)


def _numeric_fields(market: dict[str, Any]) -> dict[str, Any]:
    spec = numeric_spec(market)
    extra: dict[str, Any] = spec.to_extra()
    value = market.get("value")
    if value is not None:
        crowd = float(value)
        if not math.isfinite(crowd):
            raise ValueError(f"value {value!r} is not a finite number")
        crowd = min(spec.upper, max(spec.lower, crowd))
        extra["crowd_quantiles"] = [crowd] * len(QUANTILE_LEVELS)
    return {"extra": extra}


def _binary_fields(market: dict[str, Any]) -> dict[str, Any]:
    return {"crowd_probability": base.clamp_probability(market.get("probability")), "extra": {}}


_KIND_FIELDS: dict[QuestionKind, Callable[[dict[str, Any]], dict[str, Any]]] = {
    QuestionKind.BINARY: _binary_fields,
    QuestionKind.CHOICE: _choice_fields,
    QuestionKind.NUMERIC: _numeric_fields,
}
"""A market's Question fields of its kind: options, crowd forecast and the kind's extra."""


def market_to_question(market: dict[str, Any], *, now: datetime) -> Question:
    """One market (a LiteMarket, or the FullMarket of a multiple-choice one) to an open
    Question of its kind; KeyError/ValueError (FieldError: a null, empty or wrongly typed id,
    question or answer text) on a malformed market."""
    market_id = base.required_id(market, "id")
    kind = KIND_OF_OUTCOME_TYPE[market.get("outcomeType", "BINARY")]
    created_at = base.from_ms(market["createdTime"])
    if created_at is None:
        raise ValueError("createdTime is empty")
    background = market.get("textDescription") or ""
    if not background and isinstance(market.get("description"), str):
        background = market["description"]
    slugs = market.get("groupSlugs") or []
    fields = _KIND_FIELDS[kind](market)
    return Question(
        source=SOURCE,
        external_id=market_id,
        kind=kind,
        title=base.required_text(market, "question"),
        background=background,
        resolution_criteria=background,
        url=market.get("url") or "",
        domain=str(slugs[0]) if slugs else "",
        created_at=created_at,
        info_cutoff_at=now,
        close_at=base.from_ms(market.get("closeTime")),
        crowd_probability=fields.get("crowd_probability"),
        options=fields.get("options", ()),
        extra={"group_slugs": list(slugs), **fields["extra"]},
    )


def _fetch_page(listing: paging.Listing, before: str | None) -> base.Page:
    size = max(1, min(listing.page_size, MAX_PAGE_SIZE))
    params: dict[str, Any] = {"limit": size}
    if before is not None:
        params["before"] = before
    url = listing.url
    page = listing.client.get_json(SOURCE, url, params=params, headers=_headers(listing.token))
    if not isinstance(page, list):
        raise base.PageError(f"{SOURCE}: {url}: expected a JSON list of markets, got {type(page)}")
    if len(page) < size or not page:  # a short page is the last one
        return base.Page(items=page)
    last_id = page[-1].get("id") if isinstance(page[-1], dict) else None
    if last_id is None or last_id == before:
        stopped = f"{SOURCE}: {url}: page ends without a usable id; stopped paging"
        return base.Page(items=page, end_error=stopped)
    return base.Page(items=page, next_cursor=str(last_id))


def _to_question(listing: paging.Listing, market: Any) -> Question:
    reason = _skip_reason(market, listing.now)
    if reason:
        raise base.SkipItem(reason)
    label = f"{SOURCE}: market {market.get('id')!r}"
    with base.malformed_item(label):
        market_id = base.required_id(market, "id")
    if market.get("outcomeType") == "MULTIPLE_CHOICE" and "answers" not in market:
        market = _full_market(listing, market_id, label)
    with base.malformed_item(label):
        if market.get("outcomeType") == "MULTIPLE_CHOICE" and (
            market.get("shouldAnswersSumToOne") is False
        ):
            raise base.SkipItem("independent_answers")
        question = market_to_question(market, now=listing.now)
    return question


def _full_market(listing: paging.Listing, market_id: str, label: str) -> dict[str, Any]:
    full_url = join_url(listing.base_url, f"/v0/market/{market_id}")
    try:
        full = listing.client.get_json(SOURCE, full_url, headers=_headers(listing.token))
    except SourceError as error:
        raise base.SkipItem("failed_fetch", f"{label}: {error}") from error
    if not isinstance(full, dict):
        raise base.SkipItem("malformed", f"{label}: {full_url} did not return a market object")
    return full


harvest_open = paging.paged_harvest_open(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/v0/markets",
    item="market",
    default_page_size=500,
    fetch_page=_fetch_page,
    to_question=_to_question,
    doc="""Page /v0/markets (before = last id) and keep open markets of the harvested kinds
    (module docstring) closing after `now`; a multiple-choice market's answers come from its
    FullMarket.

    A failed page ends paging (the cursor is lost) but keeps everything already harvested.""",
)


def _headers(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Key {token}"} if token else None


def _skip_reason(market: Any, now: datetime) -> str | None:
    if not isinstance(market, dict) or "id" not in market:
        return "malformed"
    if market.get("outcomeType") not in KIND_OF_OUTCOME_TYPE:
        return "unsupported_kind"
    if market.get("isResolved"):
        return "resolved"
    return base.close_skip_reason(market.get("closeTime"), base.from_ms, now)


def _choice_outcome(market: dict[str, Any], resolution: str) -> tuple[OutcomeStatus, float | None]:
    if resolution.upper() in ("CANCEL", "MKT"):  # MKT: split between answers, no single winner
        return OutcomeStatus.ANNULLED, None
    ids = [str(a["id"]) for a in _sorted_answers(market)]
    if resolution not in ids:
        raise ValueError(f"resolution {resolution!r} is none of the market's answer ids")
    return OutcomeStatus.RESOLVED, float(ids.index(resolution))


def _numeric_outcome(market: dict[str, Any], resolution: str) -> tuple[OutcomeStatus, float | None]:
    if resolution.upper() == "CANCEL":
        return OutcomeStatus.ANNULLED, None
    if resolution.upper() != "MKT":
        raise ValueError(f"unknown pseudo-numeric resolution {resolution!r}")
    spec = numeric_spec(market)
    value = market.get("resolutionValue")
    if value is None:
        p = base.clamp_probability(market.get("resolutionProbability"))
        if p is None:
            raise ValueError("resolution MKT without a resolutionValue or resolutionProbability")
        value = _scale_value(spec, p)
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"resolutionValue {value!r} is not a finite number")
    return OutcomeStatus.RESOLVED, min(spec.upper, max(spec.lower, number))


def market_to_resolution(market: dict[str, Any], *, now: datetime) -> base.SourceResolution | None:
    """A resolved market's SourceResolution (the module docstring's mapping per outcome type);
    None while it is unresolved."""
    if not market.get("isResolved"):
        return None
    market_id = str(market["id"])
    raw_resolution = str(market.get("resolution") or "")
    resolution = raw_resolution.upper()
    resolved_at = base.from_ms(market.get("resolutionTime"))
    outcome_type = market.get("outcomeType", "BINARY")
    if outcome_type in ("MULTIPLE_CHOICE", "PSEUDO_NUMERIC"):
        decide = _choice_outcome if outcome_type == "MULTIPLE_CHOICE" else _numeric_outcome
        return paging.payload_resolution(
            SOURCE,
            market,
            market_id,
            decide(market, raw_resolution),
            resolved_at=resolved_at,
            now=now,
        )
    status, value = OutcomeStatus.RESOLVED, None
    if resolution == "YES":
        value = 1.0
    elif resolution == "NO":
        value = 0.0
    elif resolution == "MKT":
        value = base.clamp_probability(market.get("resolutionProbability"))
        if value is None:
            raise ValueError("resolution MKT without a resolutionProbability")
    elif resolution == "CANCEL":
        status = OutcomeStatus.ANNULLED
    else:
        raise ValueError(f"unknown resolution {market.get('resolution')!r}")
    return paging.payload_resolution(
        SOURCE, market, market_id, (status, value), resolved_at=resolved_at, now=now
    )


fetch_resolutions = paging.per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/v0/market/{id}",
    item="market",
    to_resolution=market_to_resolution,
    headers=_headers,
)
