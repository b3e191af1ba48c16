from datetime import UTC, datetime

import pytest

from futureworld.sources.rss import (
    canonical_link,
    fetch_feed,
    fetch_feeds,
    html_to_text,
    read_feed_list,
)
from tests.sources.loopback_server import Reply, Request

NOW = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)

DESCRIPTION = (
    b"&lt;p&gt;The &lt;b&gt;vote&lt;/b&gt; was 51&amp;ndash;49.&lt;/p&gt;"
    b"&lt;script&gt;x()&lt;/script&gt;"
)
RSS = b"""<?xml version="1.0" encoding="utf-8"?>
<rss version="2.0"><channel><title>Wire</title><link>https://news.example/</link>
<item><guid>g1</guid><title>Senate passes &lt;b&gt;budget&lt;/b&gt;</title>
 <link>https://News.Example/a/1/?utm_source=rss&amp;id=7#top</link>
 <pubDate>Sat, 28 Feb 2026 10:00:00 +0100</pubDate>
 <description>DESCRIPTION</description></item>
<item><guid>g1</guid><title>Same guid again</title><link>https://news.example/other</link>
 <pubDate>Sat, 28 Feb 2026 11:00:00 GMT</pubDate><description>dup</description></item>
<item><guid>g2</guid><title>Same link, new guid</title><link>https://news.example/a/1?id=7</link>
 <pubDate>Sat, 28 Feb 2026 12:00:00 GMT</pubDate><description>dup link</description></item>
<item><guid>g3</guid><title>No date here</title><link>https://news.example/a/3</link>
 <description>Undated story.</description></item>
<item><guid>g4</guid><title>Headline only</title><link>https://news.example/a/4</link>
 <pubDate>Sat, 28 Feb 2026 13:00:00 GMT</pubDate></item>
</channel></rss>""".replace(b"DESCRIPTION", DESCRIPTION)

ATOM = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>Atom wire</title><id>urn:feed</id>
<updated>2026-02-28T00:00:00Z</updated>
<entry><id>urn:e1</id><title>Central bank holds rates</title>
 <link href="https://atom.example/e1"/><updated>2026-02-27T09:30:00Z</updated>
 <summary>Rates unchanged.</summary>
 <content type="html">&lt;p&gt;The bank held rates at 4%.&lt;/p&gt;</content></entry>
</feed>"""


def test_rss_entries_become_clean_deduplicated_articles(server, client):
    server.route("/rss", [Reply(200, RSS, {"Content-Type": "application/rss+xml"})])
    result = fetch_feed(client, server.base_url + "/rss", now=NOW)
    assert result.errors == []
    assert [a.guid for a in result.articles] == ["g1", "g3", "g4"]
    assert result.counts["duplicate_guid"] == 1 and result.counts["duplicate_link"] == 1
    first = result.articles[0]
    assert first.title == "Senate passes budget"
    assert first.summary == "The vote was 51–49."
    assert first.published_at == datetime(2026, 2, 28, 9, 0, tzinfo=UTC)
    undated = result.articles[1]
    assert undated.published_at == NOW and undated.flags == ("date_from_fetch_time",)
    assert result.articles[2].flags == ("empty_body",)
    assert result.counts["date_from_fetch_time"] == 1 and result.counts["empty_body"] == 1


def test_atom_content_is_the_body(server, client):
    server.route("/atom", [Reply(200, ATOM, {"Content-Type": "application/atom+xml"})])
    (article,) = fetch_feed(client, server.base_url + "/atom", now=NOW).articles
    assert (article.guid, article.summary) == ("urn:e1", "Rates unchanged.")
    assert article.body == "The bank held rates at 4%."


def test_conditional_get_sends_validators_and_304_means_nothing_new(server, client):
    def handler(request: Request) -> Reply:
        if request.headers.get("if-none-match") == '"v1"':
            return Reply(304, b"")
        return Reply(200, RSS, {"ETag": '"v1"', "Last-Modified": "Sat, 28 Feb 2026 14:00:00 GMT"})

    server.route("/rss", handler)
    url = server.base_url + "/rss"
    first = fetch_feed(client, url, now=NOW)
    assert first.state.etag == '"v1"' and first.articles
    second = fetch_feed(client, url, state=first.state, now=NOW)
    assert second.not_modified and second.articles == [] and second.counts["not_modified"] == 1
    assert second.state.etag == '"v1"'
    sent = server.requests_to("/rss")[1].headers
    assert sent["if-modified-since"] == "Sat, 28 Feb 2026 14:00:00 GMT"


def test_malformed_xml_keeps_good_entries_and_flags_them(server, client):
    broken = RSS.replace(b"</channel></rss>", b"<item><title>cut off <b></item>")
    server.route("/bad", [Reply(200, broken)])
    result = fetch_feed(client, server.base_url + "/bad", now=NOW)
    assert result.counts["bozo"] == 1 and "malformed feed" in result.errors[0]
    assert {"g1", "g3", "g4"} <= {a.guid for a in result.articles}
    assert all("bozo_feed" in a.flags for a in result.articles)


def test_wrong_declared_encoding_is_reported(server, client):
    latin = "<?xml version='1.0' encoding='utf-8'?><rss version='2.0'><channel><title>c</title>"
    latin += "<item><guid>x</guid><title>Café économie</title></item></channel></rss>"
    server.route("/latin", [Reply(200, latin.encode("latin-1"))])
    result = fetch_feed(client, server.base_url + "/latin", now=NOW)
    assert result.counts["wrong_encoding"] == 1 and "encoding" in result.errors[0]
    assert [a.guid for a in result.articles] == ["x"]


def test_truncated_and_failed_downloads_are_reported_per_feed(server, client):
    server.route("/cut", [Reply(200, RSS[:300], truncate=True)])
    server.route("/ok", [Reply(200, ATOM)])
    server.route("/empty", [Reply(200, b"")])
    urls = [server.base_url + p for p in ("/cut", "/ok", "/empty", "/missing")]
    cut, ok, empty, missing = fetch_feeds(client, urls, now=NOW)
    assert cut.counts["truncated"] == 1 and cut.articles == [] and "incomplete" in cut.errors[0]
    assert len(ok.articles) == 1 and ok.errors == []
    assert empty.counts["empty_response"] == 1
    assert missing.counts["fetch_failed"] == 1 and "HTTP 404" in missing.errors[0]


def test_feeds_sharing_a_story_yield_it_once(server, client):
    server.route("/a", [Reply(200, RSS)])
    server.route("/b", [Reply(200, RSS.replace(b"<guid>g", b"<guid>other-g"))])
    a, b = fetch_feeds(client, [server.base_url + "/a", server.base_url + "/b"], now=NOW)
    assert len(a.articles) == 3
    # b's guids are new but its links are the same stories.
    assert b.articles == []
    assert b.counts["duplicate_link"] == 4 and b.counts["duplicate_guid"] == 1


def test_refetch_returns_the_same_guids(server, client):
    server.route("/rss", [Reply(200, RSS)])
    url = server.base_url + "/rss"
    first, second = fetch_feed(client, url, now=NOW), fetch_feed(client, url, now=NOW)
    assert [a.guid for a in first.articles] == [a.guid for a in second.articles]


def test_canonical_link_strips_tracking_fragment_and_slash():
    assert canonical_link("HTTPS://News.Example/a/1/?utm_medium=x&id=7#frag") == (
        "https://news.example/a/1?id=7"
    )


def test_html_to_text_drops_tags_scripts_and_entities():
    assert html_to_text("<div>a<br>b &amp; c<style>p{}</style></div>") == "a b & c"


def test_read_feed_list_skips_comments_and_names_bad_lines():
    text = "# feeds\nhttps://a.example/rss\n\nhttps://a.example/rss\nhttp://b.example/atom\n"
    assert read_feed_list(text) == ["https://a.example/rss", "http://b.example/atom"]
    with pytest.raises(ValueError, match="line 2"):
        read_feed_list("https://a.example/rss\nftp://nope\n")
