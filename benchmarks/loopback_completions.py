"""A loopback stand-in for a vLLM OpenAI-compatible server that costs time, not CPU: each
completion sleeps `per_token_s` per generated token, in its own handler thread, so concurrent
requests overlap the way they do in a batching server, and the server counts the requests in
flight over time. It is how the HTTP rollout benchmark (benchmarks/predict_http.py) and its
test (tests/flows/test_predict_http.py) see whether the client keeps the server full.

Decisions made where a real server has no equivalent:
- No model: tokens come from a scripted policy seeded by the request's own `seed`, so the
  server spends microseconds of CPU per request and the measurement is the client's. A turn
  is `n` tokens, `n` uniform in [min_new_tokens, max_tokens] (n = max_tokens when
  min_new_tokens >= max_tokens): filler text, then an action. With chance `search_rate`
  the action is `<search>…</search>` (the agent loop runs a real corpus search and asks for
  the next turn), else `<probability>0.xx</probability>`. A turn whose action does not fit
  in max_tokens stops at "length", as vLLM does. Log-probs are seeded numbers in
  [-3, -0.01]: the right shape, not a distribution anything is trained on.
- Latency: `prefill_s + n · per_token_s` per request, slept after the tokens are chosen, with
  no cap on concurrent requests (vLLM's max_num_seqs is 256 and far above the client's
  limit), so every request the client sends is in flight at once.
- In flight: a request counts from the moment its body has been read until its response
  is ready to be written (so a client that has its answer never sees it still counted).
  `InFlightMeter` integrates the count over time; the mean number in flight is that
  integral over the busy window (the first request's arrival to the last one's departure
  since the last reset). Only /v1/completions requests count.
- HTTP/1.1 keep-alive and TCP_NODELAY, as vLLM's uvicorn: a client connection is reused
  request after request, and a response is not held back by Nagle's algorithm waiting for
  the client's delayed ACK (40 ms a request, outside the server's window, when it is on).
  GET /stats returns the meter's `LoadStats` as JSON, POST /stats/reset zeroes it.

Run in-process with `serve_loopback`, or as its own process (as a real server is, so its
threads do not share the client's interpreter lock) with `spawn_loopback`, which starts
`python benchmarks/loopback_completions.py --tokenizer DIR …` and reads the URL it prints.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer, PreTrainedTokenizerBase

FILLER = "Prices rose again, the committee met, and the reports so far point both ways. "
"""The text a scripted turn opens with, repeated as far as the turn's length needs."""


@dataclass(frozen=True, kw_only=True)
class SimulatedPolicy:
    """How the scripted server answers: how long turns are, how slow tokens are, how often a
    turn searches instead of answering."""

    per_token_s: float = 0.003
    """Seconds per generated token (a decode step of a batching server)."""
    prefill_s: float = 0.0
    """Seconds per request before its first token."""
    min_new_tokens: int = 16
    """Shortest turn; a turn's length is uniform in [min_new_tokens, max_tokens]."""
    search_rate: float = 0.0
    """Chance that a turn ends with a search action instead of a probability."""

    def __post_init__(self) -> None:
        if self.per_token_s < 0 or self.prefill_s < 0:
            raise ValueError(
                f"latencies must be >= 0, got per_token_s={self.per_token_s} "
                f"prefill_s={self.prefill_s}"
            )
        if self.min_new_tokens < 1:
            raise ValueError(f"min_new_tokens must be >= 1, got {self.min_new_tokens}")
        if not 0.0 <= self.search_rate <= 1.0:
            raise ValueError(f"search_rate must be in [0, 1], got {self.search_rate}")

    @property
    def tokens_per_s(self) -> float:
        """One request's decode rate; the server's ideal is this times the requests in flight."""
        return float("inf") if self.per_token_s == 0 else 1.0 / self.per_token_s


@dataclass(frozen=True, kw_only=True)
class LoadStats:
    """What the server saw since its last reset."""

    requests: int
    """Completions answered."""
    tokens: int
    """Tokens generated over those completions."""
    in_flight: int
    """Requests in flight right now."""
    max_in_flight: int
    busy_s: float
    """From the first request's arrival to the last departure (or now, while busy)."""
    request_s: float
    """The integral of the number in flight over time: the sum of every request's stay."""

    @property
    def mean_in_flight(self) -> float:
        return self.request_s / self.busy_s if self.busy_s > 0 else 0.0


class InFlightMeter:
    """Counts requests in flight and integrates the count over time; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._in_flight = 0
            self._max = 0
            self._requests = 0
            self._tokens = 0
            self._request_s = 0.0
            self._first: float | None = None
            self._last_change = 0.0
            self._last_departure = 0.0

    def enter(self) -> None:
        with self._lock:
            now = self._advance()
            if self._first is None:
                self._first = now
            self._in_flight += 1
            self._max = max(self._max, self._in_flight)

    def leave(self, tokens: int) -> None:
        with self._lock:
            if self._in_flight == 0:
                raise RuntimeError("a request left that never entered")
            now = self._advance()
            self._in_flight -= 1
            self._requests += 1
            self._tokens += tokens
            self._last_departure = now

    def snapshot(self) -> LoadStats:
        with self._lock:
            now = self._clock()
            request_s = self._request_s + self._in_flight * (now - self._last_change)
            if self._first is None:
                busy_s = 0.0
            else:
                end = now if self._in_flight else self._last_departure
                busy_s = end - self._first
            return LoadStats(
                requests=self._requests,
                tokens=self._tokens,
                in_flight=self._in_flight,
                max_in_flight=self._max,
                busy_s=busy_s,
                request_s=request_s,
            )

    def _advance(self) -> float:
        """Add the time since the last change at the count that held during it."""
        now = self._clock()
        if self._in_flight:
            self._request_s += self._in_flight * (now - self._last_change)
        self._last_change = now
        return now


class ScriptedCompletions:
    """The tokens and log-probs of one scripted turn, from the request's seed alone."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, policy: SimulatedPolicy) -> None:
        self.policy = policy
        encode = tokenizer.encode
        self._filler = encode(FILLER * 4, add_special_tokens=False)
        self._search = encode("<search>rates decision</search>", add_special_tokens=False)
        self._answers = [
            encode(f"<probability>0.{p:02d}</probability>", add_special_tokens=False)
            for p in range(100)
        ]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The completion body's choice, scripted; its own seed decides everything."""
        max_tokens = int(body["max_tokens"])
        rng = random.Random(body.get("seed"))
        n = rng.randint(min(self.policy.min_new_tokens, max_tokens), max_tokens)
        if rng.random() < self.policy.search_rate:
            action, stop = self._search, "</search>"
        else:
            action, stop = self._answers[rng.randrange(100)], "</probability>"
        stops = set(body.get("stop") or ())
        fill = max(0, n - len(action))
        ids = (self._filler * (fill // len(self._filler) + 1))[:fill] + action
        finish, stop_reason = "stop", stop if stop in stops else None
        if len(ids) > max_tokens or stop not in stops:
            ids, finish, stop_reason = ids[:max_tokens], "length", None
        logprobs = [-rng.uniform(0.01, 3.0) for _ in ids]
        return {
            "index": 0,
            "text": "",
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": logprobs,
                "top_logprobs": [],
                "text_offset": [],
            },
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": ids,
        }


@dataclass(frozen=True)
class LoopbackServer:
    url: str
    meter: InFlightMeter


def _handler(
    script: ScriptedCompletions, meter: InFlightMeter, served_name: str
) -> type[BaseHTTPRequestHandler]:
    policy = script.policy

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        """TCP_NODELAY, as uvicorn sets: headers and body go out as two writes, and with
        Nagle on the body would wait for the client's delayed ACK (40 ms)."""

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                return self._send(200, None)
            if self.path == "/v1/models":  # one model, named as vLLM names a served directory
                return self._send(200, {"object": "list", "data": [{"id": served_name}]})
            if self.path != "/stats":
                return self._send(404, {"error": f"no route {self.path}"})
            stats = meter.snapshot()
            return self._send(200, {**asdict(stats), "mean_in_flight": stats.mean_in_flight})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path == "/stats/reset":
                meter.reset()
                return self._send(200, None)
            if self.path != "/v1/completions":
                return self._send(404, {"error": f"no route {self.path}"})
            meter.enter()
            try:
                choice = script.complete(json.loads(raw))
            except (KeyError, TypeError, ValueError) as error:
                meter.leave(0)
                return self._send(400, {"error": f"bad completion request: {error!r}"})
            tokens = len(choice["token_ids"])
            time.sleep(policy.prefill_s + tokens * policy.per_token_s)
            meter.leave(tokens)
            payload = {"id": "cmpl-loopback", "object": "text_completion"}
            return self._send(200, {**payload, "choices": [choice]})

        def _send(self, status: int, payload: Any) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    """Room for every connection a client opens at once (the default backlog is 5)."""

    def __init__(self, tokenizer_dir: Path, policy: SimulatedPolicy, port: int) -> None:
        tokenizer = AutoTokenizer.from_pretrained(Path(tokenizer_dir), local_files_only=True)
        self.meter = InFlightMeter()
        handler = _handler(
            ScriptedCompletions(tokenizer, policy), self.meter, Path(tokenizer_dir).name
        )
        super().__init__(("127.0.0.1", port), handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def serve_loopback(tokenizer_dir: Path, policy: SimulatedPolicy) -> Iterator[LoopbackServer]:
    """The server in a thread of this process on a free loopback port."""
    server = _Server(tokenizer_dir, policy, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LoopbackServer(server.url, server.meter)
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def spawn_loopback(tokenizer_dir: Path, policy: SimulatedPolicy) -> Iterator[str]:
    """The server as its own process; yields its base URL. Read its meter with `fetch_stats`."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--tokenizer",
        str(tokenizer_dir),
        "--per-token-s",
        repr(policy.per_token_s),
        "--prefill-s",
        repr(policy.prefill_s),
        "--min-new-tokens",
        str(policy.min_new_tokens),
        "--search-rate",
        repr(policy.search_rate),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"loopback server did not start (exit {process.poll()}): {line!r}")
        yield line
    finally:
        process.terminate()
        process.wait(timeout=10)


def fetch_stats(url: str) -> LoadStats:
    body = httpx.get(f"{url}/stats").raise_for_status().json()
    body.pop("mean_in_flight")
    return LoadStats(**body)


def reset_stats(url: str) -> None:
    httpx.post(f"{url}/stats/reset").raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--per-token-s", type=float, default=SimulatedPolicy.per_token_s)
    parser.add_argument("--prefill-s", type=float, default=SimulatedPolicy.prefill_s)
    parser.add_argument("--min-new-tokens", type=int, default=SimulatedPolicy.min_new_tokens)
    parser.add_argument("--search-rate", type=float, default=SimulatedPolicy.search_rate)
    args = parser.parse_args()
    policy = SimulatedPolicy(
        per_token_s=args.per_token_s,
        prefill_s=args.prefill_s,
        min_new_tokens=args.min_new_tokens,
        search_rate=args.search_rate,
    )
    server = _Server(args.tokenizer, policy, args.port)
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
