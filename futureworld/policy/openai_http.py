"""Backend for a vLLM OpenAI-compatible server: prompts go out as token ids, token ids
and behaviour log-probs come back. Retries with backoff on connection errors and 5xx.

Which log-probs come back: vLLM's `ModelConfig.logprobs_mode` decides, per server. Its
default, `raw_logprobs`, returns log softmax of the raw logits, before any logit processor,
temperature or top-k/top-p; `processed_logprobs` returns them "after applying all
processors, including temperature and top_k/top_p" (vLLM's own words), i.e. the log of the
distribution the token was actually drawn from. This backend needs the processed ones, and
the server must run with `--logprobs-mode processed_logprobs` (infra/vllm/serve.sh does).
Each request also switches off every other processor vLLM would otherwise take from the
checkpoint's generation_config (repetition, frequency and presence penalties, min_p, top_k),
so the processed log-prob is exactly log softmax(logits / T), renormalised over the top-p
nucleus when top_p < 1: the μ the trainer compares against. `LOGPROBS_MODE` names this.

One request per prompt, each with its own seed (vLLM seeds a per-request generator, so a
request samples the same whatever else the server batches); `open_stream` keeps up to
`max_concurrency` requests in flight across questions, on as many worker threads started
with the stream, with a connection pool of the same size kept alive between requests. A
LoRA adapter is selected by passing its served name as `model`; `load_adapter` registers a
new one at runtime.

Which version the server samples: a backend samples one served name (a policy version's
adapter, or a full checkpoint served under its own name), and refuses to sample before the
server lists that name in GET /v1/models (`require_serving`, once per backend, when its first
stream opens), so a predict run never records rollouts of a version the server does not
hold. Each completion names the model that answered (vLLM's "model" field); an answer from
another model is an error, so `describe()` — stored on every rollout as
sampling["backend"] — names the version the server actually served.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.streaming import (
    GenerationError,
    StreamRequest,
    StreamResult,
    fresh_seed,
    generate_all,
)

LOGPROBS_MODE = "processed_logprobs"
"""The vLLM `--logprobs-mode` this backend's log-probs must come from: after temperature
and top-p, with no other processor (the request disables them)."""


class BackendError(GenerationError):
    """The server could not produce a generation (after retries, or a 4xx)."""


class NotServingError(BackendError):
    """The server does not serve the model this backend samples (the agent's version)."""


@dataclass(frozen=True, kw_only=True)
class HttpBackendConfig:
    """Where the server is and how patiently to talk to it."""

    base_url: str
    """Server root, e.g. http://127.0.0.1:8000 (without /v1)."""
    model: str
    """Served model name, or the name of a loaded LoRA adapter to sample from it."""
    timeout_s: float = 300.0
    """Per-request timeout (connect, read, write)."""
    max_retries: int = 3
    """Extra attempts after a connection error, timeout or 5xx; 4xx is never retried."""
    backoff_s: float = 0.5
    """Wait before retry k is backoff_s · 2^k."""
    max_concurrency: int = 32
    """Requests in flight at once; the server batches them itself."""
    api_key: str | None = None
    """Sent as a bearer token when set."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0:
            raise ValueError(
                f"invalid timeout_s={self.timeout_s} max_retries={self.max_retries} "
                f"backoff_s={self.backoff_s}"
            )
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))


class OpenAIHttpBackend:
    """`PolicyBackend` over POST /v1/completions, one request per prompt."""

    def __init__(self, config: HttpBackendConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config = config
        self._tokenizer = tokenizer
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._client = httpx.Client(
            base_url=config.base_url,
            timeout=config.timeout_s,
            headers=headers,
            limits=httpx.Limits(
                max_connections=config.max_concurrency,
                max_keepalive_connections=config.max_concurrency,
            ),
        )
        self._serving_checked = False

    @classmethod
    def from_tokenizer_dir(
        cls, tokenizer_dir: Path, *, base_url: str, model: str, **options: Any
    ) -> OpenAIHttpBackend:
        """Load the served model's tokenizer from a local directory, offline."""
        tokenizer = AutoTokenizer.from_pretrained(Path(tokenizer_dir), local_files_only=True)
        return cls(HttpBackendConfig(base_url=base_url, model=model, **options), tokenizer)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def describe(self) -> str:
        return f"openai:{self.config.base_url}/{self.config.model}"

    def with_model(self, model: str) -> OpenAIHttpBackend:
        """The same server and tokenizer, sampling from another served model or adapter."""
        return OpenAIHttpBackend(replace(self.config, model=model), self._tokenizer)

    def close(self) -> None:
        self._client.close()

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """One request per prompt, in parallel, row i with seed + i: a batched request would
        share one seed, and the G identical prompts of a group would sample alike."""
        return generate_all(self.open_stream(), prompts, params)

    def open_stream(self) -> _HttpStream:
        """Up to `max_concurrency` requests in flight; `advance` returns as soon as one ends.
        The first stream of a backend checks that the server serves its model."""
        if not self._serving_checked:
            self.require_serving()
            self._serving_checked = True
        return _HttpStream(self)

    def served_models(self) -> list[str]:
        """The names the server samples from now (GET /v1/models: base and adapters)."""
        body = self._get("/v1/models")
        try:
            return [str(m["id"]) for m in body["data"]]
        except (KeyError, TypeError) as error:
            raise BackendError(
                f"{self.describe()}: unexpected /v1/models response: {str(body)[:300]}"
            ) from error

    def require_serving(self) -> None:
        """Refuses (NotServingError) when the server does not list this backend's model."""
        served = self.served_models()
        if self.config.model not in served:
            raise NotServingError(
                f"{self.config.base_url} serves {served}, not {self.config.model!r} (the "
                "policy version to sample): refusing to sample; serve the new version first "
                "(futureworld serve, or the pipeline's serve step after training)"
            )

    def wait_until_serving(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Polls GET /health and /v1/models until the server serves this backend's model;
        returns the seconds waited. Raises NotServingError after `timeout_s`."""
        started = time.monotonic()
        last = "no answer yet"
        while True:
            try:
                health = self._client.get("/health")
                if health.status_code == 200:
                    served = self.served_models()
                    if self.config.model in served:
                        return time.monotonic() - started
                    last = f"serving {served}"
                else:
                    last = f"/health answered HTTP {health.status_code}"
            except (httpx.TransportError, BackendError) as error:
                last = f"{type(error).__name__}: {error}"
            if time.monotonic() - started > timeout_s:
                raise NotServingError(
                    f"{self.config.base_url} did not serve {self.config.model!r} within "
                    f"{timeout_s:.0f} s ({last})"
                )
            time.sleep(poll_s)

    def load_adapter(self, name: str, path: Path | str) -> None:
        """Register a LoRA adapter directory (as seen by the server) under `name`.

        Needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on the server. Sample from it with
        `with_model(name)`. A name the server already lists is left as it is (vLLM refuses
        to load a name twice), so loading is idempotent.
        """
        if name in self.served_models():
            return
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def _payload(
        self, prompt: Sequence[int], params: SamplingParams, seed: int | None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.config.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # Every other processor off, whatever the checkpoint's generation_config says.
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "n": 1,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if params.stop:
            payload["stop"] = list(params.stop)
        if seed is not None:
            payload["seed"] = seed
        return payload

    def _complete(self, payload: dict[str, Any]) -> Generation:
        body = self._post("/v1/completions", payload)
        answered = body.get("model") if isinstance(body, dict) else None
        if answered is not None and answered != payload["model"]:
            raise NotServingError(
                f"{self.describe()}: the server answered with model {answered!r}, not "
                f"{payload['model']!r}; the rollout is not recorded as that version's"
            )
        try:
            choice = body["choices"][0]
            return _generation_from_choice(choice)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise BackendError(
                f"{self.describe()}: unexpected completion response ({error!r}): {str(body)[:500]}"
            ) from error

    def _get(self, path: str) -> Any:
        return self._post(path, None)

    def _post(self, path: str, payload: dict[str, Any] | None) -> Any:
        """POST `payload` (GET when None), retried on connection errors and 5xx."""
        last_error = ""
        method = "GET" if payload is None else "POST"
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:
                response = (
                    self._client.get(path)
                    if payload is None
                    else self._client.post(path, json=payload)
                )
            except httpx.TransportError as error:  # Connection refused/reset, timeouts.
                last_error = f"{type(error).__name__}: {error}"
                continue
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise BackendError(
                    f"{self.describe()}: {method} {path} rejected with HTTP "
                    f"{response.status_code}: {response.text[:500]}"
                )
            return response.json() if response.content else None
        raise BackendError(
            f"{self.describe()}: {method} {path} failed after "
            f"{self.config.max_retries + 1} attempts; last error: {last_error}"
        )


class _HttpStream:
    """A `GenerationStream` over `max_concurrency` worker threads sharing the backend's
    connection pool; each request keeps its own seed.

    The workers are started when the stream opens, not at the first requests (a thread start
    took milliseconds on a loaded machine, while the first requests waited), and each puts its
    finished request on one completion queue, so `advance` returns the moment any request
    ends, and `wake` (from any thread) makes it return at once."""

    def __init__(self, backend: OpenAIHttpBackend) -> None:
        self._backend = backend
        self._limit = backend.config.max_concurrency
        self._todo: queue.SimpleQueue[tuple[int, dict[str, Any]] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[StreamResult | None] = queue.SimpleQueue()
        self._keys: set[int] = set()
        self._workers = [
            threading.Thread(target=self._work, name=f"http-gen-{i}", daemon=True)
            for i in range(self._limit)
        ]
        for worker in self._workers:
            worker.start()

    @property
    def in_flight(self) -> int:
        return len(self._keys)

    @property
    def stepped(self) -> bool:
        return False  # requests end when the server answers them

    def offer(self, request: StreamRequest) -> bool:
        if self._keys and len(self._keys) >= self._limit:
            return False
        seed = fresh_seed() if request.params.seed is None else request.params.seed
        payload = self._backend._payload(request.prompt, request.params, seed)
        self._keys.add(request.key)
        self._todo.put((request.key, payload))
        return True

    def advance(self) -> list[StreamResult]:
        """Wait for a request to end (or a `wake`), then take every one that has ended."""
        if not self._keys:
            return []
        results = []
        first: StreamResult | None = self._done.get()
        while True:
            if first is not None and first.key in self._keys:
                self._keys.discard(first.key)
                results.append(first)
            try:
                first = self._done.get_nowait()
            except queue.Empty:
                return results

    def wake(self) -> None:
        self._done.put(None)

    def close(self) -> None:
        """Drop what is in flight; the workers finish their current request and stop."""
        self._keys = set()
        for _ in self._workers:
            self._todo.put(None)
        for worker in self._workers:
            worker.join()

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            key, payload = item
            try:
                result = StreamResult(key=key, generation=self._backend._complete(payload))
            except Exception as error:  # This request failed; the others go on.
                result = StreamResult(key=key, error=error)
            self._done.put(result)


def _generation_from_choice(choice: dict[str, Any]) -> Generation:
    """Token ids from `token_ids` (vLLM ≥ 0.10.2) or from "token_id:N" logprob tokens."""
    logprobs = choice["logprobs"]
    token_logprobs = [float(x) for x in logprobs["token_logprobs"]]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        token_ids = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    finish = FinishReason(choice["finish_reason"])
    stop_reason = choice.get("stop_reason")
    return Generation(
        token_ids=tuple(int(t) for t in token_ids),
        logprobs=tuple(token_logprobs),
        finish_reason=finish,
        stop_string=stop_reason if isinstance(stop_reason, str) else None,
    )
