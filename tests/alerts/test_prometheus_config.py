"""deploy/prometheus.yml: valid, loads the rules, scrapes ranks, exporters and remediation."""

from __future__ import annotations

from typing import Any

import yaml

from tests.alerts.tools import REPO, RULES_FILE, binary, run
from trainguard import contract

CONFIG = REPO / "deploy" / "prometheus.yml"


def config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return data


def jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in config()["scrape_configs"]}


def test_promtool_check_config() -> None:
    result = run(binary("promtool"), "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    # The config's rule files are found and checked too.
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_loads_the_rules_file() -> None:
    (rule_file,) = config()["rule_files"]
    assert (CONFIG.parent / rule_file).resolve() == RULES_FILE


def test_scrapes_ranks_through_file_sd_with_their_own_labels() -> None:
    ranks = jobs()[contract.SCRAPE_JOB_RANKS]
    assert ranks["honor_labels"] is True
    (sd,) = ranks["file_sd_configs"]
    assert all(path.endswith(".json") for path in sd["files"])


def test_scrapes_exporter_and_remediation_on_their_default_ports() -> None:
    from trainguard.exporters.app import DEFAULT_LISTEN_ADDRESS
    from trainguard.remediation.settings import Settings

    exporter = jobs()[contract.SCRAPE_JOB_EXPORTER]
    (static,) = exporter["static_configs"]
    assert static["targets"][0].endswith(DEFAULT_LISTEN_ADDRESS)
    remediation = jobs()[contract.SCRAPE_JOB_REMEDIATION]
    (static,) = remediation["static_configs"]
    assert static["targets"] == [f"remediation:{Settings.model_fields['port'].default}"]


def test_documents_exemplar_storage() -> None:
    assert "--enable-feature=exemplar-storage" in CONFIG.read_text()
    assert config()["storage"]["exemplars"]["max_exemplars"] > 0
