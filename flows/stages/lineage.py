"""Lineage of an update: which registered version it trains from (its parent), which AdamW
state it continues, and which reference a KL penalty anchors to.

A version's parent is the version whose weights it was trained from. Usually that is the
newest; an explicit resume names another registered checkpoint of the agent (a path that is
not one, or whose files no longer match its recorded sha256, is refused), which then is the
parent, the update's π_prox and the version staleness is measured against. A KL penalty
anchors to the agent's base model, version 0, unless the update names another registered full
model (e.g. the supervised warm start) or a trailing anchor, the promoted version k promotions
before its base (`kl_anchor`); for LoRA it is always the base under the adapter.
A baseline agent (crowd, base rate, uniform) has no policy, so nothing of it is trained.
An update that does not say whether it trains a LoRA adapter continues its parent's kind, and
from the base model trains an adapter for an agent on a vLLM server (`lora_for`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flows.context import PipelineContext
from futureworld.domain import Agent, BackendKind, PolicyVersion, VersionStatus
from futureworld.policy.base import is_lora_adapter
from futureworld.rl.config import Estimator, TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import get_policy_version, list_policy_versions


class LineageError(ValueError):
    """An update names a version or checkpoint the agent cannot train from or anchor to (not
    registered, changed since registration, LoRA where a full model is needed or the
    reverse): the caller's to fix, found before any training."""


def lora_for(agent: Agent, parent: PolicyVersion, lora: bool | None) -> bool:
    """Whether an update of `parent` trains a LoRA adapter: `lora` when the caller chose;
    otherwise what `parent` is (an adapter goes on as an adapter, a fully fine-tuned model as
    a full model), and from the base model (v0) an adapter for an agent on a vLLM server (the
    HTTP backend: an adapter is loaded into the running server, a full model needs the server
    restarted on it) and all weights for a local agent."""
    if lora is not None:
        return lora
    if is_lora_adapter(Path(parent.checkpoint_path)):
        return True
    return parent.version == 0 and agent.backend is BackendKind.OPENAI


def model_and_adapter(agent: Agent, current: PolicyVersion, lora: bool) -> tuple[Path, Path | None]:
    """(model directory, adapter directory or None) to train `current` from."""
    checkpoint = Path(current.checkpoint_path)
    if is_lora_adapter(checkpoint):
        if not lora:
            raise LineageError(
                f"{agent.name} v{current.version} is a LoRA adapter; keep training with --lora"
            )
        return Path(agent.base_model), checkpoint
    if lora and current.version > 0:
        raise LineageError(
            f"{agent.name} v{current.version} is a fully fine-tuned model; LoRA adapters are "
            "trained over the base model only (continue without --lora)"
        )
    return checkpoint, None


def continued_optimizer(current: PolicyVersion, config: TrainConfig) -> Path | None:
    """The current version's checkpoint when its AdamW state should carry into this update.

    RL versions continue one another's moments, as one long-running trainer would: a fresh
    AdamW's first steps are sign-like, lr-sized moves of every weight, which on noisy,
    outcome-driven rewards are mostly noise. The state of a supervised (SFT) update, or of
    a full fine-tune when this is LoRA (or the reverse), does not carry over.
    """
    from futureworld.rl.checkpoints import OPTIMIZER_FILE, load_trainer_state

    checkpoint = Path(current.checkpoint_path)
    if config.estimator is Estimator.SFT or not (checkpoint / OPTIMIZER_FILE).is_file():
        return None
    try:  # refused when missing, or when trained the other way (LoRA vs full)
        trained = load_trainer_state(checkpoint, lora=config.lora)
    except (FileNotFoundError, ValueError):
        return None
    return None if trained["config"]["estimator"] == Estimator.SFT else checkpoint


def check_update(agent: Agent, current: PolicyVersion, *, kl_reference: int, lora: bool) -> None:
    """Refuse, before any replay is read, an update that names what the agent does not have: a
    policy (a baseline agent), or the KL reference version (`_check_reference`)."""
    if not agent.backend.generates:
        raise LineageError(
            f"{agent.name} is a baseline (backend {agent.backend}) and has no policy to train; "
            "train an agent registered with `futureworld agent add NAME --model DIR`"
        )
    _check_reference(agent, current, kl_reference, lora=lora)


def _check_reference(agent: Agent, current: PolicyVersion, version: int, *, lora: bool) -> None:
    """The rules of a KL reference that need no files: a version the agent has, 0 for LoRA."""
    if lora and version != 0:
        raise LineageError(
            f"a LoRA update's KL reference is the base under its adapter (version 0), not "
            f"v{version}; train all weights to anchor to a later version"
        )
    if not 0 <= version <= current.version:
        raise LineageError(
            f"KL reference v{version}: {agent.name} has versions v0–v{current.version}"
        )


def trailing_reference(
    versions: Sequence[PolicyVersion], base: int, trail: int, *, oldest: int = 0
) -> int:
    """The version `trail` promotions before `base` along its parents: the list of `base`
    then its promoted ancestors no older than `oldest`, nearest first (a rejected or candidate
    ancestor is skipped: it never served), at index `trail`, or its last, the oldest such
    ancestor, when the lineage is shorter. `versions` are the agent's registered versions;
    `oldest` keeps the anchor off versions nobody would anchor to (the demo's randomly
    initialised v0 before its supervised warm start v1)."""
    by_number = {v.version: v for v in versions}
    if base not in by_number:
        raise LineageError(f"v{base} is not a registered version")
    chain = [base]
    parent = by_number[base].parent_version
    while parent is not None and parent >= oldest:
        ancestor = by_number[parent]
        if ancestor.status is VersionStatus.PROMOTED:
            chain.append(ancestor.version)
        parent = ancestor.parent_version
    return chain[min(trail, len(chain) - 1)]


def kl_anchor(
    ctx: PipelineContext,
    agent: Agent,
    base: PolicyVersion,
    *,
    kl_reference: int | None,
    kl_trail: int | None,
    lora: bool,
) -> int:
    """The version an update of `base` anchors its KL penalty to: `kl_reference` when named
    alone; with `kl_trail`, `trailing_reference` of the agent's lineage now (so each update's
    anchor moves with the policy), never older than `kl_reference` when both are named;
    otherwise the base model, version 0. A trailing anchor for LoRA (whose reference is
    always the base under the adapter): LineageError."""
    if kl_trail is None:
        return 0 if kl_reference is None else kl_reference
    if lora:
        raise LineageError(
            f"kl_trail={kl_trail} with LoRA: a LoRA update's KL reference is the base under "
            "its adapter (version 0); train all weights to anchor to a trailing version"
        )
    with session_scope(ctx.engine) as session:
        versions = list_policy_versions(session, agent.id)
    oldest = 0 if kl_reference is None else kl_reference
    return trailing_reference(versions, base.version, kl_trail, oldest=oldest)


def reference_version(
    ctx: PipelineContext, agent: Agent, current: PolicyVersion, version: int, *, lora: bool
) -> PolicyVersion:
    """The registered version a KL penalty anchors to: the base model (version 0) by
    default, or a later full model such as the supervised warm start that RL should stay
    near. Refused: a version the agent does not have, a LoRA adapter (with LoRA the reference
    is the base under the adapter, version 0), files changed since registration."""
    from futureworld.rl.checkpoints import checkpoint_sha256

    _check_reference(agent, current, version, lora=lora)
    with session_scope(ctx.engine) as session:
        reference = get_policy_version(session, agent.id, version)
    checkpoint = Path(reference.checkpoint_path)
    if is_lora_adapter(checkpoint):
        raise LineageError(
            f"KL reference v{version} of {agent.name} is a LoRA adapter; anchor to a full model"
        )
    recorded = reference.checkpoint_sha256
    if version and recorded and recorded != checkpoint_sha256(checkpoint):
        raise LineageError(
            f"KL reference v{version} of {agent.name} ({checkpoint}) no longer matches the "
            f"sha256 recorded when it was registered"
        )
    return reference


def registered_version(
    ctx: PipelineContext, agent: Agent, current: PolicyVersion, checkpoint: Path
) -> PolicyVersion:
    """The registered version of `agent` stored at `checkpoint`, its files unchanged since."""
    from futureworld.rl.checkpoints import checkpoint_sha256

    wanted = Path(checkpoint).resolve()
    with session_scope(ctx.engine) as session:
        versions = [
            get_policy_version(session, agent.id, v) for v in range(current.version, -1, -1)
        ]
    for version in versions:
        if Path(version.checkpoint_path).resolve() != wanted:
            continue
        if version.checkpoint_sha256 and checkpoint_sha256(wanted) != version.checkpoint_sha256:
            raise LineageError(
                f"{checkpoint} is {agent.name} v{version.version}, but its files no longer "
                f"match the sha256 recorded when it was registered"
            )
        return version
    raise LineageError(
        f"cannot resume from {checkpoint}: it is not a registered version of {agent.name} "
        f"(v0–v{current.version}); resume from one of the agent's own checkpoints"
    )
