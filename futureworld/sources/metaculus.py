"""Metaculus adapter: open binary question posts and their resolutions (API 2, /api/posts/).

GET /api/posts/?limit=&offset=&statuses=open&forecast_type=binary with `Authorization: Token …`
returns {"results": [post], "next": url|null}; GET /api/posts/{id}/ returns one post. A post's
`question` carries type, status, times, `resolution` and the community `aggregations`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, QuestionKind, utc_now
from futureworld.sources.base import (
    HarvestResult,
    Page,
    SkipItem,
    SourceResolution,
    clamp_probability,
    close_skip_reason,
    from_iso,
    harvest_pages,
    listed_items,
    malformed_item,
    payload_resolution,
    per_id_fetch_resolutions,
)
from futureworld.sources.http import SourceClient, join_url

SOURCE = "metaculus"
DEFAULT_BASE_URL = "https://www.metaculus.com"
ANNULLED_RESOLUTIONS = frozenset({"annulled", "ambiguous"})


def _headers(token: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Token {token}"} if token else None


def community_p_yes(question: dict[str, Any]) -> float | None:
    """The latest recency-weighted community P(yes) (`centers[0]`, else forecast_values[1])."""
    aggregations = question.get("aggregations") or {}
    for method in ("recency_weighted", "unweighted"):
        latest = (aggregations.get(method) or {}).get("latest") or {}
        centers = latest.get("centers") or []
        if centers:
            return clamp_probability(centers[0])
        values = latest.get("forecast_values") or []
        if len(values) == 2:
            return clamp_probability(values[1])
    return None


def post_to_question(post: dict[str, Any], base_url: str, *, now: datetime) -> Question:
    """A binary question post to a Question; KeyError/ValueError when malformed."""
    question = post["question"]
    created_at = from_iso(post.get("published_at")) or from_iso(post.get("created_at")) or now
    categories = ((post.get("projects") or {}).get("category")) or []
    domain = str(categories[0].get("name") or "") if categories else ""
    criteria = question.get("resolution_criteria") or ""
    if question.get("fine_print"):
        criteria = f"{criteria}\n\n{question['fine_print']}".strip()
    return Question(
        source=SOURCE,
        external_id=str(post["id"]),
        kind=QuestionKind.BINARY,
        title=str(post.get("title") or question["title"]).strip(),
        background=question.get("description") or "",
        resolution_criteria=criteria,
        url=join_url(base_url, f"/questions/{post['id']}/"),
        domain=domain,
        created_at=created_at,
        info_cutoff_at=now,
        close_at=from_iso(question.get("scheduled_close_time")),
        resolve_by=from_iso(question.get("scheduled_resolve_time")),
        crowd_probability=community_p_yes(question),
        extra={"question_id": question.get("id")},
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
    """Offset-page open binary posts; group and conditional posts are skipped and counted."""
    now = now or utc_now()
    url = join_url(base_url, "/api/posts/")

    def fetch_page(offset: int | None) -> Page:
        offset = offset or 0
        params = {
            "limit": page_size,
            "offset": offset,
            "statuses": "open",
            "forecast_type": "binary",
        }
        page = client.get_json(SOURCE, url, params=params, headers=_headers(token))
        results = listed_items(page, "results", source=SOURCE, url=url)
        more = bool(page.get("next")) and bool(results)
        return Page(items=results, next_cursor=offset + len(results) if more else None)

    def to_question(post: Any) -> Question:
        reason = _skip_reason(post, now)
        if reason:
            raise SkipItem(reason)
        with malformed_item(f"{SOURCE}: post {post.get('id')!r}"):
            question = post_to_question(post, base_url, now=now)
        return question

    return harvest_pages(
        fetch_page,
        to_question,
        limit=limit,
        max_pages=max_pages,
        page_url=url,
        label=f"{SOURCE}: post",
    )


def _skip_reason(post: Any, now: datetime) -> str | None:
    if not isinstance(post, dict) or "id" not in post:
        return "malformed"
    question = post.get("question")
    if not isinstance(question, dict) or question.get("type") != "binary":
        return "not_binary"
    if question.get("status", "open") != "open" or question.get("resolution") is not None:
        return "closed"
    return close_skip_reason(question.get("scheduled_close_time"), from_iso, now)


def post_to_resolution(post: dict[str, Any], *, now: datetime) -> SourceResolution | None:
    """yes → 1, no → 0, annulled/ambiguous → annulled; None while unresolved."""
    question = post["question"]
    resolution = question.get("resolution")
    if resolution is None or resolution == "":
        return None
    resolution = str(resolution).lower()
    if resolution in ANNULLED_RESOLUTIONS:
        status, value = OutcomeStatus.ANNULLED, None
    elif resolution in ("yes", "no"):
        status, value = OutcomeStatus.RESOLVED, 1.0 if resolution == "yes" else 0.0
    else:
        raise ValueError(f"unknown binary resolution {question.get('resolution')!r}")
    return payload_resolution(
        SOURCE,
        post,
        post["id"],
        (status, value),
        resolved_at=from_iso(question.get("actual_resolve_time")),
        now=now,
    )


fetch_resolutions = per_id_fetch_resolutions(
    SOURCE,
    DEFAULT_BASE_URL,
    path="/api/posts/{id}/",
    item="post",
    to_resolution=post_to_resolution,
    headers=_headers,
)
