"""Demonstrations for supervised fine-tuning: token sequences shaped exactly like rollouts
(prompt ids, then completion ids with loss-mask 1), so SFT and RL share one data path.

A JSONL file holds one demonstration per line: `{"prompt": str, "completion": str}` where the
prompt is raw text (tokenized as is), or `{"question": {...}, "completion": str}` where the
question (title, background, resolution_criteria, info_cutoff_at, resolve_by …) is rendered
with the agent's own prompt. A question may name its `kind` ("binary", "choice" or
"multiple_choice", "numeric") with its `options` and `extra` (e.g. {"numeric": {...}}); the
completion is then parsed in that kind's answer format. The canonical completion for a
forecast is the kind's `write` (futureworld.answers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from transformers import PreTrainedTokenizerBase

from futureworld.agent.prompts import encode_prompt
from futureworld.answers import ParsedAnswer, parse_final_answer
from futureworld.answers.binary import parse_answer

# The binary demonstration's answer, under the name flows.demo.run and benchmarks import.
from futureworld.answers.binary import write_probability as answer_text  # noqa: F401
from futureworld.domain import ParseStatus, Question, StopReason, Trajectory, Turn


class DemonstrationFormatError(ValueError):
    """A demonstration line that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Demonstration:
    completion: str
    prompt: str | None = None
    question: Question | None = None


def demonstration_trajectory(
    tokenizer: PreTrainedTokenizerBase,
    demonstration: Demonstration,
    *,
    agent_id: int,
    policy_version: int,
    sample_index: int,
    as_of: datetime | None = None,
    brief: bool = False,
) -> Trajectory:
    """Tokenize once: prompt ids (context) + completion ids (mask 1, log-prob 0 placeholder).

    A question is rendered with the agent's own prompt (`brief` as in AgentConfig.brief_prompt).
    """
    if demonstration.question is not None:
        question = demonstration.question
        prompt = encode_prompt(
            tokenizer, question, as_of=as_of or question.info_cutoff_at, brief=brief
        )
        question_id = question.id or 0
    else:
        prompt = tokenizer(demonstration.prompt or "", add_special_tokens=False)["input_ids"]
        question_id = 0
    completion = tokenizer(demonstration.completion, add_special_tokens=False)["input_ids"]
    if demonstration.question is not None:
        answer = parse_final_answer(demonstration.completion, demonstration.question)
    else:
        p_yes, binary_status = parse_answer(demonstration.completion)
        answer = ParsedAnswer(status=binary_status, p_yes=p_yes)
    status = answer.status
    return Trajectory(
        question_id=question_id,
        agent_id=agent_id,
        policy_version=policy_version,
        sample_index=sample_index,
        prompt_token_ids=tuple(prompt),
        completion_token_ids=tuple(completion),
        loss_mask=(1,) * len(completion),
        behaviour_logprobs=(0.0,) * len(completion),
        turns=(
            Turn(
                index=0,
                role="assistant",
                text=demonstration.completion,
                token_start=0,
                token_end=len(completion),
            ),
        ),
        p_yes=answer.p_yes,
        choice=answer.choice,
        probabilities=answer.probabilities,
        quantiles=answer.quantiles,
        parse_status=status,
        stop_reason=StopReason.ANSWERED if status is ParseStatus.OK else StopReason.NO_ACTION,
    )


def read_demonstrations(text: str, filename: str) -> list[Demonstration]:
    demonstrations = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{filename}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DemonstrationFormatError(f"{where}: invalid JSON ({error.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("completion"), str):
            raise DemonstrationFormatError(f"{where}: needs a string field 'completion'")
        if isinstance(row.get("prompt"), str):
            demonstrations.append(Demonstration(completion=row["completion"], prompt=row["prompt"]))
        elif isinstance(row.get("question"), dict):
            demonstrations.append(
                Demonstration(
                    completion=row["completion"], question=_question(row["question"], where)
                )
            )
        else:
            raise DemonstrationFormatError(f"{where}: needs 'prompt' (text) or 'question' (object)")
    return demonstrations


def _question(data: dict[str, Any], where: str) -> Question:
    try:
        cutoff = datetime.fromisoformat(data["info_cutoff_at"])
        resolve_by = datetime.fromisoformat(data["resolve_by"]) if data.get("resolve_by") else None
        return Question(
            source=str(data.get("source", "demonstration")),
            external_id=str(data.get("external_id", where)),
            title=str(data["title"]),
            background=str(data.get("background", "")),
            resolution_criteria=str(data.get("resolution_criteria", "")),
            created_at=cutoff,
            info_cutoff_at=cutoff,
            resolve_by=resolve_by,
            kind=str(data.get("kind", "binary")),
            options=tuple(str(o) for o in data.get("options", ())),
            extra=dict(data.get("extra", {})),
        )
    except KeyError as error:
        raise DemonstrationFormatError(f"{where}: question is missing field {error}") from None
    except (TypeError, ValueError) as error:
        raise DemonstrationFormatError(f"{where}: bad question field ({error})") from None
