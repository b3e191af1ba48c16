"""The registry of forecasting-platform adapters: one entry per platform, one shared signature.

Every adapter has `harvest_open(client, base_url, *, now, limit, page_size, max_pages, token)
-> HarvestResult` and `fetch_resolutions(client, base_url, external_ids, *, now, token)
-> ResolveResult`. Callers look adapters up here and never branch on the name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from futureworld.sources import kalshi, manifold, metaculus, polymarket
from futureworld.sources.base import HarvestResult, ResolveResult
from futureworld.sources.http import SourceClient


class HarvestOpen(Protocol):
    def __call__(
        self,
        client: SourceClient,
        base_url: str = ...,
        *,
        now: datetime | None = ...,
        limit: int = ...,
        page_size: int = ...,
        max_pages: int = ...,
        token: str | None = ...,
    ) -> HarvestResult: ...


FetchResolutions = Callable[..., ResolveResult]


class SourceName(StrEnum):
    MANIFOLD = "manifold"
    POLYMARKET = "polymarket"
    METACULUS = "metaculus"
    KALSHI = "kalshi"


@dataclass(frozen=True, kw_only=True)
class PlatformAdapter:
    """One platform: its name, its public API root and its two operations."""

    name: SourceName
    """Also the `source` of every Question and SourceResolution it returns."""
    default_base_url: str
    """The real API root; callers override it to use a mirror or a loopback server."""
    harvest_open: HarvestOpen
    """Open binary questions (paged), with errors and counters."""
    fetch_resolutions: FetchResolutions
    """Current resolutions of the given external ids (unresolved ones are absent)."""

    def resolve(
        self,
        client: SourceClient,
        external_ids: Iterable[str],
        *,
        base_url: str | None = None,
        now: datetime | None = None,
        token: str | None = None,
    ) -> ResolveResult:
        return self.fetch_resolutions(
            client, base_url or self.default_base_url, external_ids, now=now, token=token
        )


SOURCES: dict[SourceName, PlatformAdapter] = {
    SourceName.MANIFOLD: PlatformAdapter(
        name=SourceName.MANIFOLD,
        default_base_url=manifold.DEFAULT_BASE_URL,
        harvest_open=manifold.harvest_open,
        fetch_resolutions=manifold.fetch_resolutions,
    ),
    SourceName.POLYMARKET: PlatformAdapter(
        name=SourceName.POLYMARKET,
        default_base_url=polymarket.DEFAULT_BASE_URL,
        harvest_open=polymarket.harvest_open,
        fetch_resolutions=polymarket.fetch_resolutions,
    ),
    SourceName.METACULUS: PlatformAdapter(
        name=SourceName.METACULUS,
        default_base_url=metaculus.DEFAULT_BASE_URL,
        harvest_open=metaculus.harvest_open,
        fetch_resolutions=metaculus.fetch_resolutions,
    ),
    SourceName.KALSHI: PlatformAdapter(
        name=SourceName.KALSHI,
        default_base_url=kalshi.DEFAULT_BASE_URL,
        harvest_open=kalshi.harvest_open,
        fetch_resolutions=kalshi.fetch_resolutions,
    ),
}
