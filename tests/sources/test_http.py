import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from futureworld.sources.http import HttpConfig, SourceClient, SourceError, parse_retry_after
from tests.sources.loopback_server import FAST, Reply, ScriptedServer


def test_server_error_then_success_is_retried(server: ScriptedServer, client: SourceClient):
    server.route("/x", [Reply(500, "boom"), Reply(503, "busy"), Reply(200, {"ok": 1})])
    assert client.get_json("manifold", server.base_url + "/x") == {"ok": 1}
    assert len(server.requests_to("/x")) == 3


def test_persistent_server_error_gives_up_with_clear_source_error(server, client):
    server.route("/x", [Reply(502, "bad gateway")])
    with pytest.raises(SourceError) as info:
        client.get_json("kalshi", server.base_url + "/x")
    err = info.value
    assert err.source == "kalshi" and err.url.endswith("/x") and err.kind == "http_status"
    assert "HTTP 502" in err.reason and "3 attempts" in err.reason
    assert len(server.requests_to("/x")) == FAST.max_retries + 1


def test_client_error_is_not_retried(server, client):
    server.route("/x", [Reply(404, "missing")])
    with pytest.raises(SourceError, match="HTTP 404"):
        client.get("manifold", server.base_url + "/x")
    assert len(server.requests_to("/x")) == 1


def test_429_retry_after_seconds_is_honoured(server):
    slept: list[float] = []
    server.route("/x", [Reply(429, "slow down", {"Retry-After": "0"}), Reply(200, [1])])
    config = HttpConfig(max_retries=1, backoff_base_s=5.0, backoff_cap_s=9.0, default_rate_per_s=0)
    with SourceClient(config, sleep=slept.append) as c:
        assert c.get_json("manifold", server.base_url + "/x") == [1]
    # Retry-After 0 replaced the 5 s exponential backoff.
    assert slept == [0.0]


def test_retry_after_http_date_is_parsed():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    header = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after(header, now) == pytest.approx(7.0)
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("soon") is None


def test_429_forever_raises_rate_limited(server, client):
    server.route("/x", [Reply(429, "", {"Retry-After": "0"})])
    with pytest.raises(SourceError) as info:
        client.get("polymarket", server.base_url + "/x")
    assert info.value.kind == "rate_limited"


def test_timeout_is_retried_then_reported(server):
    server.route("/slow", [Reply(200, {"late": True}, delay_s=0.6)])
    config = HttpConfig(timeout_s=0.2, max_retries=1, backoff_base_s=0.01, default_rate_per_s=0)
    with SourceClient(config) as c, pytest.raises(SourceError) as info:
        c.get_json("metaculus", server.base_url + "/slow")
    assert info.value.kind == "timeout"
    assert len(server.requests_to("/slow")) == 2


def test_malformed_json_raises_bad_json(server, client):
    server.route("/x", [Reply(200, "{not json")])
    with pytest.raises(SourceError) as info:
        client.get_json("manifold", server.base_url + "/x")
    assert info.value.kind == "bad_json"


def test_truncated_download_is_reported(server, client):
    server.route("/x", [Reply(200, '{"a": 1', truncate=True)])
    with pytest.raises(SourceError) as info:
        client.get("manifold", server.base_url + "/x")
    assert info.value.kind == "truncated"


def test_per_source_rate_limit_spaces_requests(server):
    server.route("/x", [Reply(200, [])])
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    config = HttpConfig(rate_limit_per_s={"slow": 20.0}, default_rate_per_s=0)
    with SourceClient(config, sleep=sleep) as c:
        start = time.monotonic()
        for _ in range(4):
            c.get("slow", server.base_url + "/x")
        assert time.monotonic() - start >= 3 / 20.0 * 0.9
        assert len(slept) >= 3
        slept.clear()
        for _ in range(4):
            c.get("unlimited", server.base_url + "/x")
        assert slept == []


def test_secret_header_never_appears_in_errors(server, client):
    server.route("/x", [Reply(500, "")])
    with pytest.raises(SourceError) as info:
        client.get("metaculus", server.base_url + "/x", headers={"Authorization": "Token s3cr3t"})
    assert "s3cr3t" not in str(info.value)
    assert server.requests_to("/x")[0].headers["authorization"] == "Token s3cr3t"


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="timeout_s"):
        HttpConfig(timeout_s=0)
    with pytest.raises(ValueError, match="rate limit of x"):
        HttpConfig(rate_limit_per_s={"x": -1.0})
