"""deploy/prometheus-http-sd.yml: valid, and its discovery agrees with the service and the
contract (the real Prometheus reading it is in test_prometheus.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.alerts.tools import REPO, binary, run
from trainguard import contract
from trainguard.remediation.settings import Settings

CONFIG = REPO / "deploy" / "prometheus-http-sd.yml"
FILE_SD_CONFIG = REPO / "deploy" / "prometheus.yml"


def load(path: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def jobs(path: Any = CONFIG) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in load(path)["scrape_configs"]}


def test_promtool_check_config() -> None:
    result = run(binary("promtool"), "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_each_kind_is_the_scrape_job_of_its_kind_on_the_service() -> None:
    (remediation,) = jobs()[contract.SCRAPE_JOB_REMEDIATION]["static_configs"]
    (service,) = remediation["targets"]
    assert service == f"remediation:{Settings.model_fields['port'].default}"
    for kind, job_name in contract.DISCOVERY_SCRAPE_JOBS.items():
        (sd,) = jobs()[job_name]["http_sd_configs"]
        url = urlsplit(sd["url"])
        assert (url.netloc, url.path) == (service, f"{contract.DISCOVERY_PATH}/{kind.value}")
        # Prometheus' http_sd does not default the type to Bearer (see the file).
        assert sd["authorization"]["type"] == "Bearer"
        token = (CONFIG.parent / sd["authorization"]["credentials_file"]).resolve()
        assert token == REPO / "deploy" / "secrets" / "remediation-token"
        assert token.is_file()


def test_it_differs_from_the_file_sd_config_in_discovery_alone() -> None:
    http_sd, file_sd = load(CONFIG), load(FILE_SD_CONFIG)
    for key in ("global", "rule_files", "storage", "alerting"):
        assert http_sd[key] == file_sd[key], key
    assert set(jobs()) == set(jobs(FILE_SD_CONFIG))
    ranks = jobs()[contract.SCRAPE_JOB_RANKS]
    file_sd_ranks = jobs(FILE_SD_CONFIG)[contract.SCRAPE_JOB_RANKS]
    assert ranks["honor_labels"] is file_sd_ranks["honor_labels"] is True
    assert ranks["scrape_interval"] == file_sd_ranks["scrape_interval"]
    assert "file_sd_configs" not in CONFIG.read_text()
