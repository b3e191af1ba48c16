"""The simulated world: a seeded generator of news, questions and outcomes, served over HTTP.

Binary questions by default; multiple-choice and numeric ones too when WorldConfig asks.

`World(WorldConfig(...))` generates; `SimClock` is the shared simulated now; `serve_world`
serves RSS feeds and a Manifold-compatible API on loopback; `reference` writes warm-start data.
A research world (`research=True`) states no cue in its questions, only in its evidence;
`World.informed_probability` / `uninformed_probability` (choice and numeric: `informed_forecast`
/ `uninformed_forecast`) and `research_floors` / `kind_research_floors` bound it.
"""

from futureworld.world.articles import ArticleKind, SimArticle
from futureworld.world.clock import SimClock
from futureworld.world.config import WorldConfig
from futureworld.world.model import World
from futureworld.world.outcomes import KindResolution, MarketResolution, Resolution
from futureworld.world.questions import SimChoiceQuestion, SimNumericQuestion, SimQuestion
from futureworld.world.reference import (
    KindResearchFloors,
    ResearchFloors,
    SFTExample,
    kind_research_floors,
    reference_forecast,
    research_floors,
    sft_examples,
    true_probability,
)
from futureworld.world.server import WorldServer, serve_world
from futureworld.world.vocabulary import Topic

__all__ = [
    "ArticleKind",
    "KindResearchFloors",
    "KindResolution",
    "MarketResolution",
    "ResearchFloors",
    "Resolution",
    "SFTExample",
    "SimArticle",
    "SimChoiceQuestion",
    "SimClock",
    "SimNumericQuestion",
    "SimQuestion",
    "Topic",
    "World",
    "WorldConfig",
    "WorldServer",
    "kind_research_floors",
    "reference_forecast",
    "research_floors",
    "serve_world",
    "sft_examples",
    "true_probability",
]
