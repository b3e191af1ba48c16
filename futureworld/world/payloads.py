"""Wire formats the world server speaks: RSS 2.0 documents and Manifold v0 market JSON.

Pure functions from world objects to bytes / dicts; which objects are visible at the clock's
now is the server's decision, not this module's.

Manifold shapes follow docs.manifold.markets/api (LiteMarket for lists, FullMarket for one
market): times are epoch milliseconds, `probability` is the market's current P(yes),
`resolution` is YES/NO/CANCEL/MKT and appears only once the market is resolved. As a
documented superset the lite shape also carries `groupSlugs` and `textDescription`, so a
harvest from the list alone knows the topic and the resolution criteria.

Choice questions are MULTIPLE_CHOICE cpmm-multi-1 markets with shouldAnswersSumToOne and
addAnswersMode DISABLED (common/src/api/market-types.ts): the lite shape has no probability,
pool or answers, as on Manifold, so a harvest fetches the FullMarket for its `answers` (id,
index, text, probability, pool …). A CHOOSE_ONE resolution sets the market's `resolution` to
the winning answer's id and each answer's `resolution` to YES or NO; a cancel is CANCEL.
Numeric questions are PSEUDO_NUMERIC cpmm-1 markets: min, max, isLogScale and `value` (the
crowd's number), `probability` = (value − min)/(max − min); they resolve MKT with
`resolutionProbability` on that scale and, as a documented field of Manifold's PseudoNumeric
contract the API does not list, `resolutionValue` (the number itself).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime
from email.utils import format_datetime
from typing import Any

from futureworld.world.articles import SimArticle
from futureworld.world.model import CREATOR_USERNAME
from futureworld.world.outcomes import KindResolution, Resolution
from futureworld.world.questions import (
    SimChoiceQuestion,
    SimKindQuestion,
    SimNumericQuestion,
    SimQuestion,
)

CONTENT_NS = "http://purl.org/rss/1.0/modules/content/"
ET.register_namespace("content", CONTENT_NS)
POOL_LIQUIDITY = 100.0


def to_ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def rss_document(
    *, title: str, link: str, description: str, articles: list[SimArticle], base_url: str,
    built_at: datetime,
) -> bytes:  # fmt: skip
    """An RSS 2.0 channel with one <item> per article (guid, link, title, description,
    content:encoded, category, pubDate in RFC 822), in the order given."""
    rss = ET.Element("rss", {"version": "2.0"})
    channel = ET.SubElement(rss, "channel")
    ET.SubElement(channel, "title").text = title
    ET.SubElement(channel, "link").text = link
    ET.SubElement(channel, "description").text = description
    ET.SubElement(channel, "lastBuildDate").text = format_datetime(built_at, usegmt=True)
    for article in articles:
        item = ET.SubElement(channel, "item")
        ET.SubElement(item, "title").text = article.title
        ET.SubElement(item, "link").text = f"{base_url}{article.path}"
        ET.SubElement(item, "guid", {"isPermaLink": "false"}).text = article.guid
        ET.SubElement(item, "description").text = article.summary
        ET.SubElement(item, f"{{{CONTENT_NS}}}encoded").text = article.body
        ET.SubElement(item, "category").text = article.topic.value
        ET.SubElement(item, "pubDate").text = format_datetime(article.published_at, usegmt=True)
    return ET.tostring(rss, encoding="utf-8", xml_declaration=True)


def article_html(article: SimArticle) -> bytes:
    """A minimal article page for the link of an RSS item."""
    page = ET.Element("html")
    head = ET.SubElement(page, "head")
    ET.SubElement(head, "title").text = article.title
    body = ET.SubElement(page, "body")
    ET.SubElement(body, "h1").text = article.title
    ET.SubElement(body, "time").text = article.published_at.isoformat()
    ET.SubElement(body, "p").text = article.body
    return b"<!DOCTYPE html>\n" + ET.tostring(page, encoding="utf-8", method="html")


def market_url(question: SimQuestion | SimKindQuestion, base_url: str) -> str:
    return f"{base_url}/{CREATOR_USERNAME}/{question.slug}"


def lite_market(
    question: SimQuestion, resolution: Resolution | None, *, now: datetime, base_url: str
) -> dict[str, Any]:
    """Manifold's LiteMarket for a binary cpmm-1 market as of `now`.

    `resolution` must be None until now ≥ its resolution time (the server guarantees it).
    Pool: for cpmm-1 with p = 0.5, P(yes) = NO / (YES + NO), so YES = L·(1 − P), NO = L·P.
    """
    prob = question.crowd_probability
    trading = {
        "outcomeType": "BINARY",
        "mechanism": "cpmm-1",
        "probability": prob,
        "p": 0.5,
        "pool": {
            "YES": round(POOL_LIQUIDITY * (1.0 - prob), 4),
            "NO": round(POOL_LIQUIDITY * prob, 4),
        },
        "totalLiquidity": POOL_LIQUIDITY,
    }
    market = _market_base(
        question,
        resolution is not None,
        now=now,
        base_url=base_url,
        trading=trading,
        volume=round(40.0 + 600.0 * abs(prob - 0.5) + 7.0 * question.index, 2),
        bettors=3 + question.index % 11,
    )
    if resolution is not None:
        market["resolution"] = resolution.resolution.value
        _set_resolved(market, resolution.resolved_at)
    return market


def full_market(
    question: SimQuestion, resolution: Resolution | None, *, now: datetime, base_url: str
) -> dict[str, Any]:
    """Manifold's FullMarket: the LiteMarket plus the description as a TipTap document."""
    market = lite_market(question, resolution, now=now, base_url=base_url)
    market["description"] = {
        "type": "doc",
        "content": [
            {"type": "paragraph", "content": [{"type": "text", "text": question.description}]}
        ],
    }
    return market


def _market_base(
    question: SimQuestion | SimKindQuestion,
    resolved: bool,
    *,
    now: datetime,
    base_url: str,
    trading: dict[str, Any],
    volume: float,
    bettors: int,
) -> dict[str, Any]:
    """The fields every kind of market shares as of `now`, with its `trading` fields (type,
    mechanism, pool …) after its url, in Manifold's order."""
    last_updated = min(now, question.close_at)
    return {
        "id": question.external_id,
        "creatorId": f"{CREATOR_USERNAME}-id",
        "creatorUsername": CREATOR_USERNAME,
        "creatorName": "Simulated World",
        "createdTime": to_ms(question.created_at),
        "closeTime": to_ms(question.close_at),
        "question": question.title,
        "slug": question.slug,
        "url": market_url(question, base_url),
        **trading,
        "volume": volume,
        "volume24Hours": round(volume / question.horizon_days, 2),
        "uniqueBettorCount": bettors,
        "isResolved": resolved,
        "lastUpdatedTime": to_ms(last_updated),
        "lastBetTime": to_ms(last_updated),
        "token": "MANA",
        "groupSlugs": [question.topic.value],
        "textDescription": question.description,
    }


def _set_resolved(market: dict[str, Any], resolved_at: datetime) -> None:
    market["resolutionTime"] = to_ms(resolved_at)
    market["lastUpdatedTime"] = to_ms(resolved_at)


def _choice_answers(
    question: SimChoiceQuestion, resolution: KindResolution | None
) -> list[dict[str, Any]]:
    answers = []
    for index, (text, prob) in enumerate(
        zip(question.options, question.crowd_probabilities, strict=True)
    ):
        answer: dict[str, Any] = {
            "id": f"{question.external_id}a{index}",
            "index": index,
            "contractId": question.external_id,
            "userId": f"{CREATOR_USERNAME}-id",
            "text": text,
            "createdTime": to_ms(question.created_at),
            "probability": prob,
            "pool": {
                "YES": round(POOL_LIQUIDITY * (1.0 - prob), 4),
                "NO": round(POOL_LIQUIDITY * prob, 4),
            },
            "totalLiquidity": POOL_LIQUIDITY,
            "subsidyPool": 0,
            "probChanges": {"day": 0, "week": 0, "month": 0},
        }
        if resolution is not None and resolution.value is not None:
            answer["resolution"] = "YES" if index == int(resolution.value) else "NO"
            answer["resolutionTime"] = to_ms(resolution.resolved_at)
        answers.append(answer)
    return answers


def kind_market(
    question: SimKindQuestion,
    resolution: KindResolution | None,
    *,
    now: datetime,
    base_url: str,
    full: bool,
) -> dict[str, Any]:
    """The LiteMarket (full=False) or FullMarket of a choice or numeric market as of `now`;
    `resolution` must be None until its resolution time (the server guarantees it)."""
    market = _market_base(
        question,
        resolution is not None,
        now=now,
        base_url=base_url,
        trading={},
        volume=round(60.0 + 9.0 * question.index, 2),
        bettors=4 + question.index % 9,
    )
    if resolution is not None:
        _set_resolved(market, resolution.resolved_at)
    if isinstance(question, SimChoiceQuestion):
        market.update(outcomeType="MULTIPLE_CHOICE", mechanism="cpmm-multi-1")
        if resolution is not None:
            winner = resolution.value
            market["resolution"] = (
                "CANCEL" if winner is None else f"{question.external_id}a{int(winner)}"
            )
        if full:
            market.update(
                shouldAnswersSumToOne=True,
                addAnswersMode="DISABLED",
                answers=_choice_answers(question, resolution),
            )
    else:
        assert isinstance(question, SimNumericQuestion)
        spec = question.spec
        prob = round(spec.normalise(question.crowd_value), 4)
        market.update(
            outcomeType="PSEUDO_NUMERIC",
            mechanism="cpmm-1",
            probability=prob,
            p=0.5,
            pool={
                "YES": round(POOL_LIQUIDITY * (1.0 - prob), 4),
                "NO": round(POOL_LIQUIDITY * prob, 4),
            },
            totalLiquidity=POOL_LIQUIDITY,
            value=question.crowd_value,
            min=spec.lower,
            max=spec.upper,
            isLogScale=spec.log_scale,
        )
        if resolution is not None:
            if resolution.value is None:
                market["resolution"] = "CANCEL"
            else:
                market["resolution"] = "MKT"
                market["resolutionProbability"] = round(spec.normalise(resolution.value), 4)
                market["resolutionValue"] = resolution.value
    if full:
        market["description"] = {
            "type": "doc",
            "content": [
                {"type": "paragraph", "content": [{"type": "text", "text": question.description}]}
            ],
        }
    return market
