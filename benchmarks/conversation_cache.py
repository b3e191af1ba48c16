"""Research rollouts with and without kept conversations: the local backend's time, prefill
and decode work for a research panel, each turn after the first prefilling the whole
conversation again (`max_kept_tokens=0`) or only what follows its kept last turn (the
default; futureworld.policy.batching).

Loads the versions a finished `futureworld demo --research` run served first and last (its
metrics.json), and has each research the run's held-out research panel through the engine
(flows.demo.research_panel, the demo's own settings and seeds), both ways, alternating in one
process so the machine's state is the same for both. Reports per way: seconds, tokens
prefilled, and the decode steps' summed batch width (rows x cache columns: what attention
reads); and how many rollouts came out token-identical both ways (the kept keys equal a
prefill's to float rounding, so a sampled token can differ where two were nearly tied).

    .venv/bin/python benchmarks/conversation_cache.py reports/seeds/seed-0 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from research_claim_panel import served_policies

from flows.demo.research_panel import build_research_panel, forecast_research_panel
from futureworld.policy.loading import load_backend

WAYS = {"whole conversation": 0, "kept conversations": None}


class Work:
    """Counts a model's prefilled tokens and its decode steps' rows x cache columns."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.prefilled = self.decode_columns = 0
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, _args, kwargs) -> None:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None:
            return
        if ids.shape[1] > 1:
            self.prefilled += int(ids.numel())
        elif mask is not None:
            self.decode_columns += int(mask.numel())

    def close(self) -> None:
        self._handle.remove()


def measure(folder: Path, repeats: int) -> dict[str, object]:
    seed, config, policies = served_policies(folder)
    versions = tuple(version for _, _, version in policies)
    base = config.world_config(seed=seed, max_horizon_days=config.max_horizon_days)
    panel = build_research_panel(base, config.research_panel_questions, config.questions_per_day)
    result: dict[str, object] = {"run": str(folder), "seed": seed, "versions": versions}
    for spec, generation, version in policies:
        backend = load_backend(spec)
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        work: dict[str, tuple[int, int]] = {}
        tokens: dict[str, list[tuple[int, ...]]] = {}
        for _ in range(repeats):
            for way, bound in WAYS.items():
                backend.max_kept_tokens = bound
                counter = Work(backend.model)
                started = time.perf_counter()
                groups = forecast_research_panel(
                    backend, generation, panel, policy_version=version, samples=1, seed=seed
                )
                times[way].append(time.perf_counter() - started)
                counter.close()
                work[way] = (counter.prefilled, counter.decode_columns)
                tokens[way] = [tuple(t.completion_token_ids) for g in groups for t in g]
        whole, kept = (statistics.median(times[w]) for w in WAYS)
        same = sum(a == b for a, b in zip(*tokens.values(), strict=True))
        row = {
            "version": version,
            "rollouts": len(tokens["kept conversations"]),
            "seconds": {w: round(statistics.median(times[w]), 2) for w in WAYS},
            "time_ratio": round(kept / whole, 3),
            "prefilled_tokens": {w: work[w][0] for w in WAYS},
            "decode_columns": {w: work[w][1] for w in WAYS},
            "identical_rollouts": same,
        }
        print(json.dumps(row), flush=True)
        result[f"version {version}"] = row
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="demo --research output folders")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way (median)")
    parser.add_argument("--out", type=Path, default=Path("reports/conversation_cache.json"))
    args = parser.parse_args()
    rows = [measure(folder, args.repeats) for folder in args.runs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
