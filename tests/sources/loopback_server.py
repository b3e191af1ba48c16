"""A scripted loopback HTTP server for the source tests: replies per path, records requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from futureworld.sources.http import HttpConfig


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | Any = b""
    """bytes/str are sent as is; anything else is JSON-encoded."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    truncate: bool = False
    """Announce more bytes than are sent, then close: a truncated download."""

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode("utf-8")
        return json.dumps(self.body).encode("utf-8")


@dataclass
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


Handler = Callable[[Request], Reply]


class ScriptedServer:
    """Serves per-path scripts: a list of replies used in order (the last one repeats) or a
    function of the request. Records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply] | Handler] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                request = Request(
                    path=parts.path,
                    query={k: v[-1] for k, v in parse_qs(parts.query).items()},
                    headers={k.lower(): v for k, v in self.headers.items()},
                )
                reply = server._reply_for(request)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = reply.payload()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                length = len(payload) + (500 if reply.truncate else 0)
                self.send_header("Content-Length", str(length))
                if reply.truncate:
                    self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self.wfile.write(payload)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if reply.truncate:
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def route(self, path: str, script: list[Reply] | Handler) -> None:
        self.routes[path] = list(script) if isinstance(script, list) else script

    def _reply_for(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            script = self.routes.get(request.path)
            if script is None:
                return Reply(404, {"error": f"no route {request.path}"})
            if callable(script):
                return script(request)
            return script.pop(0) if len(script) > 1 else script[0]

    def requests_to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


FAST = HttpConfig(
    timeout_s=0.5, max_retries=2, backoff_base_s=0.01, backoff_cap_s=0.05, default_rate_per_s=0
)
