"""A loopback server with the shape of vLLM's OpenAI-compatible API, the tiny model behind it.

It answers POST /v1/completions (token-id prompts, logprobs, "token_id:N" tokens,
`token_ids`, the answering "model"), /v1/load_lora_adapter and /v1/unload_lora_adapter,
GET /v1/models (the served name and loaded adapters) and GET /health, records which model
every request named, and can be told to fail the next requests with a 500 or to stall them,
to exercise the client's retries.

Its log-probs follow vLLM's `--logprobs-mode`: "processed_logprobs" returns the log-prob of
the distribution sampled from (after temperature and top-p), "raw_logprobs" (vLLM's
default) log softmax of the raw logits. (Requests in flight are counted by the scripted
server of benchmarks/loopback_completions.py, which sleeps per token instead of running a
model; tests/flows/test_predict_http.py uses it.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from futureworld.policy.base import SamplingParams
from futureworld.policy.local import LocalBackend


@dataclass
class ServerState:
    backend: LocalBackend
    served_name: str = "tiny"
    faults: list[str] = field(default_factory=list)
    """Consumed one per POST: "500" answers HTTP 500, "400" HTTP 400, "stall" sleeps
    `stall_s` first."""
    stall_s: float = 2.0
    return_token_ids: bool = True
    """False mimics a vLLM without `return_token_ids`: ids only as "token_id:N" strings."""
    logprobs_mode: str = "processed_logprobs"
    """vLLM's --logprobs-mode: "processed_logprobs" or "raw_logprobs"."""
    answer_as: str | None = None
    """Name this model in completion answers instead of the requested one (a server that
    was restarted on another version)."""
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(path, body) of every POST, in arrival order: which model each completion named."""
    adapters: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                return self._send(200, None)
            if self.path != "/v1/models":
                return self._send(404, {"error": f"no route {self.path}"})
            with state.lock:
                names = [state.served_name, *state.adapters]
            return self._send(200, {"object": "list", "data": [{"id": n} for n in names]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests.append((self.path, body))
                fault = state.faults.pop(0) if state.faults else None
            if fault == "500":
                return self._send(500, {"error": "engine hiccup"})
            if fault == "400":
                return self._send(400, {"error": "bad request"})
            if fault == "stall":
                time.sleep(state.stall_s)
            if self.path == "/v1/load_lora_adapter":
                state.adapters[body["lora_name"]] = body["lora_path"]
                return self._send(200, None)
            if self.path == "/v1/unload_lora_adapter":
                state.adapters.pop(body["lora_name"], None)
                return self._send(200, None)
            if self.path != "/v1/completions":
                return self._send(404, {"error": f"no route {self.path}"})
            if body["model"] not in {state.served_name, *state.adapters}:
                return self._send(404, {"error": f"model {body['model']} does not exist"})
            return self._send(200, self._complete(body))

        def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
            params = SamplingParams(
                temperature=body["temperature"],
                top_p=body["top_p"],
                max_new_tokens=body["max_tokens"],
                seed=body.get("seed"),
                stop=tuple(body.get("stop") or ()),
            )
            generation = state.backend.generate([body["prompt"]], params)[0]
            logprobs = list(generation.logprobs)
            if state.logprobs_mode == "raw_logprobs":
                logprobs = _raw_logprobs(state.backend, body["prompt"], generation.token_ids)
            choice: dict[str, Any] = {
                "index": 0,
                "text": state.backend.tokenizer.decode(generation.token_ids),
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in generation.token_ids],
                    "token_logprobs": logprobs,
                    "top_logprobs": [],
                    "text_offset": [],
                },
                "finish_reason": str(generation.finish_reason),
                "stop_reason": generation.stop_string,
            }
            if state.return_token_ids and body.get("return_token_ids"):
                choice["token_ids"] = list(generation.token_ids)
            return {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": state.answer_as or body["model"],
                "choices": [choice],
            }

        def _send(self, status: int, payload: Any) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _raw_logprobs(backend: LocalBackend, prompt: list[int], ids: tuple[int, ...]) -> list[float]:
    """log softmax of the raw logits (temperature 1, no truncation), as vLLM's default mode."""
    sequence = torch.tensor([list(prompt) + list(ids)])
    with torch.inference_mode():
        logits = backend.model(input_ids=sequence).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


@contextmanager
def serve_completions(state: ServerState) -> Iterator[str]:
    """Run the server on a free loopback port; yield its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    # Handler threads are joined on close, so none is left running torch at exit.
    server.daemon_threads = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    """Serve MODEL_DIR on 127.0.0.1:PORT under a name, in the foreground (its own process,
    as infra/vllm/restart.sh starts a vLLM server: tests/policy/serve_loopback.sh)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-name", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = ServerState(
        backend=LocalBackend.from_pretrained(args.model_dir), served_name=args.served_name
    )
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
    server.serve_forever()


if __name__ == "__main__":
    main()
