from datetime import UTC, datetime

from futureworld.domain import OutcomeStatus
from futureworld.sources import metaculus
from tests.sources.loopback_server import Reply, Request

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def post(i: int, *, qtype="binary", resolution=None, status="open", centers=(0.4,)) -> dict:
    return {
        "id": 1000 + i,
        "title": f"Will measure {i} pass before 2027?",
        "published_at": "2026-01-05T00:00:00Z",
        "projects": {"category": [{"id": 3, "name": "Politics"}]},
        "question": {
            "id": 2000 + i,
            "type": qtype,
            "status": status,
            "title": f"Will measure {i} pass before 2027?",
            "description": "Background text.",
            "resolution_criteria": "Resolves Yes if the measure passes.",
            "fine_print": "Annulled if the vote is postponed.",
            "scheduled_close_time": "2026-12-01T00:00:00Z",
            "scheduled_resolve_time": "2027-01-01T00:00:00Z",
            "actual_resolve_time": "2026-12-15T00:00:00Z" if resolution else None,
            "resolution": resolution,
            "aggregations": {"recency_weighted": {"latest": {"centers": list(centers)}}},
        },
    }


def offset_pages(posts: list[dict], base_url_holder: list[str]):
    def handler(request: Request) -> Reply:
        offset, limit = int(request.query["offset"]), int(request.query["limit"])
        more = offset + limit < len(posts)
        nxt = f"{base_url_holder[0]}/api/posts/?offset={offset + limit}" if more else None
        return Reply(
            200, {"count": len(posts), "next": nxt, "results": posts[offset : offset + limit]}
        )

    return handler


def test_harvest_pages_by_offset_with_token_and_skips_groups(server, client):
    posts = [post(0), post(1), {"id": 1002, "title": "Group", "group_of_questions": {}}, post(3)]
    server.route("/api/posts/", offset_pages(posts, [server.base_url]))
    result = metaculus.harvest_open(client, server.base_url, now=NOW, page_size=2, token="t0k")
    assert [q.external_id for q in result.questions] == ["1000", "1001", "1003"]
    assert result.counts["skipped_unsupported_kind"] == 1 and result.counts["pages"] == 2
    requests = server.requests_to("/api/posts/")
    assert [r.query["offset"] for r in requests] == ["0", "2"]
    assert all(r.headers["authorization"] == "Token t0k" for r in requests)
    q = result.questions[0]
    assert q.crowd_probability == 0.4 and q.domain == "Politics"
    assert "postponed" in q.resolution_criteria and q.url.endswith("/questions/1000/")
    assert "t0k" not in repr(result)


def test_post_without_community_prediction_has_no_crowd(server, client):
    server.route("/api/posts/", [Reply(200, {"next": None, "results": [post(0, centers=())]})])
    (question,) = metaculus.harvest_open(client, server.base_url, now=NOW).questions
    assert question.crowd_probability is None


def test_unexpected_page_shape_is_reported(server, client):
    server.route("/api/posts/", [Reply(200, {"detail": "Invalid token."})])
    result = metaculus.harvest_open(client, server.base_url, now=NOW)
    assert result.questions == [] and "expected" in result.errors[0]


def test_resolutions_map_annulled_and_ambiguous_to_annulled(server, client):
    for i, resolution in enumerate(["yes", "no", "annulled", "ambiguous", None]):
        body = post(i, resolution=resolution, status="resolved" if resolution else "open")
        server.route(f"/api/posts/{1000 + i}/", [Reply(200, body)])
    ids = [str(1000 + i) for i in range(5)]
    result = metaculus.fetch_resolutions(client, server.base_url, ids, token="t0k")
    by_id = {r.external_id: r for r in result.resolutions}
    assert [by_id[i].value for i in ids[:2]] == [1.0, 0.0]
    assert [by_id[i].status for i in ids[2:4]] == [OutcomeStatus.ANNULLED] * 2
    assert "1004" not in by_id and result.errors == []
    assert by_id["1000"].resolved_at == datetime(2026, 12, 15, tzinfo=UTC)


def test_a_null_empty_or_wrongly_typed_title_or_id_is_refused_with_a_line_naming_it(server, client):
    untitled = post(1)
    untitled["title"] = untitled["question"]["title"] = None
    fallback = post(2)
    fallback["title"] = None  # an untitled post takes its question's title
    empty, listed, wrong_id = post(3), post(4), post(5)
    empty["title"] = " \n"
    listed["title"] = ["Will measure 4 pass?"]
    wrong_id["id"] = 10.5
    posts = [post(0), untitled, fallback, empty, listed, wrong_id]
    server.route("/api/posts/", [Reply(200, {"next": None, "results": posts})])
    result = metaculus.harvest_open(client, server.base_url, now=NOW)
    assert [(q.external_id, q.title) for q in result.questions] == [
        ("1000", "Will measure 0 pass before 2027?"),
        ("1002", "Will measure 2 pass before 2027?"),
    ]
    assert result.counts["skipped_malformed"] == 4 and len(result.errors) == 4
    null, blank, wrong_type, not_an_id = result.errors
    assert "post 1001 is malformed: question.title is null" in null
    assert "post 1003 is malformed: title is empty" in blank
    assert "post 1004 is malformed: title is not text (got list" in wrong_type
    assert "post 10.5 is malformed: id is not a string or an integer (got float" in not_an_id
