"""Polymarket adapter over the Gamma API: open Yes/No markets and their UMA resolutions.

GET /markets/keyset?limit=&closed=false&after_cursor= returns {"markets": [...], "next_cursor"}
(next_cursor absent on the last page); GET /markets/{id} returns one market. `outcomes` and
`outcomePrices` are JSON strings inside the JSON, and "Yes" is not always the first outcome.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, QuestionKind, utc_now
from futureworld.sources.base import (
    HarvestResult,
    ResolveResult,
    SourceResolution,
    clamp_probability,
    from_iso,
)
from futureworld.sources.http import SourceClient, SourceError, join_url

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
    return float(prices[lowered.index("yes")])


def _json_list(value: Any, name: str) -> list[Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    if not isinstance(parsed, list):
        raise ValueError(f"{name} is not a list: {value!r}")
    return parsed


def market_to_question(market: dict[str, Any], *, now: datetime) -> Question:
    """One open Gamma market to a Question; ValueError/KeyError when malformed or not Yes/No."""
    created_at = from_iso(market.get("createdAt")) or from_iso(market.get("startDate")) or now
    slug = market.get("slug") or ""
    description = market.get("description") or ""
    return Question(
        source=SOURCE,
        external_id=str(market["id"]),
        kind=QuestionKind.BINARY,
        title=str(market["question"]).strip(),
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


def harvest_open(
    client: SourceClient,
    base_url: str = DEFAULT_BASE_URL,
    *,
    now: datetime | None = None,
    limit: int = 500,
    page_size: int = 100,
    max_pages: int = 50,
    token: str | None = None,
) -> HarvestResult:
    """Keyset-page open markets; keeps Yes/No markets that close after `now`."""
    del token  # Gamma is public
    now = now or utc_now()
    url = join_url(base_url, "/markets/keyset")
    questions: dict[str, Question] = {}
    counts: Counter[str] = Counter()
    errors: list[str] = []
    cursor: str | None = None
    for _ in range(max_pages):
        params: dict[str, Any] = {"limit": max(1, min(page_size, MAX_PAGE_SIZE)), "closed": "false"}
        if cursor:
            params["after_cursor"] = cursor
        try:
            page = client.get_json(SOURCE, url, params=params)
            markets, next_cursor = _page_items(page)
        except SourceError as exc:
            errors.append(str(exc))
            counts["failed_pages"] += 1
            break
        except ValueError as exc:
            errors.append(f"{SOURCE}: {url}: {exc}")
            counts["failed_pages"] += 1
            break
        counts["pages"] += 1
        for market in markets:
            counts["seen"] += 1
            if not isinstance(market, dict) or "id" not in market:
                counts["skipped_malformed"] += 1
                errors.append(f"{SOURCE}: market without an id: {str(market)[:120]}")
                continue
            if market.get("closed"):
                counts["skipped_closed"] += 1
                continue
            try:
                question = market_to_question(market, now=now)
            except (KeyError, TypeError, ValueError) as exc:
                reason = "not_binary" if "not a Yes/No" in str(exc) else "malformed"
                counts[f"skipped_{reason}"] += 1
                if reason == "malformed":
                    errors.append(f"{SOURCE}: market {market['id']!r} is malformed: {exc!r}")
                continue
            if question.close_at is not None and question.close_at <= now:
                counts["skipped_closed"] += 1
                continue
            if question.external_id in questions:
                counts["skipped_duplicate"] += 1
                continue
            questions[question.external_id] = question
            if len(questions) >= limit:
                break
        if len(questions) >= limit or not next_cursor or next_cursor == cursor:
            break
        cursor = next_cursor
    counts["harvested"] = len(questions)
    return HarvestResult(questions=list(questions.values()), errors=errors, counts=counts)


def _page_items(page: Any) -> tuple[list[Any], str | None]:
    if isinstance(page, list):  # the legacy offset endpoint: one page, no cursor
        return page, None
    if isinstance(page, dict) and isinstance(page.get("markets"), list):
        cursor = page.get("next_cursor")
        return page["markets"], str(cursor) if cursor else None
    raise ValueError(f"expected {{'markets': [...]}}, got {str(page)[:120]}")


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
        or now
    )
    return SourceResolution(
        source=SOURCE,
        external_id=str(market["id"]),
        status=status,
        value=value,
        resolved_at=resolved_at,
        final=True,
        raw=dict(market),
    )


def fetch_resolutions(
    client: SourceClient,
    base_url: str = DEFAULT_BASE_URL,
    external_ids: Iterable[str] = (),
    *,
    now: datetime | None = None,
    token: str | None = None,
) -> ResolveResult:
    """GET /markets/{id} for each id; unresolved markets are left out, failures listed."""
    del token
    now = now or utc_now()
    resolutions: list[SourceResolution] = []
    errors: list[str] = []
    for external_id in dict.fromkeys(external_ids):
        url = join_url(base_url, f"/markets/{external_id}")
        try:
            resolution = market_to_resolution(client.get_json(SOURCE, url), now=now)
        except SourceError as exc:
            errors.append(str(exc))
            continue
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            errors.append(f"{SOURCE}: market {external_id}: malformed resolution: {exc!r}")
            continue
        if resolution is not None:
            resolutions.append(resolution)
    return ResolveResult(resolutions=resolutions, errors=errors)
