"""Progress of an import: the articles or questions written of the file's total, a chunk at a
time inside the file's one transaction, as the stage's on_progress and as `import`'s lines
outside a terminal."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from flows.stages.importing import WRITE_CHUNK, import_articles
from tests.flows.conftest import make_context

NOW = datetime(2026, 3, 1, 8, tzinfo=UTC)
RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
ROWS = 2 * WRITE_CHUNK + 3


def _archive(path: Path, rows: int) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "title": f"Story {i}",
                    "body": "",
                    "url": f"https://news.example/{i}",
                    "published_at": "2025-10-01T06:30:00Z",
                    "source": "wire",
                }
            )
            + "\n"
            for i in range(rows)
        ),
        encoding="utf-8",
    )
    return path


def test_an_article_import_reports_the_rows_written_of_the_files_total(engine, tmp_path):
    archive = _archive(tmp_path / "news.jsonl", ROWS)
    ctx = make_context(engine, tmp_path, as_of=NOW)
    heard: list[tuple[int, int]] = []
    report = import_articles(ctx, archive, on_progress=lambda d, t: heard.append((d, t)))
    assert heard == [(WRITE_CHUNK, ROWS), (2 * WRITE_CHUNK, ROWS), (ROWS, ROWS)]
    assert (report.rows, report.inserted, report.existing) == (ROWS, ROWS, 0)
    heard.clear()  # written again in the same chunks, nothing new stored
    again = import_articles(ctx, archive, on_progress=lambda d, t: heard.append((d, t)))
    assert heard[-1] == (ROWS, ROWS) and (again.inserted, again.existing) == (0, ROWS)


def test_import_outside_a_terminal_prints_done_of_the_files_total(db_url: str, tmp_path):
    archive = _archive(tmp_path / "news.jsonl", ROWS)
    result = CliRunner().invoke(app, ["import", "articles", str(archive), "--db", db_url])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "] import news.jsonl: articles" in lines[0]  # the first update's line
    assert f"import news.jsonl: articles {ROWS}/{ROWS} (100%)" in result.output
    assert f"articles: {ROWS} new, 0 already stored" in result.output

    questions = CliRunner().invoke(
        app, ["import", "forecastbench", str(RAW / "2025-10-26-llm.json"), "--db", db_url]
    )
    assert questions.exit_code == 0, questions.output
    new, stored = map(
        int, re.search(r"questions: (\d+) new, (\d+) already", questions.output).groups()
    )
    total = new + stored
    assert total > 0
    assert f"import 2025-10-26-llm.json: questions {total}/{total} (100%)" in questions.output
