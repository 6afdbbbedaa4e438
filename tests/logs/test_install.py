"""ILM policy, index template and Kibana data view: installed once, replaced only on change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from elasticsearch import Elasticsearch

from tests.logs.fake_es import FakeElasticsearch
from trainguard import cli
from trainguard.logs.install import (
    DATA_VIEW_ID,
    ElasticsearchInstaller,
    InstallError,
    Retention,
)


@pytest.fixture
def fake() -> Iterator[FakeElasticsearch]:
    server = FakeElasticsearch().start()
    yield server
    server.stop()


def installer(fake: FakeElasticsearch, **options) -> ElasticsearchInstaller:
    return ElasticsearchInstaller(Elasticsearch(fake.url, max_retries=0), **options)


def test_first_install_creates_everything_second_changes_nothing(fake) -> None:
    setup = installer(fake, kibana_url=fake.url)
    assert setup.install() == ["ilm_policy", "index_template", "data_view"]
    puts = fake.count("PUT", "/_")
    assert setup.install() == []
    assert fake.count("PUT", "/_") == puts
    assert fake.count("POST", "/api/data_views") == 1

    template = fake.state.templates["logs-trainguard"]["body"]
    assert template["index_patterns"] == ["logs-trainguard.*-*"]
    assert template["data_stream"] == {}
    assert template["priority"] > 100  # above Elasticsearch's built-in logs template
    assert template["template"]["settings"]["index.lifecycle.name"] == "logs-trainguard"
    labels = template["template"]["mappings"]["properties"]["labels"]["properties"]
    assert labels["job_id"] == {"type": "keyword"}
    policy = fake.state.policies["logs-trainguard"]["body"]["policy"]
    assert policy["phases"]["delete"]["min_age"] == "30d"
    assert "rollover" in policy["phases"]["hot"]["actions"]
    view = fake.state.data_views[DATA_VIEW_ID]
    assert view["title"] == "logs-trainguard.*" and view["timeFieldName"] == "@timestamp"


def test_changed_retention_replaces_only_the_policy(fake) -> None:
    installer(fake).install()
    longer = installer(fake, retention=Retention(delete_after="90d"))
    assert longer.install() == ["ilm_policy"]
    policy = fake.state.policies["logs-trainguard"]
    assert policy["version"] == 2
    assert policy["body"]["policy"]["phases"]["delete"]["min_age"] == "90d"


def test_unreachable_kibana_is_an_install_error(fake) -> None:
    stopped = FakeElasticsearch().start()
    stopped.stop()
    with pytest.raises(InstallError):
        installer(fake, kibana_url=stopped.url).install()


def test_elasticsearch_side_installs_without_kibana(fake) -> None:
    stopped = FakeElasticsearch().start()
    stopped.stop()
    setup = installer(fake, kibana_url=stopped.url)
    assert setup.install_elasticsearch() == ["ilm_policy", "index_template"]
    assert fake.count("GET", "/api/data_views") == 0
    with pytest.raises(InstallError):
        setup.install_data_view()


def test_logs_setup_command_is_idempotent(fake, capsys) -> None:
    argv = ["logs-setup", "--elasticsearch", fake.url, "--kibana", fake.url, "--delete-after", "7d"]
    assert cli.main(argv) == 0
    assert "installed: ilm_policy, index_template, data_view" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert "already up to date" in capsys.readouterr().out
    policy = fake.state.policies["logs-trainguard"]["body"]["policy"]
    assert policy["phases"]["delete"]["min_age"] == "7d"


def test_logs_setup_command_reports_an_unreachable_cluster(capsys) -> None:
    stopped = FakeElasticsearch().start()
    stopped.stop()
    assert cli.main(["logs-setup", "--elasticsearch", stopped.url]) == 1
    assert "logs-setup:" in capsys.readouterr().err
