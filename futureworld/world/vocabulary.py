"""The simulated world's words: topics, entity names, event phrases, news wording and the
numeric questions' quantities and range.

Pure data plus the seeded entity roster; no randomness beyond the seed it is given. Keeping
the vocabulary small keeps the texts short and the locally trained tokenizer tiny.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Topic(StrEnum):
    ECONOMY = "economy"
    POLITICS = "politics"
    SPORTS = "sports"
    TECHNOLOGY = "technology"
    SCIENCE = "science"


@dataclass(frozen=True)
class Entity:
    name: str
    topic: Topic


NAME_STEMS = (
    "Arden", "Borel", "Calder", "Dunmore", "Elwin", "Farrow", "Galen", "Harlow", "Ivor",
    "Juno", "Kestrel", "Lorne", "Merrow", "Norland", "Orwen", "Pellam", "Quill", "Rowan",
    "Sable", "Tamsin", "Ulver", "Vantor", "Wexley", "Yarrow", "Zephyr", "Ashby", "Brisk",
    "Corran", "Delphi", "Ember",
)  # fmt: skip

ENTITY_SUFFIXES: dict[Topic, tuple[str, ...]] = {
    Topic.ECONOMY: ("Holdings", "Bank", "Industries"),
    Topic.POLITICS: ("Council", "Party", "Assembly"),
    Topic.SPORTS: ("United", "Rovers", "Athletic"),
    Topic.TECHNOLOGY: ("Labs", "Systems", "Networks"),
    Topic.SCIENCE: ("Institute", "Observatory", "Clinic"),
}

EVENTS: dict[Topic, tuple[str, ...]] = {
    Topic.ECONOMY: (
        "raise its prices",
        "report higher quarterly sales",
        "announce a merger",
        "cut its workforce",
    ),
    Topic.POLITICS: (
        "pass the budget vote",
        "win the by-election",
        "name a new leader",
        "approve the transit plan",
    ),
    Topic.SPORTS: (
        "win its next match",
        "sign a new striker",
        "reach the cup final",
        "replace its coach",
    ),
    Topic.TECHNOLOGY: (
        "ship its new release",
        "suffer a major outage",
        "file a new patent",
        "open a new data centre",
    ),
    Topic.SCIENCE: (
        "publish its trial results",
        "win the research grant",
        "launch the survey probe",
        "report a new discovery",
    ),
}

EVIDENCE_SOURCES = ("Analysts", "Insiders", "Local reporters", "Industry watchers", "Observers")

CHOICE_STRENGTH_WORDS = ("slight", "clear", "strong", "overwhelming")
"""How a choice question's favourite is described, weakest first (choice_favourite_p)."""
NUMERIC_UPPER = 200.0
NUMERIC_UNIT = "units"
NUMERIC_QUANTITIES = ("new customers", "site visits", "permits filed", "service calls")
NUMERIC_MEANS = tuple(20.0 * k for k in range(2, 9))
"""The values μ of a numeric question takes, equally likely (40, 60, …, 160)."""
NUMERIC_PRIOR_MEAN = sum(NUMERIC_MEANS) / len(NUMERIC_MEANS)

# Irrelevant chatter: never the subject of a question, never carries a cue.
DISTRACTOR_EVENTS = (
    "holds its annual meeting",
    "moves to a new office",
    "names a new spokesperson",
    "sponsors a local festival",
    "updates its website",
    "hosts a public open day",
)


def build_entities(seed: int, n_entities: int) -> tuple[Entity, ...]:
    """`n_entities` distinct entities, topics interleaved so every topic is represented."""
    rng = random.Random(f"{seed}:entities")
    topics = list(Topic)
    pools: dict[Topic, list[str]] = {}
    for topic in topics:
        names = [f"{stem} {suffix}" for stem in NAME_STEMS for suffix in ENTITY_SUFFIXES[topic]]
        rng.shuffle(names)
        pools[topic] = names
    used_stems: set[str] = set()
    entities: list[Entity] = []
    for i in range(n_entities):
        topic = topics[i % len(topics)]
        # Prefer an unused stem so "Arden Bank" and "Arden Labs" rarely coexist.
        pool = pools[topic]
        pick = next((n for n in pool if n.split()[0] not in used_stems), pool[0])
        pool.remove(pick)
        used_stems.add(pick.split()[0])
        entities.append(Entity(name=pick, topic=topic))
    return tuple(entities)
