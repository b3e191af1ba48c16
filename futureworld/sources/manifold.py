"""Manifold Markets adapter: open binary markets as Questions, resolutions as SourceResolutions.

API (docs.manifold.markets/api): GET /v0/markets?limit=&before=<last id> lists markets newest
first; GET /v0/market/{id} returns one. Times are epoch milliseconds. The simulated world
serves the same shapes, so this adapter reads exactly the documented fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, QuestionKind, utc_now
from futureworld.sources.base import (
    HarvestResult,
    Page,
    PageError,
    SkipItem,
    SourceResolution,
    clamp_probability,
    close_skip_reason,
    from_ms,
    harvest_pages,
    malformed_item,
    payload_resolution,
    per_id_fetch_resolutions,
)
from futureworld.sources.http import SourceClient, join_url

SOURCE = "manifold"
DEFAULT_BASE_URL = "https://api.manifold.markets"
MAX_PAGE_SIZE = 1000


def market_to_question(market: dict[str, Any], *, now: datetime) -> Question:
    """One binary LiteMarket to an open Question; KeyError/ValueError on a malformed market."""
    market_id = str(market["id"])
    created_at = from_ms(market["createdTime"])
    if created_at is None:
        raise ValueError("createdTime is empty")
    background = market.get("textDescription") or ""
    if not background and isinstance(market.get("description"), str):
        background = market["description"]
    slugs = market.get("groupSlugs") or []
    return Question(
        source=SOURCE,
        external_id=market_id,
        kind=QuestionKind.BINARY,
        title=str(market["question"]).strip(),
        background=background,
        resolution_criteria=background,
        url=market.get("url") or "",
        domain=str(slugs[0]) if slugs else "",
        created_at=created_at,
        info_cutoff_at=now,
        close_at=from_ms(market.get("closeTime")),
        crowd_probability=clamp_probability(market.get("probability")),
        extra={"group_slugs": list(slugs)},
    )


def harvest_open(
    client: SourceClient,
    base_url: str = DEFAULT_BASE_URL,
    *,
    now: datetime | None = None,
    limit: int = 500,
    page_size: int = 500,
    max_pages: int = 50,
    token: str | None = None,
) -> HarvestResult:
    """Page /v0/markets (before = last id) and keep open binary markets closing after `now`.

    A failed page ends paging (the cursor is lost) but keeps everything already harvested.
    """
    now = now or utc_now()
    headers = _headers(token)
    url = join_url(base_url, "/v0/markets")
    size = max(1, min(page_size, MAX_PAGE_SIZE))

    def fetch_page(before: str | None) -> Page:
        params: dict[str, Any] = {"limit": size}
        if before is not None:
            params["before"] = before
        page = client.get_json(SOURCE, url, params=params, headers=headers)
        if not isinstance(page, list):
            raise PageError(f"{SOURCE}: {url}: expected a JSON list of markets, got {type(page)}")
        if len(page) < size or not page:  # a short page is the last one
            return Page(items=page)
        last_id = page[-1].get("id") if isinstance(page[-1], dict) else None
        if last_id is None or last_id == before:
            stopped = f"{SOURCE}: {url}: page ends without a usable id; stopped paging"
            return Page(items=page, end_error=stopped)
        return Page(items=page, next_cursor=str(last_id))

    def to_question(market: Any) -> Question:
        reason = _skip_reason(market, now)
        if reason:
            raise SkipItem(reason)
        with malformed_item(f"{SOURCE}: market {market.get('id')!r}"):
            question = market_to_question(market, now=now)
        return question

    return harvest_pages(
        fetch_page,
        to_question,
        limit=limit,
        max_pages=max_pages,
        page_url=url,
        label=f"{SOURCE}: market",
    )


def _headers(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Key {token}"} if token else None


def _skip_reason(market: Any, now: datetime) -> str | None:
    if not isinstance(market, dict) or "id" not in market:
        return "malformed"
    if market.get("outcomeType") != "BINARY":
        return "not_binary"
    if market.get("isResolved"):
        return "resolved"
    return close_skip_reason(market.get("closeTime"), from_ms, now)


def market_to_resolution(market: dict[str, Any], *, now: datetime) -> SourceResolution | None:
    """A resolved market's SourceResolution; None while it is unresolved."""
    if not market.get("isResolved"):
        return None
    market_id = str(market["id"])
    resolution = str(market.get("resolution") or "").upper()
    resolved_at = from_ms(market.get("resolutionTime"))
    status, value = OutcomeStatus.RESOLVED, None
    if resolution == "YES":
        value = 1.0
    elif resolution == "NO":
        value = 0.0
    elif resolution == "MKT":
        value = clamp_probability(market.get("resolutionProbability"))
        if value is None:
            raise ValueError("resolution MKT without a resolutionProbability")
    elif resolution == "CANCEL":
        status = OutcomeStatus.ANNULLED
    else:
        raise ValueError(f"unknown resolution {market.get('resolution')!r}")
    return payload_resolution(
        SOURCE, market, market_id, (status, value), resolved_at=resolved_at, now=now
    )


fetch_resolutions = per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/v0/market/{id}",
    item="market",
    to_resolution=market_to_resolution,
    headers=_headers,
)
