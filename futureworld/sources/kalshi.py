"""Kalshi adapter (Trade API v2, public market data): open binary and scalar markets and their
settlements.

GET /trade-api/v2/markets?limit=&cursor=&status=open returns {"markets": [...], "cursor": ""}
(an empty cursor ends paging); GET /trade-api/v2/markets/{ticker} returns {"market": {...}}.
Prices come as integer cents (`last_price`, `yes_bid`) and as dollar strings
(`last_price_dollars`, "0.5600"); the dollar fields win. Status `determined` may still
change, only `finalized` (older API: `settled`) is final. A decided market resolves at the
first of its settlement, expiration and close times that had passed when it was fetched
(`resolution_time`), never at an expiration still to come (2099 for an open-ended market).

Multivariate markets (combos/parlays: a `mve_collection_ticker` and the `mve_selected_legs`
they bundle, `market_type` still "binary") are not forecastable questions of their own: the
listing asks for `mve_filter=exclude`, and any that still arrive are skipped as
`skipped_multivariate`.

Scalar markets (`market_type` "scalar": LONG/YES pays between 0 and 1 dollar, linearly in the
underlying value between `floor_strike` and `cap_strike`) become numeric questions on the
closed range [floor_strike, cap_strike]: the payout is flat beyond the strikes, so that range
is all the market can say. The crowd forecast is the YES price p (mid of bid/ask, else last
price) as the point floor + p·(cap − floor), a point mass (all five quantiles equal). The
outcome is `expiration_value` (the underlying value the settlement used) clipped to the
range, else floor + v·(cap − floor) from the YES side's settlement payout v in dollars
(`settlement_value_dollars`, else `settlement_value` cents / 100). A settled scalar market's
`result` is "scalar" (or yes/no); only "void" annuls it. This reading matches Kalshi's market
schema (`settlement_value`: the YES settlement in cents, `settlement_value_dollars`,
`expiration_value`: the outcome value, `floor_strike`/`cap_strike`: the bounds) and its
settlement-bounds page (a scalar payout grows linearly with the outcome, e.g. $0.10 a day of
a shutdown up to 10 days). A scalar market without both strikes (the API does not describe
its range) is skipped (skipped_scalar_without_range); other market types count as
skipped_unsupported_kind.
"""

from __future__ import annotations

import math
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

SOURCE = "kalshi"
DEFAULT_BASE_URL = "https://api.elections.kalshi.com"
API_PREFIX = "/trade-api/v2"
MAX_PAGE_SIZE = 1000
FINAL_STATUSES = frozenset({"finalized", "settled"})
PROVISIONAL_STATUSES = frozenset({"determined"})
OPEN_STATUSES = frozenset({"open", "active", "initialized"})


def price_dollars(market: dict[str, Any], name: str) -> float | None:
    """A price in dollars (= probability) from `<name>_dollars`, else `<name>` in cents."""
    dollars = market.get(f"{name}_dollars")
    if dollars not in (None, ""):
        return base.clamp_probability(dollars)
    cents = market.get(name)
    if cents in (None, ""):
        return None
    p = base.clamp_probability(float(cents) / 100.0)
    return p


def crowd_p_yes(market: dict[str, Any]) -> float | None:
    """Mid of a live yes bid/ask (0 < bid ≤ ask), else the last traded price, else None."""
    bid, ask = price_dollars(market, "yes_bid"), price_dollars(market, "yes_ask")
    if bid is not None and ask is not None and 0.0 < bid <= ask < 1.0:
        return (bid + ask) / 2.0
    last = price_dollars(market, "last_price")
    return last if last else None


def scalar_spec(market: dict[str, Any]) -> NumericSpec:
    """The closed range [floor_strike, cap_strike] of a scalar market (module docstring)."""
    return NumericSpec(lower=float(market["floor_strike"]), upper=float(market["cap_strike"]))


def _scalar_value(spec: NumericSpec, p: float) -> float:
    return spec.lower + p * (spec.upper - spec.lower)


def _scalar_fields(market: dict[str, Any]) -> dict[str, Any]:
    spec = scalar_spec(market)
    extra: dict[str, Any] = spec.to_extra()
    p = crowd_p_yes(market)
    if p is not None:
        extra["crowd_quantiles"] = [_scalar_value(spec, p)] * len(QUANTILE_LEVELS)
    return extra


def market_to_question(market: dict[str, Any], *, now: datetime) -> Question:
    """One binary or scalar market to a Question; KeyError/ValueError when malformed
    (FieldError: a null, empty or wrongly typed ticker or title)."""
    scalar = market.get("market_type", "binary") == "scalar"
    ticker = base.required_id(market, "ticker")
    title = base.required_text(market, "title")
    if market.get("yes_sub_title") and market["yes_sub_title"] not in title:
        title = f"{title} ({market['yes_sub_title']})"
    rules = "\n\n".join(
        r for r in (market.get("rules_primary"), market.get("rules_secondary")) if r
    )
    return Question(
        source=SOURCE,
        external_id=ticker,
        kind=QuestionKind.NUMERIC if scalar else QuestionKind.BINARY,
        title=title,
        background=market.get("subtitle") or "",
        resolution_criteria=rules,
        url=f"https://kalshi.com/markets/{market.get('event_ticker') or ticker}".lower(),
        domain=str(market.get("category") or ""),
        created_at=base.from_iso(market.get("open_time")) or now,
        info_cutoff_at=now,
        close_at=base.from_iso(market.get("close_time")),
        resolve_by=base.from_iso(
            market.get("latest_expiration_time") or market.get("expiration_time")
        ),
        crowd_probability=None if scalar else crowd_p_yes(market),
        extra={
            "event_ticker": market.get("event_ticker"),
            **(_scalar_fields(market) if scalar else {}),
        },
    )


def _fetch_page(listing: paging.Listing, cursor: str | None) -> base.Page:
    params: dict[str, Any] = {
        "limit": max(1, min(listing.page_size, MAX_PAGE_SIZE)),
        "status": "open",
        "mve_filter": "exclude",
    }
    if cursor:
        params["cursor"] = cursor
    page = listing.client.get_json(SOURCE, listing.url, params=params)
    markets = base.listed_items(page, "markets", source=SOURCE, url=listing.url)
    next_cursor = page.get("cursor")
    return base.Page(items=markets, next_cursor=str(next_cursor) if next_cursor else None)


def _to_question(listing: paging.Listing, market: Any) -> Question:
    reason = _skip_reason(market, listing.now)
    if reason:
        raise base.SkipItem(reason)
    with base.malformed_item(f"{SOURCE}: market {market.get('ticker')!r}"):
        question = market_to_question(market, now=listing.now)
    return question


harvest_open = paging.paged_harvest_open(
    SOURCE,
    DEFAULT_BASE_URL,
    path=f"{API_PREFIX}/markets",
    item="market",
    default_page_size=200,
    fetch_page=_fetch_page,
    to_question=_to_question,
    doc="""Cursor-page open markets; keeps binary and scalar markets (module docstring) that
    close after `now`. Market data is public: the token is not sent (trading auth, RSA
    signatures, is not needed here).""",
)


def is_multivariate(market: dict[str, Any]) -> bool:
    """A combo/parlay market of a multivariate event collection."""
    return bool(market.get("mve_collection_ticker") or market.get("mve_selected_legs"))


def _skip_reason(market: Any, now: datetime) -> str | None:
    if not isinstance(market, dict) or "ticker" not in market:
        return "malformed"
    if is_multivariate(market):
        return "multivariate"
    market_type = market.get("market_type", "binary")
    if market_type == "scalar":
        if market.get("floor_strike") is None or market.get("cap_strike") is None:
            return "scalar_without_range"
    elif market_type != "binary":
        return "unsupported_kind"
    if market.get("status", "open") not in OPEN_STATUSES:
        return "closed"
    return base.close_skip_reason(market.get("close_time"), base.from_iso, now)


def market_to_resolution(market: dict[str, Any], *, now: datetime) -> base.SourceResolution | None:
    """result yes/no (a scalar market: its value, module docstring) once determined
    (final=False) or finalized (final=True); void → annulled."""
    status = str(market.get("status") or "")
    if status not in FINAL_STATUSES | PROVISIONAL_STATUSES:
        return None
    result = str(market.get("result") or "").lower()
    if result != "void" and market.get("market_type") == "scalar":
        outcome, value = OutcomeStatus.RESOLVED, _scalar_outcome(market)
    elif result in ("yes", "no"):
        outcome, value = OutcomeStatus.RESOLVED, 1.0 if result == "yes" else 0.0
    elif result == "void":
        outcome, value = OutcomeStatus.ANNULLED, None
    else:
        raise ValueError(f"status {status} with result {market.get('result')!r}")
    return paging.payload_resolution(
        SOURCE,
        market,
        market["ticker"],
        (outcome, value),
        resolved_at=resolution_time(market, now=now),
        now=now,
        final=status in FINAL_STATUSES,
    )


RESOLUTION_TIME_FIELDS = (
    "settlement_ts",
    "expiration_time",
    "close_time",
    "latest_expiration_time",
)
"""A decided market's times, most exact first; `resolution_time` takes the first that has
passed: the payout; the expiration (for a decided market, when it expired); the end of trading
(moved earlier when the market closes early), which the decision follows; the latest the
market could have expired."""


def resolution_time(market: dict[str, Any], *, now: datetime) -> datetime:
    """When a decided market's outcome became known: the first of RESOLUTION_TIME_FIELDS that
    is not after `now` (the fetch), else `now`, the instant it was seen decided.

    A time after `now` says nothing of when the market was decided: an open-ended market
    ("before 2030") that closes early keeps its expiration times at the far bound (2099), and a
    market voided before its close has a close still to come."""
    for name in RESOLUTION_TIME_FIELDS:
        at = base.from_iso(market.get(name))
        if at is not None and at <= now:
            return at
    return now


def _scalar_outcome(market: dict[str, Any]) -> float:
    spec = scalar_spec(market)
    raw = market.get("expiration_value")
    try:
        value = float(raw) if raw not in (None, "") else None
    except (TypeError, ValueError):
        value = None
    if value is None:
        value = _scalar_value(spec, _settlement_dollars(market))
    if not math.isfinite(value):
        raise ValueError(f"scalar value {raw!r} is not a finite number")
    return min(spec.upper, max(spec.lower, value))


def _settlement_dollars(market: dict[str, Any]) -> float:
    """The YES side's settlement payout in dollars: `settlement_value_dollars` (a decimal
    string, "0.3500") wins over the older integer cents of `settlement_value`."""
    dollars, cents = market.get("settlement_value_dollars"), market.get("settlement_value")
    if dollars not in (None, ""):
        return float(dollars)
    if cents not in (None, ""):
        return float(cents) / 100.0
    raise ValueError(
        "a settled scalar market without expiration_value or settlement_value(_dollars)"
    )


fetch_resolutions = paging.per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path=API_PREFIX + "/markets/{id}",
    item="market",
    to_resolution=market_to_resolution,
    wrapped_in="market",
)
