"""The binary score table by horizon: the time from a forecast (its as_of) to its outcome's
resolved_at, in fixed buckets, with n as questions as in every score table. Owns the buckets
and the grouping; the metrics are futureworld.evaluation's."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from futureworld.evaluation import ForecastRecord, ScoreRow, group_records, score_group
from futureworld.imputation import forecaster_eligibility

HORIZON_BUCKETS: tuple[tuple[str, float | None], ...] = (
    ("≤7 d", 7),
    ("8–30 d", 30),
    ("31–90 d", 90),
    ("91–180 d", 180),
    (">180 d", None),
)
"""(label, upper bound in days): a horizon, in days of 24 h, falls in the first bucket whose
bound it does not exceed (so 7 d exactly is "≤7 d", 7.5 d is "8–30 d"; a forecast made after
its resolution is "≤7 d"). ForecastBench's dataset horizons (7, 30, 90, 180, 365 days after
the due date) fall one to a bucket for a forecast made on the due date."""


def horizon_bucket(record: ForecastRecord) -> str:
    """The HORIZON_BUCKETS label of a forecast; ValueError without as_of or resolved_at."""
    if record.as_of is None or record.resolved_at is None:
        raise ValueError(f"forecast of {record.agent}: a horizon needs as_of and resolved_at")
    days = (record.resolved_at - record.as_of).total_seconds() / 86400
    return next(label for label, bound in HORIZON_BUCKETS if bound is None or days <= bound)


def score_by_horizon(
    records: Iterable[ForecastRecord],
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    reference_agents: Collection[str] = (),
) -> list[tuple[str, ScoreRow]]:
    """(horizon label, row) per agent version and non-empty bucket, every source pooled, sorted
    by forecaster then bucket. Each forecast is in exactly one bucket, so a forecaster's bucket
    n add up to its n overall. The 5% verdict is the forecaster's over all of `records`, as in
    the table by source."""
    records = list(records)
    verdicts = forecaster_eligibility(
        records, keys=("agent", "policy_version"), reference_agents=reference_agents
    )
    labels = [label for label, _ in HORIZON_BUCKETS]
    buckets: dict[str, list[ForecastRecord]] = {label: [] for label in labels}
    for record in records:
        buckets[horizon_bucket(record)].append(record)
    rows: list[tuple[str, ScoreRow]] = []
    for label in labels:
        by = ("agent", "policy_version")
        for named, members in group_records(buckets[label], by=by, include_overall=False):
            metrics = score_group(members, n_bootstrap=n_bootstrap, seed=seed)
            verdict = verdicts.get((named["agent"], named["policy_version"]))
            rows.append((label, ScoreRow(**named, **metrics, eligibility=verdict)))
    return sorted(
        rows,
        key=lambda pair: (
            pair[1].agent or "",
            pair[1].policy_version is None,
            pair[1].policy_version or 0,
            labels.index(pair[0]),
        ),
    )
