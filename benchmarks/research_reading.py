"""Does the research demo's agent read what it finds? Its answers against the readings it saw.

For each research demo folder given (`futureworld demo --research --out DIR`, or a run of
benchmarks/credit_assignment.py), the learner's stored rollouts are grouped by policy version
and by what their observations held:

- own: readings about the question itself (its entity, event and date) and no other;
- lure: only readings about a rival event of the same entity (futureworld.world.research's
  lures), which a reader must ignore.

For each group, the correlation of the answers with the posterior the readings imply
(`informed_p_yes`, as if they were about the question) and the answers' mean. A reader that
uses its evidence correlates highly on own; one that ignores lures correlates near 0 there.
For own, also how the answers map the posterior (`answer_map`): the slope of the answer's
log-odds on the posterior's (1 for a calibrated reader, the reference's `research_sharpening`
for one that copies it), the residual spread about that line in log-odds, and the answers'
expected Brier under the posterior against the posterior's own (the floor on those rollouts).

    .venv/bin/python benchmarks/research_reading.py reports/credit_assignment/seed-0/dr_grpo

The world's ladder and evidence noise are the demo's defaults (DemoConfig(research=True)).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sqlmodel import Session, create_engine, select

from flows.demo.config import LEARNER, DemoConfig
from flows.demo.resume import DATABASE
from futureworld.world.config import cue_phrase
from futureworld.world.research import informed_p_yes
from storage.repositories.questions import list_questions
from storage.repositories.rollouts import rollouts_for
from storage.tables import AgentRow

MIN_ROLLOUTS = 10
"""A (version, kind) cell with fewer answered rollouts is left out."""
LOGIT_CLIP = 0.01
"""Answers and posteriors are clipped to [LOGIT_CLIP, 1 - LOGIT_CLIP] before their log-odds."""


def answer_map(pairs: np.ndarray) -> tuple[float, float, float, float]:
    """(slope, residual sd, expected Brier, floor) of (answer, posterior) pairs: the least-squares
    line of the answer's log-odds on the posterior's, the spread of the log-odds about it, the
    answers' mean Brier expected under the posterior, (a − q)² + q(1 − q), and that of the
    posterior itself, q(1 − q)."""
    answer, posterior = pairs[:, 0], pairs[:, 1]
    a, q = (np.log(x / (1 - x)) for x in np.clip(pairs, LOGIT_CLIP, 1 - LOGIT_CLIP).T)
    slope, intercept = np.polyfit(q, a, 1)
    floor = posterior * (1 - posterior)
    expected = (answer - posterior) ** 2 + floor
    spread = (a - slope * q - intercept).std()
    return float(slope), float(spread), float(expected.mean()), float(floor.mean())


def claim_pattern(n_levels: int) -> re.Pattern[str]:
    """An evidence or lure sentence: '<source> rate the chance that <entity> will <event> by
    <date> as <phrase>.' (futureworld.world.research, futureworld.world.articles)."""
    phrases = sorted((cue_phrase(k, n_levels) for k in range(n_levels)), key=len, reverse=True)
    alternation = "|".join(re.escape(p) for p in phrases)
    return re.compile(
        rf"rate the chance that (.+?) will (.+?) by (\d{{4}}-\d\d-\d\d) as ({alternation})\."
    )


def reading_rows(out_dir: Path) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """Per policy version, per kind (own, lure): (answer, the readings' posterior) pairs."""
    world = DemoConfig(research=True).world_config(seed=0)
    n_levels = len(world.cue_p_yes)
    level_of = {cue_phrase(k, n_levels): k for k in range(n_levels)}
    pattern = claim_pattern(n_levels)
    engine = create_engine(f"sqlite:///{out_dir / 'state' / DATABASE}")
    with Session(engine) as session:
        agent = session.exec(select(AgentRow).where(AgentRow.name == LEARNER)).one()
        trajectories = rollouts_for(session, agent_id=agent.id)
        titles = {
            q.id: q.title
            for q in list_questions(session, ids=sorted({t.question_id for t in trajectories}))
        }
    engine.dispose()
    rows: dict[int, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for t in trajectories:
        if t.p_yes is None:
            continue
        seen = " ".join(turn.text for turn in t.turns if turn.role == "tool")
        own: dict[str, int] = {}
        lure: dict[str, int] = {}
        for match in pattern.finditer(seen):
            entity, event, by_date, phrase = match.groups()
            about = f"Will {entity} {event} by {by_date}" in titles[t.question_id]
            # one reading an article: a snippet seen twice, or opened, is one reading
            (own if about else lure)[match.group(0)] = level_of[phrase]
        kind = "own" if own and not lure else "lure" if lure and not own else None
        if kind is None:
            continue
        readings = list((own or lure).values())
        try:
            implied = informed_p_yes(
                readings, cue_p_yes=world.cue_p_yes, evidence_noise=world.evidence_noise
            )
        except ValueError:  # readings impossible together for one question
            continue
        rows[t.policy_version][kind].append((float(t.p_yes), implied))
    return rows


def table(out_dir: Path) -> str:
    lines = [
        f"{out_dir}",
        "| version | own: n / corr / mean answer | own: slope / residual sd (log-odds) / "
        "Brier expected / floor | lure: n / corr / mean answer |",
        "|---|---|---|---|",
    ]
    for version, kinds in sorted(reading_rows(out_dir).items()):
        cells = []
        for kind in ("own", "lure"):
            pairs = np.asarray(kinds.get(kind, []))
            if len(pairs) < MIN_ROLLOUTS:
                cells.append(f"{len(pairs)} / — / —")
                if kind == "own":
                    cells.append("—")
                continue
            corr = np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]
            cells.append(f"{len(pairs)} / {corr:+.2f} / {pairs[:, 0].mean():.2f}")
            if kind == "own":
                slope, spread, expected, floor = answer_map(pairs)
                cells.append(f"{slope:.2f} / {spread:.2f} / {expected:.3f} / {floor:.3f}")
        lines.append(f"| v{version} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="research demo folders (--out)")
    args = parser.parse_args(argv)
    for run in args.runs:
        print(table(run.resolve()), end="\n\n")


if __name__ == "__main__":
    main()
