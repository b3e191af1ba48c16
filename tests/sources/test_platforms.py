import inspect

from futureworld.sources.platforms import SOURCES, SourceName
from tests.sources.loopback_server import Reply


def test_registry_has_exactly_one_adapter_per_source_name():
    assert set(SOURCES) == set(SourceName)
    assert all(adapter.name is name for name, adapter in SOURCES.items())


def test_every_adapter_has_the_shared_signature():
    harvest = {tuple(inspect.signature(a.harvest_open).parameters) for a in SOURCES.values()}
    resolve = {tuple(inspect.signature(a.fetch_resolutions).parameters) for a in SOURCES.values()}
    assert len(harvest) == 1 and len(resolve) == 1


def test_every_adapter_reports_a_dead_server_as_an_error(server, client):
    server.route("/", [Reply(500, "")])
    for adapter in SOURCES.values():
        result = adapter.harvest_open(client, server.base_url + "/nowhere", limit=5)
        assert result.questions == [] and len(result.errors) == 1
        assert result.errors[0].startswith(adapter.name)
        resolved = adapter.resolve(client, ["1"], base_url=server.base_url + "/nowhere")
        assert resolved.resolutions == [] and len(resolved.errors) == 1
