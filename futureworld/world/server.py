"""Serves a World over loopback HTTP as RSS 2.0 feeds and a Manifold-compatible v0 market API.

Owns routing and time-gating: everything served is what the world has published, posed or
resolved by `clock.now()`. Wire formats live in payloads.py.

Routes:
  GET /feeds/{topic}.xml, /feeds/all.xml   RSS 2.0, newest first, items published in the
                                           FEED_WINDOW before now (a real feed carries its
                                           latest items, not its whole history)
  (every 200 carries an ETag; a matching If-None-Match gets 304 Not Modified)
  GET /articles/{guid}                     the article page (404 until published)
  GET /v0/markets?limit=&before=           LiteMarkets created ≤ now, newest first, of every
                                           kind the world poses (BINARY, and MULTIPLE_CHOICE
                                           and PSEUDO_NUMERIC when configured); `before` is
                                           the id of the last market of the previous page;
                                           limit defaults to 500, at most 1000
  GET /v0/market/{id}                      a FullMarket (404 until created); resolution fields
                                           appear only once now ≥ its resolution time
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from futureworld.world.clock import SimClock
from futureworld.world.model import World
from futureworld.world.outcomes import KindResolution, Resolution
from futureworld.world.payloads import (
    article_html,
    full_market,
    kind_market,
    lite_market,
    rss_document,
)
from futureworld.world.questions import SimKindQuestion, SimQuestion
from futureworld.world.vocabulary import Topic

FEED_WINDOW = timedelta(days=7)
"""How far back a feed reaches: a daily harvest sees every item, and a long run's feed stays
the size of a few days' news instead of growing with the world's whole history."""
DEFAULT_MARKETS_LIMIT = 500
MAX_MARKETS_LIMIT = 1000
ALL_FEED = "all"


@dataclass(frozen=True)
class _Reply:
    status: HTTPStatus
    content_type: str
    body: bytes


def _json(status: HTTPStatus, payload: Any) -> _Reply:
    return _Reply(status, "application/json", json.dumps(payload).encode("utf-8"))


def _error(status: HTTPStatus, message: str) -> _Reply:
    # Manifold answers errors as {"message": ...}.
    return _json(status, {"message": message})


class _WorldRoutes:
    """Request path + query → reply, against the world as of the clock's now."""

    def __init__(self, world: World, clock: SimClock, base_url: str) -> None:
        self.world = world
        self.clock = clock
        self.base_url = base_url

    def handle(self, raw_path: str) -> _Reply:
        parts = urlsplit(raw_path)
        path = unquote(parts.path).rstrip("/")
        query = parse_qs(parts.query)
        if match := re.fullmatch(r"/feeds/([a-z]+)\.xml", path):
            return self.feed(match.group(1))
        if match := re.fullmatch(r"/articles/([A-Za-z0-9_-]+)", path):
            return self.article(match.group(1))
        if path == "/v0/markets":
            return self.markets(query)
        if match := re.fullmatch(r"/v0/market/([A-Za-z0-9_-]+)", path):
            return self.market(match.group(1))
        return _error(HTTPStatus.NOT_FOUND, f"no route for {parts.path!r}")

    def feed(self, name: str) -> _Reply:
        if name != ALL_FEED and name not in set(Topic):
            known = ", ".join([ALL_FEED, *Topic])
            return _error(HTTPStatus.NOT_FOUND, f"no feed {name!r}; feeds are: {known}")
        now = self.clock.now()
        topic = None if name == ALL_FEED else Topic(name)
        articles = [
            a
            for a in self.world.articles_published_by(now, topic)
            if a.published_at > now - FEED_WINDOW
        ]
        articles.reverse()
        body = rss_document(
            title=f"Simulated world news: {name}",
            link=f"{self.base_url}/feeds/{name}.xml",
            description=f"Seeded simulated news ({name}), world seed {self.world.config.seed}",
            articles=articles,
            base_url=self.base_url,
            # The newest item's date, not now: an unchanged feed keeps its bytes and ETag.
            built_at=articles[0].published_at if articles else self.world.config.start_at,
        )
        return _Reply(HTTPStatus.OK, "application/rss+xml; charset=utf-8", body)

    def article(self, guid: str) -> _Reply:
        try:
            article = self.world.article(guid)
        except KeyError:
            article = None
        if article is None or article.published_at > self.clock.now():
            return _error(HTTPStatus.NOT_FOUND, f"no article {guid!r}")
        return _Reply(HTTPStatus.OK, "text/html; charset=utf-8", article_html(article))

    def markets(self, query: dict[str, list[str]]) -> _Reply:
        limit_text = query.get("limit", [str(DEFAULT_MARKETS_LIMIT)])[-1]
        try:
            limit = int(limit_text)
        except ValueError:
            limit = -1
        if not 0 <= limit <= MAX_MARKETS_LIMIT:
            return _error(
                HTTPStatus.BAD_REQUEST,
                f"limit must be an integer in [0, {MAX_MARKETS_LIMIT}], got {limit_text!r}",
            )
        now = self.clock.now()
        newest_first = self.world.markets_posed_by(now)[::-1]
        if "before" in query:
            before = query["before"][-1]
            ids = [q.external_id for q in newest_first]
            if before not in ids:
                return _error(HTTPStatus.BAD_REQUEST, f"before: no market with id {before!r}")
            newest_first = newest_first[ids.index(before) + 1 :]
        page = [self._payload(q, now, full=False) for q in newest_first[:limit]]
        return _json(HTTPStatus.OK, page)

    def _payload(
        self, question: SimQuestion | SimKindQuestion, now: datetime, *, full: bool
    ) -> dict[str, Any]:
        resolution = self.world.resolution_as_of(question.external_id, now)
        if isinstance(question, SimQuestion):
            assert resolution is None or isinstance(resolution, Resolution)
            build = full_market if full else lite_market
            return build(question, resolution, now=now, base_url=self.base_url)
        assert resolution is None or isinstance(resolution, KindResolution)
        return kind_market(question, resolution, now=now, base_url=self.base_url, full=full)

    def market(self, market_id: str) -> _Reply:
        now = self.clock.now()
        try:
            question = self.world.market(market_id)
        except KeyError:
            question = None
        if question is None or question.created_at > now:
            return _error(HTTPStatus.NOT_FOUND, f"Contract not found: {market_id!r}")
        return _json(HTTPStatus.OK, self._payload(question, now, full=True))


class _Handler(BaseHTTPRequestHandler):
    routes: _WorldRoutes  # set on the per-server subclass
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, keep-alive clients wait ~40 ms each.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        try:
            reply = self.routes.handle(self.path)
        except Exception as exc:  # a bug must answer 500, not hang the client
            reply = _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        etag = f'"{hashlib.sha256(reply.body).hexdigest()[:20]}"'
        if reply.status is HTTPStatus.OK and self.headers.get("If-None-Match") == etag:
            # Conditional GET, as feed readers do: nothing new since their last fetch.
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        if reply.status is HTTPStatus.OK:
            self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: the pipeline's own logs say what was harvested.
        return


class WorldServer:
    """A running world server; `close()` (or leaving the `with` block) stops it."""

    def __init__(self, world: World, clock: SimClock, host: str, port: int) -> None:
        self.world = world
        self.clock = clock
        handler = type("WorldHandler", (_Handler,), {})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        bound_host, bound_port = self._httpd.server_address[:2]
        self.base_url = f"http://{bound_host}:{bound_port}"
        handler.routes = _WorldRoutes(world, clock, self.base_url)
        self._thread = threading.Thread(
            # A short poll keeps close() quick; the loop is idle between requests anyway.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"world-server-{bound_port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def manifold_base_url(self) -> str:
        """Base for a Manifold client: `{manifold_base_url}/v0/markets`."""
        return self.base_url

    @property
    def feed_urls(self) -> dict[str, str]:
        """Feed name (each topic, plus "all") → its RSS URL."""
        names = [*Topic, ALL_FEED]
        return {str(n): f"{self.base_url}/feeds/{n}.xml" for n in names}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> WorldServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_world(
    world: World, clock: SimClock, host: str = "127.0.0.1", port: int = 0
) -> WorldServer:
    """Start serving `world` as of `clock` on host:port (0 picks a free port) in a thread."""
    return WorldServer(world, clock, host, port)
