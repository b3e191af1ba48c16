"""A generation stream: requests go in one at a time while others are running, finished
generations come out as they finish. It is how the rollout engine keeps a backend full across
questions (the local backend batches every active row into each decode step; the HTTP
backend keeps `max_concurrency` requests in flight).

Every request carries its own seed, so what a request samples never depends on the requests
around it. `generate_all` runs a plain batch through a stream with the batch seed rule of
`PolicyBackend.generate`: row i samples with seed + i.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from futureworld.policy.base import Generation, SamplingParams


class GenerationError(RuntimeError):
    """A request could not be generated (a backend error after its retries)."""


@dataclass(frozen=True, kw_only=True)
class StreamRequest:
    """One prompt to continue, with its own sampling parameters and seed."""

    key: int
    """The caller's handle; results come back with it."""
    prompt: tuple[int, ...]
    params: SamplingParams
    """`params.seed` is this request's own seed (None: a fresh random one)."""


@dataclass(frozen=True, kw_only=True)
class StreamResult:
    """A finished request: its generation, or why there is none."""

    key: int
    generation: Generation | None = None
    error: BaseException | None = None
    """Why the request failed (the backend's own exception)."""


class GenerationStream(Protocol):
    """Requests in, finished generations out, many in flight at once."""

    def offer(self, request: StreamRequest) -> bool:
        """Take the request if there is room for it now (True), else leave it (False).
        An empty stream always takes a request, however large."""
        ...

    def advance(self) -> list[StreamResult]:
        """Make progress and return the requests that finished (possibly none yet)."""
        ...

    def wake(self) -> None:
        """From any thread: an `advance` blocked waiting for requests (or the next one) returns
        now, possibly with nothing, so its caller can act on something else that finished.
        A stream whose `advance` never blocks on others makes this a no-op."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests taken and not yet returned."""
        ...

    @property
    def stepped(self) -> bool:
        """Whether `advance` is one step of a computation that depends only on what was
        offered, never on time (a local decode step): the rollout engine then takes tool
        results back at points fixed by the steps, so a seeded run repeats exactly. False
        where requests end when a server answers them."""
        ...

    def close(self) -> None:
        """Drop everything still in flight and free the resources."""
        ...


def fresh_seed() -> int:
    """A random 32-bit seed for a request sent without one."""
    return secrets.randbits(32)


def generate_all(
    stream: GenerationStream, prompts: Sequence[Sequence[int]], params: SamplingParams
) -> list[Generation]:
    """A batch through a stream: row i samples with params.seed + i (a random seed per row
    without one); raises the first failed row's error. The stream is closed after."""
    queue = [
        StreamRequest(
            key=i,
            prompt=tuple(int(t) for t in prompt),
            params=replace(params, seed=fresh_seed() if params.seed is None else params.seed + i),
        )
        for i, prompt in enumerate(prompts)
    ]
    results: dict[int, Generation] = {}
    errors: list[BaseException] = []
    try:
        queue.reverse()
        while queue or stream.in_flight:
            while queue and stream.offer(queue[-1]):
                queue.pop()
            for result in stream.advance():
                if result.generation is None:
                    errors.append(result.error or GenerationError(f"row {result.key} failed"))
                else:
                    results[result.key] = result.generation
    finally:
        stream.close()
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(prompts))]


class SequentialStream:
    """A stream over any batch `generate` function, one request per call: for backends
    (and test stand-ins) without their own scheduling. Each request keeps its own seed."""

    def __init__(
        self, generate: Callable[[Sequence[Sequence[int]], SamplingParams], list[Generation]]
    ) -> None:
        self._generate = generate
        self._waiting: list[StreamRequest] = []

    def offer(self, request: StreamRequest) -> bool:
        self._waiting.append(request)
        return True

    def advance(self) -> list[StreamResult]:
        waiting, self._waiting = self._waiting, []
        results = []
        for request in waiting:
            try:
                [generation] = self._generate([request.prompt], request.params)
            except Exception as error:  # The request fails, the stream goes on.
                results.append(StreamResult(key=request.key, error=error))
            else:
                results.append(StreamResult(key=request.key, generation=generation))
        return results

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    @property
    def stepped(self) -> bool:
        return True

    def wake(self) -> None:
        pass  # `advance` runs the waiting requests at once; it never blocks on others.

    def close(self) -> None:
        self._waiting = []
