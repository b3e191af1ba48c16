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
from types import ModuleType

from futureworld.sources import kalshi, manifold, metaculus, polymarket
from futureworld.sources.base import ResolveResult
from futureworld.sources.http import SourceClient
from futureworld.sources.paging import HarvestOpen

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


def _adapter(name: SourceName, module: ModuleType) -> PlatformAdapter:
    """The adapter of a platform module exposing DEFAULT_BASE_URL and the two operations."""
    return PlatformAdapter(
        name=name,
        default_base_url=module.DEFAULT_BASE_URL,
        harvest_open=module.harvest_open,
        fetch_resolutions=module.fetch_resolutions,
    )


SOURCES: dict[SourceName, PlatformAdapter] = {
    SourceName.MANIFOLD: _adapter(SourceName.MANIFOLD, manifold),
    SourceName.POLYMARKET: _adapter(SourceName.POLYMARKET, polymarket),
    SourceName.METACULUS: _adapter(SourceName.METACULUS, metaculus),
    SourceName.KALSHI: _adapter(SourceName.KALSHI, kalshi),
}
