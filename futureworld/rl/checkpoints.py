"""Loading a policy for training and writing checkpoints atomically.

A checkpoint is written to a temporary sibling directory and `os.replace`d into place, so
the target path either holds a complete checkpoint or does not exist. Registering the
version is the caller's job, after this returns.

What a crash leaves behind (a temporary directory a SIGKILL interrupted, a checkpoint renamed
into place but never registered, which the next update moves aside as
`<name>.unregistered-<time>`) is removed by `remove_stale_checkpoints` once older than a day:
the day leaves a person time to look at it, and keeps a checkpoint another process may
still be writing out of reach.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from futureworld.rl.config import TrainConfig

OPTIMIZER_FILE = "optimizer.pt"
TRAINER_STATE_FILE = "trainer_state.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def load_policy(
    model_dir: Path,
    config: TrainConfig,
    *,
    adapter_dir: Path | None = None,
    resume_from: Path | None = None,
) -> nn.Module:
    """A trainable causal LM in fp32: full weights, or the base plus a (new or loaded) LoRA adapter.

    `resume_from` (a checkpoint written by `save_checkpoint`) replaces the weights of
    `model_dir` (full fine-tuning) or the adapter (LoRA).
    """
    from transformers import AutoModelForCausalLM

    if adapter_dir is not None and not config.lora:
        raise ValueError(f"adapter_dir {adapter_dir} given but config.lora is False")
    weights_dir = resume_from if resume_from is not None and not config.lora else model_dir
    _require_dir(weights_dir, "model directory")
    model = AutoModelForCausalLM.from_pretrained(
        weights_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    if not config.lora:
        return model
    from peft import LoraConfig, PeftModel, get_peft_model

    adapter = resume_from if resume_from is not None else adapter_dir
    if adapter is not None:
        _require_dir(adapter, "adapter directory")
        return PeftModel.from_pretrained(model, adapter, is_trainable=True)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def _require_dir(path: Path, what: str) -> None:
    if not Path(path).is_dir():
        raise FileNotFoundError(f"{what} {path} does not exist")


STALE_CHECKPOINT_AGE_S = 86_400.0
"""Temporary and unregistered checkpoint directories older than this are removed."""


def stale_checkpoints(
    directory: Path,
    registered: Iterable[Path],
    *,
    max_age_s: float = STALE_CHECKPOINT_AGE_S,
    now_s: float | None = None,
) -> list[Path]:
    """Directories in `directory` (one agent's checkpoints) left by crashed updates and not
    touched for `max_age_s`: temporary `.<name>.tmp-*` directories and `*.unregistered-*`
    directories, never a registered version's path. A `v<n>` checkpoint that is not
    registered is left to the next update, which moves it aside (it may belong to another
    database sharing this folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    keep = {Path(p).resolve() for p in registered}
    now_s = time.time() if now_s is None else now_s
    found = []
    for entry in sorted(directory.iterdir()):
        if not entry.is_dir() or entry.is_symlink() or entry.resolve() in keep:
            continue
        name = entry.name
        crashed = (name.startswith(".") and ".tmp-" in name) or ".unregistered-" in name
        if crashed and now_s - entry.stat().st_mtime > max_age_s:
            found.append(entry)
    return found


def remove_stale_checkpoints(
    directory: Path,
    registered: Iterable[Path],
    *,
    max_age_s: float = STALE_CHECKPOINT_AGE_S,
    now_s: float | None = None,
) -> list[Path]:
    """Remove `stale_checkpoints(...)`; returns what was removed."""
    removed = stale_checkpoints(directory, registered, max_age_s=max_age_s, now_s=now_s)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def require_free_target(target: Path) -> None:
    """Checked before training, so a taken path costs no compute and overwrites nothing."""
    if Path(target).exists():
        raise FileExistsError(f"checkpoint target {target} already exists; choose a new path")


def checkpoint_sha256(path: Path) -> str:
    """sha256 over (relative path, file bytes) of every file, in sorted path order."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def save_checkpoint(
    model: nn.Module,
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    target: Path,
    *,
    model_state: dict[str, torch.Tensor] | None = None,
    tokenizer_dir: Path | None = None,
    on_save: Callable[[Path], None] | None = None,
) -> str:
    """Writes weights (or adapter), tokenizer files, optimizer and trainer state; returns sha256.

    `optimizer_state` is the optimiser's single-process `state_dict()`; `model_state` the
    full weights when the model's own are sharded (FSDP2 gathers them), else None.
    `on_save(tmp_dir)` runs after everything is written and before the rename (a hook for
    copying extra files in, and for tests that crash there). On any error the temporary
    directory is removed and the target is left untouched.
    """
    target = Path(target)
    require_free_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        tmp.mkdir()
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, tmp / name)
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        (tmp / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True))
        if on_save is not None:
            on_save(tmp)
        _fsync_tree(tmp)
        sha256 = checkpoint_sha256(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sha256


def _fsync_tree(root: Path) -> None:
    """Data on disk before the rename makes it visible (a power cut must not expose a torn file)."""
    for file in root.rglob("*"):
        if file.is_file():
            with file.open("rb") as fh:
                os.fsync(fh.fileno())


def read_optimizer_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The optimiser's single-process `state_dict()` saved with a checkpoint, on the CPU."""
    path = Path(checkpoint_dir) / OPTIMIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir} has no {OPTIMIZER_FILE} to resume from")
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def load_trainer_state(checkpoint_dir: Path, *, lora: bool) -> dict[str, Any]:
    """The trainer state of a checkpoint to resume, refused if it was trained the other way."""
    path = Path(checkpoint_dir) / TRAINER_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir} has no {TRAINER_STATE_FILE} to resume from")
    state = json.loads(path.read_text())
    if state["config"]["lora"] != lora:
        kind = {True: "LoRA", False: "full"}
        raise ValueError(
            f"cannot resume {kind[lora]} training from {checkpoint_dir}, "
            f"a {kind[state['config']['lora']]} fine-tuning checkpoint"
        )
    return state
