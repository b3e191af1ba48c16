"""The research demo's warm start alone, on several seeds and sizes: whether the tiny model
learns to research from the reference's demonstrations before any RL.

Each (seed, size) trains the demo's tiny model from scratch on the research demonstrations
(flows.demo.warm_start with `DemoConfig(research=True)`, the code `make demo` runs) and lets
it research the demo's held-out research panel once per question, exactly as round 0 does
(flows.demo.research_panel: the same forecast and the same round summary). It prints the
rates RL starts from: first-turn tool calls, searches, rollouts whose observations hold
their question's evidence, answers parsed, Brier against the informed and uninformed floors,
and Brier by research path (found the evidence, searched and missed, did not search)
and the correlation of the found answers with the evidence's posterior (`found_reading`):
whether the model reads what it finds; and why the unparsed answers failed (each parse
status, how many rollouts spent their turns on tools without answering, and after which
tool calls the failed answers came).

    .venv/bin/python benchmarks/research_warm_start.py --seeds 0-2 --sizes 5x10,20x4

A size is `days x epochs` of whole demonstrations, optionally `@width x layers` (`20x4@96x2`);
`--set research_drill_days=80` (any numeric DemoConfig field) adds first-turn drills;
`--set research_note_readings=1` has the reference note its readings before its answers,
and reports how many of the panel's answers after a search note exactly their evidence's. Seconds
are wall time on whatever the machine is doing: compare sizes within one invocation, and run
two invocations side by side only with FW_TORCH_THREADS=1 (else each takes every core).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sweeps import parse_numeric_sets, parse_seeds

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, DemoConfig
from flows.demo.panel import CYCLE_HOUR
from flows.demo.research_panel import (
    ResearchPanel,
    ResearchPath,
    build_research_panel,
    forecast_research_panel,
    research_round,
)
from flows.demo.rounds import round_policy
from flows.demo.warm_start import warm_start
from flows.settings import Settings
from futureworld.agent.parsing import ActionKind
from futureworld.domain import ParseStatus, Trajectory
from futureworld.policy.loading import load_backend
from futureworld.scoring import brier
from futureworld.world import World


def measure(config: DemoConfig, work: Path) -> dict[str, object]:
    """One research warm start of `config` and its round-0 research-panel rates."""
    state = work / "state"
    state.mkdir(parents=True)
    world = World(
        config.world_config(
            seed=config.seed,
            questions_per_day=config.questions_per_day,
            max_horizon_days=config.max_horizon_days,
        )
    )
    at = world.day_start(0) + timedelta(hours=CYCLE_HOUR)
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'demo.db'}")
    started = time.perf_counter()
    demonstrations = warm_start(config, settings, as_of=at)
    warm_s = time.perf_counter() - started
    engine = open_engine(settings)
    ctx = build_context(settings, engine, as_of=at)
    panel = build_research_panel(
        config.world_config(seed=config.seed, max_horizon_days=config.max_horizon_days),
        config.research_panel_questions,
        config.questions_per_day,
    )
    spec, generation, version = round_policy(ctx, LEARNER)
    engine.dispose()
    started = time.perf_counter()
    groups = forecast_research_panel(
        load_backend(spec),
        generation,
        panel,
        policy_version=version,
        samples=config.panel_samples,
        seed=config.seed,
    )
    panel_s = time.perf_counter() - started
    scores = research_round(panel, groups, round_no=0, policy_version=version)
    copies = query_copies(panel, groups)
    notes = note_fidelity(panel, groups) if config.research_note_readings else {}
    score = scores.score
    informed = [panel.questions[n].p_informed for n in score.question]
    return {
        "seed": config.seed,
        "days": config.research_sft_days,
        "drill_days": config.research_drill_days,
        "epochs": config.research_sft_epochs,
        "width": config.hidden_size,
        "layers": config.layers,
        "demonstrations": len(demonstrations),
        "first_turn_tool_rate": round(scores.first_turn_tool_rate, 4),
        "search_rate": round(scores.search_rate, 4),
        "evidence_rate": round(scores.evidence_rate, 4),
        "found_reading": round(scores.found_reading, 4),
        **copies,
        **notes,
        **parse_failures(groups),
        **{f"brier_{path}": round(scores.path_brier(path), 4) for path in ResearchPath},
        "parse_rate": round(score.parse_rate, 4),
        "brier": round(brier(score.p_yes, score.y), 4) if score.p_yes else None,
        "informed_floor": round(brier(informed, score.y), 4) if score.y else None,
        "uninformed_floor": round(scores.uninformed_brier, 4),
        "warm_start_s": round(warm_s, 1),
        "panel_s": round(panel_s, 1),
    }


def query_copies(panel: ResearchPanel, groups: Sequence[Sequence[Trajectory]]) -> dict[str, object]:
    """How the first searches of the panel's rollouts relate to their question's title: the
    share of them that are words of the title (copied), that open with the title's entity
    (its first two words after "Will"), and a few examples."""
    searches = copied = entity = 0
    examples = []
    for item, group in zip(panel.questions, groups, strict=True):
        title = item.question.title.removeprefix("Will ")
        for trajectory in group:
            query = next(
                (t.tool_args for t in trajectory.turns if t.tool_name == ActionKind.SEARCH), None
            )
            if query is None:
                continue
            searches += 1
            copied += query in title
            entity += query.split()[:2] == title.split()[:2]
            if len(examples) < 4:
                examples.append(f"{title} | {query}")
    return {
        "query_copied": round(copied / max(searches, 1), 4),
        "query_entity": round(entity / max(searches, 1), 4),
        "query_examples": examples,
    }


def parse_failures(groups: Sequence[Sequence[Trajectory]]) -> dict[str, object]:
    """Why the panel's unparsed answers failed: each parse status's share of the rollouts,
    the share that ended on a tool call (the turns ran out before an answer), the share after
    each path of tool calls, and a few final turns that did not parse."""
    statuses: Counter[str] = Counter()
    where: Counter[str] = Counter()
    ended_on_tool = total = 0
    examples = []
    for group in groups:
        for trajectory in group:
            total += 1
            if trajectory.parse_status is ParseStatus.OK:
                continue
            statuses[trajectory.parse_status.value] += 1
            last = next((t for t in reversed(trajectory.turns) if t.role == "assistant"), None)
            ended_on_tool += last is not None and last.tool_name is not None
            where[_failed_turn(trajectory)] += 1
            if last is not None and len(examples) < 4:
                examples.append(last.text[:80])
    return {
        "unparsed": {k: round(v / max(total, 1), 4) for k, v in statuses.most_common()},
        "unparsed_ended_on_tool": round(ended_on_tool / max(total, 1), 4),
        "unparsed_after": {k: round(v / max(total, 1), 4) for k, v in where.most_common()},
        "unparsed_examples": examples,
    }


def _failed_turn(trajectory: Trajectory) -> str:
    """After which tool calls an unparsed rollout's last assistant turn came ("after
    [search,open]"; "after []" for a first turn)."""
    tools = [str(t.tool_name) for t in trajectory.turns if t.role == "tool"]
    return f"after [{','.join(tools)}]"


_EVIDENCE_CLAIM = re.compile(r"(by \d{4}-\d{2}-\d{2} as [a-z ]+)\.")


def note_fidelity(
    panel: ResearchPanel, groups: Sequence[Sequence[Trajectory]]
) -> dict[str, object]:
    """With noting demonstrations (`research_note_readings`): the share of the panel's answers
    after a search that open with a note, and the share of those whose note names exactly the
    readings of the question's own evidence the rollout was shown (in any order; "none"
    without), and a few notes that do not."""
    far = datetime(9999, 1, 1, tzinfo=UTC)
    answered = noted = exact = 0
    wrong = []
    for item, group in zip(panel.questions, groups, strict=True):
        for trajectory in group:
            final = trajectory.turns[-1] if trajectory.turns else None
            if final is None or len(trajectory.turns) == 1 or final.role != "assistant":
                continue
            answered += 1
            if not final.text.startswith("Noted: "):
                continue
            noted += 1
            note = final.text.split(" <probability>", 1)[0].removeprefix("Noted: ").rstrip(".")
            shown = [i for t in trajectory.turns if t.role == "tool" for i in t.tool_result_ids]
            readings = []
            for article_id in dict.fromkeys(i for i in shown if i in item.evidence_ids):
                article = panel.corpus.open(article_id, far)
                claim = _EVIDENCE_CLAIM.search(article.summary) if article else None
                if claim is not None:
                    readings.append(claim.group(1))
            expected = sorted(readings) or ["none"]
            if sorted(note.split("; ")) == expected:
                exact += 1
            elif len(wrong) < 4:
                wrong.append(f"{'; '.join(expected)} | {note}")
    return {
        "noted": round(noted / max(answered, 1), 4),
        "note_exact": round(exact / max(noted, 1), 4),
        "note_examples": wrong,
    }


def _sizes(text: str) -> list[dict[str, int]]:
    sizes = []
    for size in text.split(","):
        run, _, model = size.partition("@")
        days, epochs = (int(x) for x in run.split("x"))
        fields = {"research_sft_days": days, "research_sft_epochs": epochs}
        if model:
            width, layers = (int(x) for x in model.split("x"))
            fields |= {"hidden_size": width, "layers": layers}
        sizes.append(fields)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-2", help="e.g. 0-7 or 0,3,5")
    parser.add_argument("--sizes", default="5x10", help="days x epochs[@width x layers], ...")
    parser.add_argument("--panel", type=int, default=DemoConfig.research_panel_questions)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other DemoConfig field (numbers), e.g. research_search_rate=0.8",
    )
    parser.add_argument("--out", type=Path, default=Path("reports/research_warm_start.json"))
    args = parser.parse_args()
    extra = parse_numeric_sets(args.set)
    rows = []
    for size in _sizes(args.sizes):
        for seed in parse_seeds(args.seeds):
            config = DemoConfig(
                research=True, seed=seed, research_panel_questions=args.panel, **size, **extra
            )
            with tempfile.TemporaryDirectory() as work:
                row = measure(config, Path(work))
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
