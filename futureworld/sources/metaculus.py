"""Metaculus adapter: open binary question posts and their resolutions (API 2, /api/posts/).

GET /api/posts/?limit=&offset=&statuses=open&forecast_type=binary with `Authorization: Token …`
returns {"results": [post], "next": url|null}; GET /api/posts/{id}/ returns one post. A post's
`question` carries type, status, times, `resolution` and the community `aggregations`.
"""

from __future__ import annotations

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
    questions: dict[str, Question] = {}
    counts: Counter[str] = Counter()
    errors: list[str] = []
    offset = 0
    for _ in range(max_pages):
        params = {
            "limit": page_size,
            "offset": offset,
            "statuses": "open",
            "forecast_type": "binary",
        }
        try:
            page = client.get_json(SOURCE, url, params=params, headers=_headers(token))
        except SourceError as exc:
            errors.append(str(exc))
            counts["failed_pages"] += 1
            break
        results = page.get("results") if isinstance(page, dict) else None
        if not isinstance(results, list):
            errors.append(f"{SOURCE}: {url}: expected {{'results': [...]}}, got {str(page)[:120]}")
            counts["failed_pages"] += 1
            break
        counts["pages"] += 1
        for post in results:
            counts["seen"] += 1
            reason = _skip_reason(post, now)
            if reason:
                counts[f"skipped_{reason}"] += 1
                continue
            try:
                question = post_to_question(post, base_url, now=now)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                errors.append(f"{SOURCE}: post {post.get('id')!r} is malformed: {exc!r}")
                counts["skipped_malformed"] += 1
                continue
            if question.external_id in questions:
                counts["skipped_duplicate"] += 1
                continue
            questions[question.external_id] = question
            if len(questions) >= limit:
                break
        offset += len(results)
        if len(questions) >= limit or not page.get("next") or not results:
            break
    counts["harvested"] = len(questions)
    return HarvestResult(questions=list(questions.values()), errors=errors, counts=counts)


def _skip_reason(post: Any, now: datetime) -> str | None:
    if not isinstance(post, dict) or "id" not in post:
        return "malformed"
    question = post.get("question")
    if not isinstance(question, dict) or question.get("type") != "binary":
        return "not_binary"
    if question.get("status", "open") != "open" or question.get("resolution") is not None:
        return "closed"
    try:
        close_at = from_iso(question.get("scheduled_close_time"))
    except (TypeError, ValueError):
        return "malformed"
    if close_at is not None and close_at <= now:
        return "closed"
    return None


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
    return SourceResolution(
        source=SOURCE,
        external_id=str(post["id"]),
        status=status,
        value=value,
        resolved_at=from_iso(question.get("actual_resolve_time")) or now,
        final=True,
        raw=dict(post),
    )


def fetch_resolutions(
    client: SourceClient,
    base_url: str = DEFAULT_BASE_URL,
    external_ids: Iterable[str] = (),
    *,
    now: datetime | None = None,
    token: str | None = None,
) -> ResolveResult:
    """GET /api/posts/{id}/ for each id; unresolved posts are left out, failures listed."""
    now = now or utc_now()
    resolutions: list[SourceResolution] = []
    errors: list[str] = []
    for external_id in dict.fromkeys(external_ids):
        url = join_url(base_url, f"/api/posts/{external_id}/")
        try:
            post = client.get_json(SOURCE, url, headers=_headers(token))
            resolution = post_to_resolution(post, now=now)
        except SourceError as exc:
            errors.append(str(exc))
            continue
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            errors.append(f"{SOURCE}: post {external_id}: malformed resolution: {exc!r}")
            continue
        if resolution is not None:
            resolutions.append(resolution)
    return ResolveResult(resolutions=resolutions, errors=errors)
