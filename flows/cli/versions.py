"""`futureworld versions`, `gate`, `promote` and `reject`: an agent's policy versions, the
promotion gate run by hand, and a person's word over the gate (flows.stages.promotion)."""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.common import AsOfOption, DbOption, UserError, cli_context, console, require_agent
from flows.context import PipelineContext
from futureworld.domain import PolicyVersion

AgentOption = Annotated[str, typer.Option("--agent", help="Agent name.")]
VersionOption = Annotated[int, typer.Option("--version", min=0, help="Policy version number.")]


def register_version_commands(app: typer.Typer) -> None:
    app.command("versions")(versions_command)
    app.command("gate")(gate_command)
    app.command("promote")(promote_command)
    app.command("reject")(reject_command)


def versions_command(agent: AgentOption, db: DbOption = None) -> None:
    """Print the agent's lineage, oldest first: version (* the served one), status, parent,
    created, its gate's validation Brier and parse rate where known, and the reason."""
    from flows.stages.promotion import version_health, version_lineage

    with cli_context(db) as ctx:
        require_agent(ctx, agent)
        versions = version_lineage(ctx, agent)
        health = version_health(ctx, agent)
        served = ctx.current_version(ctx.agent(agent)).version
    console.print(f"{agent}: serving v{served}", soft_wrap=True)
    for v in versions:
        parent = "base" if v.parent_version is None else f"parent v{v.parent_version}"
        line = f"{'*' if v.version == served else ' '} v{v.version:<3} {v.status:<9} {parent:<10} "
        line += f"created {v.created_at:%Y-%m-%d %H:%M}"
        if v.validation_questions:
            brier = "?" if v.validation_brier is None else f"{v.validation_brier:.4f}"
            parse = "?" if v.validation_parse_rate is None else f"{v.validation_parse_rate:.2f}"
            line += f"  validation: {v.validation_questions} questions, Brier {brier}, "
            line += f"parse rate {parse}"
        _say(line)
        if v.version in health:
            _say(f"        update: {health_line(health[v.version])}")
        if v.status_reason:
            _say(f"        {v.status_reason}")


HEALTH_FIELDS = (
    ("groups", "groups", "{:.0f}"),
    ("identical answers", "identical_answer_group_fraction", "{:.0%}"),
    ("parse rate", "parse_rate", "{:.2f}"),
    ("answer tokens", "answer_tokens_mean", "{:.0f}"),
    ("reward", "reward_mean", "{:+.4f}"),
    ("entropy", "entropy_mean", "{:.3f}"),
    ("clip", "clip_fraction_mean", "{:.1%}"),
    ("kl_prox max", "kl_prox_max", "{:.4f}"),
    ("grad norm max", "grad_norm_max", "{:.2f}"),
    ("sampler gap", "sampler_gap_mean", "{:.4f}"),
    ("staleness", "staleness_mean", "{:.1f}"),
)
"""What `versions` prints of each update's health (storage.repositories.training.update_health),
in this order; a figure the update did not record is left out."""


def health_line(health: dict[str, float]) -> str:
    return ", ".join(
        f"{label} {form.format(health[key])}" for label, key, form in HEALTH_FIELDS if key in health
    )


def _say(text: str) -> None:
    """Print as is: reasons hold brackets that are not rich markup."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def gate_command(
    agent: AgentOption,
    version: Annotated[
        int | None,
        typer.Option("--version", min=1, help="Version to judge (default: every candidate)."),
    ] = None,
    fraction: Annotated[
        float | None,
        typer.Option(
            "--validation-fraction",
            min=0.0,
            max=1.0,
            help="Share of questions held out (default FW_VALIDATION_FRACTION, replay's slice).",
        ),
    ] = None,
    as_of: AsOfOption = None,
    db: DbOption = None,
) -> None:
    """Run the promotion gate: judge a version (or every candidate) against its parent on the
    held-out validation questions resolved by --as-of, and record promoted or rejected."""
    from flows.stages.promotion import GateError, gate_candidates, gate_version

    with cli_context(db, as_of) as ctx:
        # the slice replay leaves out (FW_VALIDATION_FRACTION) unless told otherwise, and the
        # gate's sizes (FW_GATE_*)
        options = ctx.settings.gate(fraction)
        require_agent(ctx, agent)
        if not ctx.agent(agent).backend.generates:
            raise UserError(f"gate: {agent} is a baseline: it has no versions to gate")
        try:
            if version is None:
                reports = gate_candidates(ctx, agent, options)
            else:
                _known(ctx, agent, version)
                reports = [gate_version(ctx, agent, version, options)]
        except (GateError, ValueError) as error:
            raise UserError(f"gate: {error}") from None
    if not reports:
        _say(f"{agent}: no candidate version to gate")
    for report in reports:
        _say(f"{agent} v{report.version}: {report.status} ({report.reason})")


def promote_command(
    agent: AgentOption,
    version: VersionOption,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the version).")] = "",
    db: DbOption = None,
) -> None:
    """Promote a version by hand, whatever the gate said."""
    from flows.stages.promotion import promote_version

    with cli_context(db) as ctx:
        require_agent(ctx, agent)
        _known(ctx, agent, version)
        changed = promote_version(ctx, agent, version, reason)
        _print_change(ctx, agent, changed)


def reject_command(
    agent: AgentOption,
    version: VersionOption,
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the version).")],
    db: DbOption = None,
) -> None:
    """Reject a version by hand: it is kept and never served; the agent serves its newest
    promoted version, which its next update starts from."""
    from flows.stages.promotion import reject_version

    if not reason.strip():
        raise UserError("reject --reason: give the reason the version is rejected")
    if version == 0:
        raise UserError(f"reject --version 0: v0 is {agent}'s base model and stays promoted")
    with cli_context(db) as ctx:
        require_agent(ctx, agent)
        _known(ctx, agent, version)
        changed = reject_version(ctx, agent, version, reason)
        _print_change(ctx, agent, changed)


def _known(ctx: PipelineContext, agent: str, version: int) -> None:
    """UserError unless `agent` has registered `version`."""
    newest = ctx.newest_version(ctx.agent(agent)).version
    if version > newest:
        raise UserError(
            f"--version {version}: {agent} has versions v0–v{newest}; see `futureworld "
            f"versions --agent {agent}`"
        )


def _print_change(ctx: PipelineContext, agent: str, changed: PolicyVersion) -> None:
    served = ctx.current_version(ctx.agent(agent)).version
    _say(
        f"{agent} v{changed.version}: {changed.status} ({changed.status_reason}); "
        f"{agent} serves v{served}"
    )
