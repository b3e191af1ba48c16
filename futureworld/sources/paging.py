"""The loops every platform adapter runs: paging a listing into a HarvestResult (its
`harvest_open`, built by `paged_harvest_open`), resolving ids one by one into a ResolveResult
(its `fetch_resolutions`, built by `per_id_fetch_resolutions`), and the SourceResolution of a
decided payload.

Adapters supply only what is platform-specific (URLs, params, field parsing, resolution
semantics). Errors are isolated per item (base.py): a failed page ends paging but keeps what
was harvested; a failed item or id becomes one error line and the others go on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from futureworld.domain import OutcomeStatus, Question, utc_now
from futureworld.sources.base import (
    HarvestResult,
    ItemError,
    Page,
    PageError,
    ResolveResult,
    SkipItem,
    SourceResolution,
    describe_error,
)
from futureworld.sources.http import SourceClient, SourceError, join_url


@dataclass(frozen=True, kw_only=True)
class Listing:
    """One harvest of one platform's listing: what its page fetcher and item parser read."""

    client: SourceClient
    base_url: str
    url: str
    """The listing's URL: base_url joined with the adapter's path."""
    now: datetime
    """Items closing at or before it are left out."""
    page_size: int
    """Items asked for per page (the adapter caps it at what its API allows)."""
    token: str | None
    """The API token, for the platforms that take one."""


class HarvestOpen(Protocol):
    """An adapter's `harvest_open`: the signature every platform shares (platforms.py)."""

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


def paged_harvest_open(
    source: str,
    default_base_url: str,
    *,
    path: str,
    item: str,
    default_page_size: int,
    fetch_page: Callable[[Listing, Any], Page],
    to_question: Callable[[Listing, Any], Question],
    doc: str,
) -> HarvestOpen:
    """An adapter's `harvest_open(client, base_url, *, now, limit, page_size, max_pages,
    token)`: pages `base_url` + `path` from cursor None with `fetch_page(listing, cursor)` and
    parses each listed item with `to_question(listing, item)` (harvest_pages), its errors
    labelled "<source>: <item>"; `now` defaults to the current time."""

    def harvest_open(
        client: SourceClient,
        base_url: str = default_base_url,
        *,
        now: datetime | None = None,
        limit: int = 500,
        page_size: int = default_page_size,
        max_pages: int = 50,
        token: str | None = None,
    ) -> HarvestResult:
        listing = Listing(
            client=client,
            base_url=base_url,
            url=join_url(base_url, path),
            now=now or utc_now(),
            page_size=page_size,
            token=token,
        )
        return harvest_pages(
            lambda cursor: fetch_page(listing, cursor),
            lambda listed: to_question(listing, listed),
            limit=limit,
            max_pages=max_pages,
            page_url=listing.url,
            label=f"{source}: {item}",
        )

    harvest_open.__doc__ = doc
    return harvest_open


def harvest_pages(
    fetch_page: Callable[[Any], Page],
    to_question: Callable[[Any], Question],
    *,
    limit: int,
    max_pages: int,
    page_url: str = "",
    label: str = "item",
) -> HarvestResult:
    """Page a listing from cursor None, parse each item, dedupe by external_id, stop at `limit`.

    `fetch_page(cursor)` raises SourceError or PageError for a failed page, which ends paging
    but keeps everything already harvested (any other exception of a page does the same, and
    is recorded under `page_url`); `to_question(item)` raises SkipItem for an item left out,
    and any other exception skips that item as malformed. Counts: pages, failed_pages, seen,
    skipped_<reason>, harvested.
    """
    questions: dict[str, Question] = {}
    counts: Counter[str] = Counter()
    errors: list[str] = []
    cursor: Any = None
    for _ in range(max_pages):
        try:
            page = fetch_page(cursor)
        except (SourceError, PageError) as exc:
            errors.append(str(exc))
            counts["failed_pages"] += 1
            break
        except Exception as exc:  # one page's failure ends paging, never the harvest
            errors.append(f"{label} page at {page_url} (cursor {cursor!r}): {describe_error(exc)}")
            counts["failed_pages"] += 1
            break
        counts["pages"] += 1
        for item in page.items:
            counts["seen"] += 1
            try:
                question = to_question(item)
            except SkipItem as skip:
                counts[f"skipped_{skip.reason}"] += 1
                if skip.error:
                    listed = f" (listed at {page_url})" if page_url else ""
                    errors.append(skip.error + listed)
                continue
            except Exception as exc:  # an item the adapter did not foresee: skipped alone
                counts["skipped_malformed"] += 1
                errors.append(f"{label} listed at {page_url} is malformed: {describe_error(exc)}")
                continue
            if question.external_id in questions:
                counts["skipped_duplicate"] += 1
                continue
            questions[question.external_id] = question
            if len(questions) >= limit:
                break
        if len(questions) >= limit:
            break
        if page.next_cursor is None or page.next_cursor == cursor:
            if page.end_error:
                errors.append(page.end_error)
            break
        cursor = page.next_cursor
    counts["harvested"] = len(questions)
    return HarvestResult(questions=list(questions.values()), errors=errors, counts=counts)


def resolve_each(
    external_ids: Iterable[str],
    fetch_resolution: Callable[[str], SourceResolution | None],
    *,
    label: str,
) -> ResolveResult:
    """`fetch_resolution(id)` once per distinct id; None (still open) is left out.

    Whatever one id raises (a failed request, a malformed or too deeply nested payload, any
    other exception) becomes one error line and never stops the rest; `label` names the kind
    of item in those lines ("kalshi: market").
    """
    resolutions: list[SourceResolution] = []
    errors: list[str] = []
    for external_id in dict.fromkeys(external_ids):
        try:
            resolution = fetch_resolution(external_id)
        except (SourceError, ItemError) as exc:
            errors.append(str(exc))
            continue
        except Exception as exc:  # the item's boundary: nothing one id does stops the others
            errors.append(f"{label} {external_id}: {describe_error(exc)}")
            continue
        if resolution is not None:
            resolutions.append(resolution)
    return ResolveResult(resolutions=resolutions, errors=errors)


class ToResolution(Protocol):
    """An adapter's parser of one item's payload: its SourceResolution, None while it is open."""

    def __call__(self, payload: dict[str, Any], /, *, now: datetime) -> SourceResolution | None: ...


def _no_headers(token: str | None) -> None:
    """Public APIs: the token is not sent."""
    return None


def per_id_fetch_resolutions(
    source: str,
    default_base_url: str,
    *,
    path: str,
    item: str,
    to_resolution: ToResolution,
    headers: Callable[[str | None], dict[str, str] | None] = _no_headers,
    wrapped_in: str | None = None,
) -> Callable[..., ResolveResult]:
    """An adapter's `fetch_resolutions(client, base_url, external_ids, *, now, token)`.

    It GETs `base_url` + `path` (`{id}` replaced by the external id) once per id, with
    `headers(token)`, takes the payload from under `wrapped_in` when the reply wraps it, and
    parses it with `to_resolution(payload, now=now)` (`now` defaults to the current time).
    Unresolved items are left out and failures listed as in `resolve_each`, labelled
    "<source>: <item>".
    """

    def fetch_resolutions(
        client: SourceClient,
        base_url: str = default_base_url,
        external_ids: Iterable[str] = (),
        *,
        now: datetime | None = None,
        token: str | None = None,
    ) -> ResolveResult:
        at = now or utc_now()
        request_headers = headers(token)

        def fetch_resolution(external_id: str) -> SourceResolution | None:
            url = join_url(base_url, path.format(id=quote(str(external_id), safe="")))
            payload = client.get_json(source, url, headers=request_headers)
            try:
                if wrapped_in is not None:
                    payload = payload[wrapped_in]
                return to_resolution(payload, now=at)
            except Exception as exc:
                raise ItemError(
                    f"{source}: {item} {external_id}: {url}: malformed resolution: "
                    f"{describe_error(exc)}"
                ) from exc

        return resolve_each(external_ids, fetch_resolution, label=f"{source}: {item}")

    fetch_resolutions.__doc__ = (
        f"GET {path} for each id; unresolved {item}s are left out, failures listed."
    )
    return fetch_resolutions


def payload_resolution(
    source: str,
    payload: dict[str, Any],
    external_id: Any,
    outcome: tuple[OutcomeStatus, float | None],
    *,
    resolved_at: datetime | None,
    now: datetime,
    final: bool = True,
) -> SourceResolution:
    """The SourceResolution of a decided item: `outcome` is (status, value), `resolved_at`
    falls back to `now` when the source gives no time, and raw is a copy of `payload`."""
    status, value = outcome
    return SourceResolution(
        source=source,
        external_id=str(external_id),
        status=status,
        value=value,
        resolved_at=resolved_at or now,
        final=final,
        raw=dict(payload),
    )
