"""The one HTTP client layer every source uses: retries, backoff, 429 handling, rate limits.

It owns transport concerns only (no parsing of any platform's payloads). Secrets travel in
request headers chosen by the caller and are never logged nor copied into errors.

Every failure of one request comes out as a SourceError naming the URL, never as an httpx
exception: timeouts, connection errors, 5xx and 429 are retried; a redirect loop, a body that
cannot be decoded (bad Content-Encoding, bad gzip), an unusable URL and any other httpx error
are not, since another attempt gets the same answer. A JSON body nested too deep to decode
(RecursionError) is `bad_json` like any other malformed body.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

log = logging.getLogger(__name__)


class SourceError(Exception):
    """A source request that failed for good (after retries, or on a non-retryable status)."""

    def __init__(self, source: str, url: str, reason: str, *, kind: str = "error") -> None:
        self.source = source
        self.url = url
        self.reason = reason
        self.kind = kind
        """timeout | connection | truncated | http_status | rate_limited | redirects | decoding |
        bad_url | bad_json | error"""
        super().__init__(f"{source}: {url}: {reason}")


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """How patiently and how politely the sources talk to remote servers."""

    timeout_s: float = 20.0
    """Connect/read/write/pool timeout of one request attempt."""
    max_retries: int = 4
    """Extra attempts after the first for timeouts, connection errors, 5xx and 429."""
    backoff_base_s: float = 0.5
    """Backoff before retry k (0-based) is min(cap, base·2^k) scaled by a jitter in [0.5, 1]."""
    backoff_cap_s: float = 30.0
    """Upper bound of one backoff sleep, also of a server's Retry-After we honour."""
    rate_limit_per_s: Mapping[str, float] = field(default_factory=dict)
    """Requests per second allowed per source name; sources not listed use `default_rate_per_s`."""
    default_rate_per_s: float = 5.0
    """Rate limit of sources absent from `rate_limit_per_s`; 0 disables the limit."""
    user_agent: str = "futureworld/0.1 (+forecasting research harvester)"
    """Sent with every request so operators can identify the traffic."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_base_s < 0 or self.backoff_cap_s < 0:
            raise ValueError("backoff_base_s and backoff_cap_s must be >= 0")
        for name, rate in {**self.rate_limit_per_s, "default": self.default_rate_per_s}.items():
            if rate < 0:
                raise ValueError(f"rate limit of {name} must be >= 0, got {rate}")

    def rate_for(self, source: str) -> float:
        return self.rate_limit_per_s.get(source, self.default_rate_per_s)

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Exponential backoff with jitter: min(cap, base·2^attempt) · U(0.5, 1)."""
        return min(self.backoff_cap_s, self.backoff_base_s * 2**attempt) * rng.uniform(0.5, 1.0)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait per a Retry-After header (delta-seconds or HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


_RETRYABLE = (httpx.TimeoutException, httpx.TransportError)
_UNUSABLE_URL = (httpx.InvalidURL, httpx.UnsupportedProtocol)


def _final_error(exc: Exception) -> tuple[str, str]:
    """(reason, kind) of a request failure that another attempt would not fix."""
    if isinstance(exc, httpx.TooManyRedirects):
        return f"redirect loop or too many redirects: {exc}", "redirects"
    if isinstance(exc, httpx.DecodingError):
        return f"response body cannot be decoded (Content-Encoding): {exc}", "decoding"
    if isinstance(exc, _UNUSABLE_URL):
        return f"unusable URL: {exc}", "bad_url"
    return f"request failed ({type(exc).__name__}): {exc}", "error"


class SourceClient:
    """A synchronous httpx client with per-source retries and rate limits.

    Thread-safe: the rate limiter serialises request starts per source.
    """

    def __init__(
        self,
        config: HttpConfig | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
    ) -> None:
        self.config = config or HttpConfig()
        self._client = httpx.Client(
            timeout=self.config.timeout_s,
            headers={"User-Agent": self.config.user_agent},
            follow_redirects=True,
            transport=transport,
        )
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._next_slot: dict[str, float] = {}

    def __enter__(self) -> SourceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _wait_for_slot(self, source: str) -> None:
        rate = self.config.rate_for(source)
        if rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_slot.get(source, now))
            self._next_slot[source] = start + 1.0 / rate
        if start > now:
            self._sleep(start - now)

    def get(
        self,
        source: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """GET with retries; returns any response below 400 (304 included), else raises."""
        last_reason, last_kind = "no attempt made", "error"
        for attempt in range(self.config.max_retries + 1):
            self._wait_for_slot(source)
            delay: float | None = None
            try:
                response = self._client.get(url, params=params, headers=headers)
            except (*_UNUSABLE_URL, httpx.TooManyRedirects, httpx.DecodingError) as exc:
                reason, kind = _final_error(exc)
                raise SourceError(source, url, reason, kind=kind) from exc
            except httpx.TimeoutException as exc:
                last_reason, last_kind = f"timed out ({type(exc).__name__})", "timeout"
            except httpx.RemoteProtocolError as exc:
                # httpx raises this when the body ends before Content-Length: a truncated download.
                last_reason, last_kind = f"incomplete response: {exc}", "truncated"
            except _RETRYABLE as exc:
                last_reason, last_kind = f"connection failed: {exc}", "connection"
            except (httpx.HTTPError, httpx.StreamError) as exc:
                reason, kind = _final_error(exc)
                raise SourceError(source, url, reason, kind=kind) from exc
            else:
                status = response.status_code
                if status < 400:
                    return response
                if status == 429:
                    last_reason, last_kind = "rate limited (HTTP 429)", "rate_limited"
                    delay = parse_retry_after(response.headers.get("Retry-After"))
                    if delay is not None:
                        delay = min(delay, self.config.backoff_cap_s)
                elif status >= 500:
                    last_reason, last_kind = f"server error HTTP {status}", "http_status"
                else:
                    raise SourceError(
                        source, url, f"HTTP {status}: {response.text[:200]}", kind="http_status"
                    )
            if attempt == self.config.max_retries:
                break
            if delay is None:
                delay = self.config.backoff_s(attempt, self._rng)
            log.info("%s: %s: %s; retry %d in %.2fs", source, url, last_reason, attempt + 1, delay)
            self._sleep(delay)
        raise SourceError(
            source,
            url,
            f"{last_reason}; gave up after {self.config.max_retries + 1} attempts",
            kind=last_kind,
        )

    def get_json(
        self,
        source: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """GET and decode JSON; a body that is not JSON, or is nested too deep to decode,
        raises SourceError(kind="bad_json")."""
        response = self.get(source, url, params=params, headers=headers)
        try:
            return response.json()
        except ValueError as exc:
            raise SourceError(source, url, f"malformed JSON: {exc}", kind="bad_json") from exc
        except RecursionError as exc:
            reason = "malformed JSON: nested too deep to decode"
            raise SourceError(source, url, reason, kind="bad_json") from exc


def join_url(base_url: str, path: str) -> str:
    """base_url (a mirror, loopback, or the real host) + path, with exactly one slash between."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")
