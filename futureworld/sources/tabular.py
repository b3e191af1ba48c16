"""Line-numbered rows of the plain files users hand the importers (JSONL and CSV): each row is
its parsed object, or the reason it is not one, so a bad line is reported by number and the
rest load. Shared by the article archive and outside-forecast readers."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

Row = tuple[int, dict[str, Any] | str]
"""(line number where the record starts, the record or why it is not one)."""


def jsonl_rows(text: str) -> list[Row]:
    """One row per non-blank line: its JSON object, or why it is not one."""
    rows: list[Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            rows.append((number, f"not JSON ({error.msg} at column {error.colno})"))
            continue
        rows.append((number, value if isinstance(value, dict) else "not a JSON object"))
    return rows


def csv_rows(text: str, required: Sequence[str]) -> tuple[list[Row], list[str]]:
    """(one row per non-empty CSV record after the header, the `required` columns the header
    lacks); with a column missing no row is read."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or ()]
    missing = [f for f in required if f not in header]
    if missing:
        return [], missing
    reader.fieldnames = header
    rows: list[Row] = []
    start = reader.line_num + 1
    for record in reader:
        if None in record:
            rows.append((start, "more fields than the header"))
        elif any(v is not None and v.strip() for v in record.values()):
            rows.append((start, record))
        start = reader.line_num + 1
    return rows, []
