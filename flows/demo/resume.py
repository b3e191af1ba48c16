"""What a demo keeps so that `--resume` continues it: the manifest `state/resume.json` (the
configuration's digest, the warm start, each cycled round's policy version and panel scores),
a copy of the database as each round's cycle left it, and each round's panel scores as JSON.

Decision: a resumed demo restores the database of the last finished cycle rather than
re-running the half-finished cycle on what it left. Re-running is correct (every stage is
exactly-once, a left candidate is gated by the next update, an unregistered checkpoint is
moved aside), but not identical: replay orders rollouts by their wall-clock `created_at`, so
the groups a killed predict had written and those the re-run writes would train in another
order than one uninterrupted predict's. Restored, the round re-runs from where the
uninterrupted run started it, and every result equals that run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from flows.demo.kind_scores import KindPanelScore
from flows.demo.panel import PanelScore
from flows.demo.report import panel_brier_ece
from flows.demo.research_panel import ResearchRound

if TYPE_CHECKING:
    from flows.demo.config import DemoConfig
    from flows.demo.rounds import RoundScores

MANIFEST = "resume.json"
"""The manifest's name in the state folder."""
FORMAT = 1
DATABASE = "futureworld.db"
"""The demo's SQLite database in the state folder."""
NOT_DIGESTED = frozenset({"out_dir", "resume", "report_to"})
"""Config fields that change where the demo writes or logs, not what it computes."""


class ResumeRefused(ValueError):
    """The state folder cannot be resumed with this configuration; the message says why."""


def config_record(config: DemoConfig) -> dict[str, Any]:
    """The configuration's fields that decide the demo's results, as JSON values."""
    return {
        f.name: _plain(getattr(config, f.name))
        for f in dataclasses.fields(config)
        if f.name not in NOT_DIGESTED
    }


def config_digest(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class CycledRound:
    """A round whose daily cycle finished: the version it served, then its panel's scores."""

    round: int
    policy_version: int
    panel: dict[str, float | None] | None = None
    """Brier, ECE and parse rate of the round's binary (or research) panel; None until
    scored (its full scores are in `scores_file`)."""


@dataclass
class DemoState:
    """The manifest: written atomically after the warm start and after each round's cycle and
    each round's panel scores, so a killed demo leaves it naming what is finished."""

    state: Path
    config: dict[str, Any]
    warm_start_version: int
    demonstration_research: tuple[float, float] | None
    """The research warm start's (first-turn tool-call rate, search rate), for the report."""
    snapshot: str = ""
    """The database copy as the last cycled round (or the warm start) left it."""
    rounds: list[CycledRound] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        state: Path,
        config: DemoConfig,
        *,
        warm_start_version: int,
        demonstration_research: tuple[float, float] | None,
    ) -> DemoState:
        """The manifest of a finished warm start (and the database it left)."""
        saved = cls(
            state=state,
            config=config_record(config),
            warm_start_version=warm_start_version,
            demonstration_research=demonstration_research,
        )
        saved._snapshot("after-warm-start")
        return saved

    @property
    def cycled(self) -> int:
        """Rounds whose cycle finished (rounds 0..cycled-1)."""
        return len(self.rounds)

    def round_cycled(self, round_no: int, policy_version: int) -> None:
        """Round `round_no`'s cycle finished and serves `policy_version`."""
        if round_no != self.cycled:
            raise ValueError(f"round {round_no} cycled after {self.cycled} rounds")
        self.rounds.append(CycledRound(round=round_no, policy_version=policy_version))
        self._snapshot(f"after-round-{round_no:03d}")

    def round_scored(self, scores: RoundScores | ResearchRound) -> None:
        """A round's panel scores: kept as JSON, then named in the manifest."""
        score = scores.score if isinstance(scores, ResearchRound) else scores[0]
        entry = self.rounds[score.round]
        _write_atomic(self._scores_path(score.round), json.dumps(_encode_scores(scores)))
        brier, ece = panel_brier_ece(score) if score.p_yes else (None, None)  # none parsed
        entry.panel = {"brier": brier, "ece": ece, "parse_rate": score.parse_rate}
        self._write()

    def scored_rounds(self) -> list[RoundScores | ResearchRound]:
        """The panel scores the manifest names, in round order (a prefix of the rounds)."""
        scored = [r for r in self.rounds if r.panel is not None]
        if [r.round for r in scored] != list(range(len(scored))):
            raise ResumeRefused(f"{self._manifest}: the scored rounds are not rounds 0..n-1")
        try:
            return [
                _decode_scores(json.loads(self._scores_path(r.round).read_text())) for r in scored
            ]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ResumeRefused(f"cannot resume {self.state}: a round's scores: {error}") from None

    def unscored_rounds(self) -> list[CycledRound]:
        """Cycled rounds whose panel was not scored (the worker process was one round
        behind when the demo stopped)."""
        return [r for r in self.rounds if r.panel is None]

    def restore_database(self) -> None:
        """Put back the database as the last cycled round left it: whatever a half-finished
        cycle wrote after it is dropped (its checkpoints, never registered in the copy, are
        moved aside by the next update)."""
        database = self.state / DATABASE
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{database}{suffix}").unlink(missing_ok=True)
        temporary = database.with_name(f".{DATABASE}.restore")
        shutil.copyfile(self.state / self.snapshot, temporary)
        os.replace(temporary, database)

    @property
    def _manifest(self) -> Path:
        return self.state / MANIFEST

    def _scores_path(self, round_no: int) -> Path:
        return self.state / "resume" / f"round-{round_no:03d}-scores.json"

    def _snapshot(self, name: str) -> None:
        """Copy the database (SQLite's online backup: a consistent copy even with the WAL
        holding recent commits), then name the copy in the manifest, then drop the old one."""
        folder = self.state / "resume"
        folder.mkdir(exist_ok=True)
        target = folder / f"{name}.db"
        temporary = folder / f".{name}.db.tmp"
        temporary.unlink(missing_ok=True)
        with (
            closing(sqlite3.connect(self.state / DATABASE)) as source,
            closing(sqlite3.connect(temporary)) as copy,
        ):
            source.backup(copy)
        os.replace(temporary, target)
        previous, self.snapshot = self.snapshot, str(target.relative_to(self.state))
        self._write()
        if previous and previous != self.snapshot:
            (self.state / previous).unlink(missing_ok=True)

    def _write(self) -> None:
        record = {
            "format": FORMAT,
            "config_digest": config_digest(self.config),
            "config": self.config,
            "warm_start_version": self.warm_start_version,
            "demonstration_research": self.demonstration_research,
            "snapshot": self.snapshot,
            "rounds": [dataclasses.asdict(r) for r in self.rounds],
        }
        _write_atomic(self._manifest, json.dumps(record, indent=1))


def load_state(state: Path, config: DemoConfig) -> DemoState:
    """The manifest a demo of `config` left in `state`; ResumeRefused when there is none (no
    warm start finished), it is unreadable, or another configuration wrote it."""
    path = state / MANIFEST
    if not path.is_file():
        raise ResumeRefused(
            f"nothing to resume in {state}: no finished warm start recorded ({MANIFEST}); "
            "run without --resume"
        )
    try:
        record = json.loads(path.read_text())
        if record["format"] != FORMAT:
            raise ValueError(f"format {record['format']}, this demo reads {FORMAT}")
        saved = DemoState(
            state=state,
            config=record["config"],
            warm_start_version=record["warm_start_version"],
            demonstration_research=None
            if record["demonstration_research"] is None
            else tuple(record["demonstration_research"]),
            snapshot=record["snapshot"],
            rounds=[CycledRound(**r) for r in record["rounds"]],
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ResumeRefused(f"cannot resume from {path}: {error}; run without --resume") from None
    wanted = config_record(config)
    if config_digest(saved.config) != config_digest(wanted):
        changed = sorted(
            name
            for name in saved.config.keys() | wanted.keys()
            if saved.config.get(name) != wanted.get(name)
        )
        differences = ", ".join(
            f"{name} {saved.config.get(name)!r} → {wanted.get(name)!r}" for name in changed
        )
        raise ResumeRefused(
            f"cannot resume {state}: it was made with another configuration ({differences}); "
            "give the same options, or run without --resume"
        )
    if not (state / saved.snapshot).is_file():
        raise ResumeRefused(f"cannot resume {state}: its database copy {saved.snapshot} is gone")
    return saved


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _plain(value: Any) -> Any:
    """A config or score value as JSON: enums by value, paths as text, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _rebuilt(cls: type, record: dict[str, Any]) -> Any:
    """A frozen score dataclass from `_plain`'s record of it (floats round-trip exactly;
    nested score dataclasses, optional or in tuples, enums and dicts keyed by enums come back
    as they were)."""
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in record and f.default is not dataclasses.MISSING:
            continue  # a field added since the state was written: its default
        hint, value = hints[f.name], record[f.name]
        if dataclasses.is_dataclass(hint):
            value = _rebuilt(hint, value)  # type: ignore[arg-type]
        elif get_origin(hint) in (Union, UnionType):  # e.g. ResearchRound | None
            inner = [a for a in get_args(hint) if a is not type(None)]
            if value is not None and len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
                value = _rebuilt(inner[0], value)  # type: ignore[arg-type]
        elif get_origin(hint) is tuple:
            item = get_args(hint)[0]
            nested = dataclasses.is_dataclass(item)
            value = tuple(_rebuilt(item, v) if nested else v for v in value)
        elif get_origin(hint) is dict:  # e.g. {ResearchPath: (total, n)}
            key, item = get_args(hint)
            value = {
                key(k) if isinstance(key, type) and issubclass(key, Enum) else k: (
                    tuple(v) if get_origin(item) is tuple else v
                )
                for k, v in value.items()
            }
        elif isinstance(hint, type) and issubclass(hint, Enum):
            value = hint(value)
        values[f.name] = value
    return cls(**values)


def _encode_scores(scores: RoundScores | ResearchRound) -> dict[str, Any]:
    if isinstance(scores, ResearchRound):
        return {"research": _plain(scores)}
    panel, kinds = scores
    return {"panel": _plain(panel), "kinds": [_plain(k) for k in kinds.values()]}


def _decode_scores(record: dict[str, Any]) -> RoundScores | ResearchRound:
    if "research" in record:
        return _rebuilt(ResearchRound, record["research"])
    kinds = [_rebuilt(KindPanelScore, k) for k in record["kinds"]]
    return _rebuilt(PanelScore, record["panel"]), {k.kind: k for k in kinds}
