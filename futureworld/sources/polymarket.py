"""Polymarket adapter over the Gamma API: open Yes/No markets and their UMA resolutions.

GET /markets/keyset?limit=&closed=false&after_cursor= returns {"markets": [...], "next_cursor"}
(next_cursor absent on the last page); GET /markets/{id} returns one market. `outcomes` and
`outcomePrices` are JSON strings inside the JSON, and "Yes" is not always the first outcome.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, QuestionKind
from futureworld.sources import paging
from futureworld.sources.base import (
    MALFORMED_ERRORS,
    Page,
    SkipItem,
    SourceResolution,
    clamp_probability,
    describe_error,
    from_iso,
    listed_items,
    required_id,
    required_text,
)

SOURCE = "polymarket"
DEFAULT_BASE_URL = "https://gamma-api.polymarket.com"
MAX_PAGE_SIZE = 100
SETTLED_PRICE = 0.99
"""A side priced at or above this after UMA resolution won (prices settle to 1/0)."""


def yes_price(market: dict[str, Any]) -> float | None:
    """P(yes) from the JSON-string `outcomes`/`outcomePrices`; ValueError if not a Yes/No market."""
    outcomes = _json_list(market.get("outcomes"), "outcomes")
    lowered = [str(o).strip().lower() for o in outcomes]
    if sorted(lowered) != ["no", "yes"]:
        raise ValueError(f"not a Yes/No market: outcomes {outcomes!r}")
    if market.get("outcomePrices") in (None, ""):
        return None
    prices = _json_list(market["outcomePrices"], "outcomePrices")
    if len(prices) != len(outcomes):
        raise ValueError(f"{len(prices)} prices for {len(outcomes)} outcomes")
    price = float(prices[lowered.index("yes")])
    if not math.isfinite(price):
        raise ValueError(f"Yes price {prices[lowered.index('yes')]!r} is not a finite number")
    return price


def _json_list(value: Any, name: str) -> list[Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, list):
        raise ValueError(f"{name} is not a list: {value!r}")
    return parsed


def market_to_question(market: dict[str, Any], *, now: datetime) -> Question:
    """One open Gamma market to a Question; ValueError/KeyError when malformed (FieldError: a
    null, empty or wrongly typed id or question) or not Yes/No."""
    created_at = from_iso(market.get("createdAt")) or from_iso(market.get("startDate")) or now
    slug = market.get("slug") or ""
    description = market.get("description") or ""
    return Question(
        source=SOURCE,
        external_id=required_id(market, "id"),
        kind=QuestionKind.BINARY,
        title=required_text(market, "question"),
        background=description,
        resolution_criteria=description,
        url=f"https://polymarket.com/market/{slug}" if slug else "",
        domain=str(market.get("category") or ""),
        created_at=created_at,
        info_cutoff_at=now,
        close_at=from_iso(market.get("endDate")),
        crowd_probability=clamp_probability(yes_price(market)),
        extra={"condition_id": market.get("conditionId"), "slug": slug},
    )


def _fetch_page(listing: paging.Listing, cursor: str | None) -> Page:
    params: dict[str, Any] = {
        "limit": max(1, min(listing.page_size, MAX_PAGE_SIZE)),
        "closed": "false",
    }
    if cursor:
        params["after_cursor"] = cursor
    page = listing.client.get_json(SOURCE, listing.url, params=params)
    if isinstance(page, list):  # the legacy offset endpoint: one page, no cursor
        return Page(items=page)
    markets = listed_items(page, "markets", source=SOURCE, url=listing.url)
    next_cursor = page.get("next_cursor")
    return Page(items=markets, next_cursor=str(next_cursor) if next_cursor else None)


def _to_question(listing: paging.Listing, market: Any) -> Question:
    now = listing.now
    if not isinstance(market, dict) or "id" not in market:
        raise SkipItem("malformed", f"{SOURCE}: market without an id: {str(market)[:120]}")
    if market.get("closed"):
        raise SkipItem("closed")
    try:
        question = market_to_question(market, now=now)
    except MALFORMED_ERRORS as exc:
        if "not a Yes/No" in str(exc):
            raise SkipItem("not_binary") from exc
        malformed = f"{SOURCE}: market {market['id']!r} is malformed: {describe_error(exc)}"
        raise SkipItem("malformed", malformed) from exc
    if question.close_at is not None and question.close_at <= now:
        raise SkipItem("closed")
    return question


harvest_open = paging.paged_harvest_open(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/markets/keyset",
    item="market",
    default_page_size=100,
    fetch_page=_fetch_page,
    to_question=_to_question,
    doc="Keyset-page open markets; keeps Yes/No markets that close after `now` (Gamma is "
    "public: the token is not sent).",
)


def market_to_resolution(market: dict[str, Any], *, now: datetime) -> SourceResolution | None:
    """Resolved when closed and umaResolutionStatus == "resolved"; 0.5/0.5 settles as annulled."""
    if not market.get("closed") or market.get("umaResolutionStatus") != "resolved":
        return None
    p_yes = yes_price(market)
    if p_yes is None:
        raise ValueError("resolved market without outcomePrices")
    status, value = OutcomeStatus.RESOLVED, None
    if p_yes >= SETTLED_PRICE:
        value = 1.0
    elif p_yes <= 1.0 - SETTLED_PRICE:
        value = 0.0
    elif abs(p_yes - 0.5) < 1e-6:
        status = OutcomeStatus.ANNULLED
    else:
        raise ValueError(f"resolved but Yes is priced {p_yes}, neither settled nor 50/50")
    resolved_at = (
        from_iso(market.get("closedTime"))
        or from_iso(market.get("umaEndDate"))
        or from_iso(market.get("updatedAt"))
    )
    return paging.payload_resolution(
        SOURCE, market, market["id"], (status, value), resolved_at=resolved_at, now=now
    )


fetch_resolutions = paging.per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/markets/{id}",
    item="market",
    to_resolution=market_to_resolution,
)
