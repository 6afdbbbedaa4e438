"""The rules file: rendered from the thresholds, valid, complete, and its promtool tests pass."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.alerts.tools import (
    ALERTS,
    PROMETHEUS_SERIES,
    REPO,
    RULE_TESTS,
    RULES_FILE,
    THRESHOLDS_FILE,
    binary,
    exposed_names,
    metric_names,
    recording_names,
    run,
)
from trainguard import cli, contract, thresholds
from trainguard.alerts import rules, runbook
from trainguard.alerts.rule import ALERT_RULES
from trainguard.alerts.runbook import anchor_of, failure_outline
from trainguard.alerts.runbook import sections as runbook_sections
from trainguard.contract import Alert, Severity

TRAINING_ALERTS = {a for a in Alert if a.value.startswith("Training")}
# Training alerts about a whole job, not one rank: a restart restarts every rank together.
JOB_ALERTS = {Alert.TRAINING_RANK_RESTARTED}


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def thresholds_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(THRESHOLDS_FILE.read_text())
    return data


def test_committed_rules_match_the_thresholds() -> None:
    assert cli.main(["rules", "--check"]) == 0


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "rules.yml"
    stale.write_text(RULES_FILE.read_text().replace(">= 1.2", ">= 1.3"))
    assert cli.main(["rules", "--check", "--out", str(stale)]) == 1
    assert cli.main(["rules", "--out", str(stale)]) == 0
    assert stale.read_text() == RULES_FILE.read_text()


def test_a_threshold_change_reaches_the_rules(tmp_path: Path) -> None:
    data = thresholds_data() | {"straggler_factor": 1.5, "stalled_seconds": 900}
    text = rules.render(thresholds.Thresholds.from_mapping(data))
    assert "ratio_to_job_median5m >= 1.5" in text
    assert "(threshold 1.5x)" in text
    assert "> 900" in text
    assert text != RULES_FILE.read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"straggler_factr": 1.2}, "unknown keys"),
        ({"rate_window": "5 minutes"}, "not a Prometheus duration"),
        ({"straggler_factor": "fast"}, "positive number"),
        ({"straggler_factor": -1}, "positive number"),
        ({"warmup_steps": True}, "non-negative integer"),
        ({"xid_critical": []}, "list of integers"),
    ],
)
def test_bad_thresholds_are_refused(change: dict[str, object], message: str) -> None:
    data = thresholds_data() | change
    with pytest.raises(thresholds.ThresholdsError, match=message):
        thresholds.Thresholds.from_mapping(data)


def test_missing_threshold_is_refused() -> None:
    data = thresholds_data()
    del data["stalled_for"]
    with pytest.raises(thresholds.ThresholdsError, match="missing keys \\['stalled_for'\\]"):
        thresholds.Thresholds.from_mapping(data)


def test_cli_reports_bad_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.yml"
    bad.write_text("rate_window: [unclosed\n")
    assert cli.main(["rules", "--thresholds", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_every_contract_alert_has_a_complete_rule() -> None:
    alert_rules = [r for r in load_rules() if "alert" in r]
    assert {r["alert"] for r in alert_rules} == {a.value for a in Alert}
    headings = set(runbook_sections((ALERTS / "runbook.md").read_text()))
    for rule in alert_rules:
        name = rule["alert"]
        assert rule["labels"][contract.LABEL_SEVERITY] in {s.value for s in Severity}, name
        notes = rule["annotations"]
        assert set(notes) == {
            contract.ANNOTATION_SUMMARY,
            contract.ANNOTATION_DESCRIPTION,
            contract.ANNOTATION_RUNBOOK_URL,
        }
        base, anchor = notes[contract.ANNOTATION_RUNBOOK_URL].split("#")
        assert base == "trainguard/alerts/runbook.md"
        assert anchor in headings, f"{name}: runbook has no section #{anchor}"
        text = notes[contract.ANNOTATION_DESCRIPTION]
        if Alert(name) in JOB_ALERTS:
            assert "$labels.job_id" in text and "$labels.rank" not in text, name
        elif Alert(name) in TRAINING_ALERTS:
            for label in ("job_id", "rank", "node"):
                assert f"$labels.{label}" in text, (name, label)
        else:
            # Node alerts name the node and list the job/rank of each rank running there.
            assert "$labels.node" in text and ".Labels.job_id" in text, name
            assert ".Labels.rank" in text, name


def test_every_alert_runbook_section_has_the_five_parts() -> None:
    sections = runbook_sections((ALERTS / "runbook.md").read_text())
    for rule in load_rules():
        if "alert" not in rule:
            continue
        anchor = rule["annotations"][contract.ANNOTATION_RUNBOOK_URL].split("#")[1]
        parts = re.findall(r"^- \*\*(.+?)\*\*:", sections[anchor], flags=re.M)
        assert tuple(parts) == runbook.ALERT_PARTS, f"{rule['alert']}: runbook section has {parts}"


def test_the_runbook_agrees_with_the_catalogue() -> None:
    """``## <failure value>`` per failure in catalogue order (anchor == value), each saying what
    the catalogue says (summary, alerts, signals, thresholds, dashboards, default actions), its
    alerts as ``### <Alert>`` in the five parts."""
    text = runbook.packaged_text()
    assert runbook.check(text) == []
    outline, _ = failure_outline(text)
    failures = [heading for level, heading in outline if level == 2]
    assert all(anchor_of(heading) == heading for heading in failures)


def _swap_sections(text: str, first: str, second: str) -> str:
    chunks = re.split(r"(?m)^(?=## |# )", text)
    a = next(i for i, c in enumerate(chunks) if c.startswith(f"## {first}\n"))
    b = next(i for i, c in enumerate(chunks) if c.startswith(f"## {second}\n"))
    chunks[a], chunks[b] = chunks[b], chunks[a]
    return "".join(chunks)


@pytest.mark.parametrize(
    ("spoil", "complaint"),
    [
        (lambda t: _swap_sections(t, "oom", "hang"), "not the catalogue's"),
        (lambda t: t.replace("### TrainingOOMRisk\n", "### TrainingOomRisk\n"), "not its alerts"),
        (lambda t: t.replace("`split_micro_batches`, `recommend`", "`recommend`"), "Default"),
        (lambda t: t.replace("`straggler_min_ranks`, ", ""), "Thresholds"),
        (lambda t: t.replace("- **Dashboards**: *GPUs* (`trainguard-gpus`).\n", "", 1), "parts"),
        (
            lambda t: t.replace("- **Fix**: for hardware Xids", "- **Remedy**: for hardware Xids"),
            "parts",
        ),
    ],
    ids=["order", "alert", "actions", "thresholds", "dashboards", "alert-parts"],
)
def test_the_runbook_check_names_what_disagrees(spoil: Any, complaint: str) -> None:
    text = runbook.packaged_text()
    spoiled = spoil(text)
    assert spoiled != text
    problems = runbook.check(spoiled)
    assert problems and any(complaint in p for p in problems), problems


def test_the_runbook_explains_the_remediation_services_page() -> None:
    """The page the service posts (no rule makes it) has its own section after the failures,
    in the five parts, naming the labels it carries."""
    text = (ALERTS / "runbook.md").read_text()
    _, service = failure_outline(text)
    assert service[1:] == [(2, contract.REMEDIATION_FAILED_ALERT)], service
    body = runbook_sections(text)[anchor_of(contract.REMEDIATION_FAILED_ALERT)]
    parts = re.findall(r"^- \*\*(.+?)\*\*:", body, flags=re.M)
    assert tuple(parts) == runbook.ALERT_PARTS
    for label in (contract.LABEL_INCIDENT, contract.LABEL_RUNG, contract.LABEL_FAILURE):
        assert f"`{label}`" in body, label


def test_each_failure_renders_its_own_alerts_from_the_module_named_after_it() -> None:
    """Every alert's rules come from one module, named after the failure that owns it."""
    t = thresholds.load_default()
    rendered: list[Alert] = []
    for spec, registered in contract.FAILURES.implementations(ALERT_RULES):
        assert registered.__module__ == f"trainguard.alerts.{spec.failure.value}"
        found = rules.rules_of(spec, t)
        assert [rule.alert for rule in found] == sorted(
            (rule.alert for rule in found), key=spec.alerts.index
        )
        rendered += dict.fromkeys(rule.alert for rule in found)
    assert rendered == contract.FAILURES.alerts()
    assert sorted(rendered) == sorted(Alert)


def test_rules_of_refuses_a_module_that_renders_another_failures_alert() -> None:
    spec = contract.FAILURES[contract.Failure.NCCL_ERROR]
    stray = dataclasses.replace(spec, alerts=(Alert.GPU_NVML_DOWN,))
    with pytest.raises(rules.RulesError, match="NcclSocketTransportFallback"):
        rules.rules_of(stray, thresholds.load_default())


def test_recording_rules_follow_level_metric_operation() -> None:
    recorded = [r["record"] for r in load_rules() if "record" in r]
    assert set(recorded) == recording_names()
    assert len(recorded) == len(set(recorded))
    for name in recorded:
        level, metric, operation = name.split(":")
        assert re.fullmatch(r"[a-z_]+", level), name
        assert metric.startswith(contract.PREFIX), name
        assert re.fullmatch(r"[a-z0-9_]+", operation), name


def test_rules_name_only_contract_metrics() -> None:
    allowed = exposed_names() | recording_names() | PROMETHEUS_SERIES
    for rule in load_rules():
        unknown = metric_names(rule["expr"]) - allowed
        assert not unknown, (rule.get("record") or rule.get("alert"), unknown)


def test_rule_tests_cover_firing_and_silence_for_every_alert() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../../trainguard/alerts/trainguard.rules.yml"], path
        # The groups run as Prometheus lays them out: recording rules before the alerts that
        # read them (promtool's order is otherwise unspecified).
        assert document["group_eval_order"] == [
            g["name"] for g in rules.groups(thresholds.load_default())
        ], path
        for group in document["tests"]:
            for case in group.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
                for alert in case.get("exp_alerts") or []:
                    assert set(alert["exp_annotations"]) == {
                        "summary",
                        "description",
                        "runbook_url",
                    }, path
    assert fires == {a.value for a in Alert}
    assert silent == {a.value for a in Alert}


def test_promtool_check_rules() -> None:
    result = run(binary("promtool"), "check", "rules", RULES_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rule_tests_pass() -> None:
    result = run(binary("promtool"), "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_rule_tests_catch_a_too_eager_straggler_factor(tmp_path: Path) -> None:
    """The jitter case must fail when the factor drops inside normal +-10% noise."""
    promtool = binary("promtool")
    eager = thresholds_data() | {"straggler_factor": 1.05}
    rules_dir = tmp_path / "trainguard" / "alerts"
    rules_dir.mkdir(parents=True)
    (rules_dir / "trainguard.rules.yml").write_text(
        rules.render(thresholds.Thresholds.from_mapping(eager))
    )
    tests_dir = tmp_path / "tests" / "alerts"
    tests_dir.mkdir(parents=True)
    straggler = REPO / "tests" / "alerts" / "straggler.test.yml"
    (tests_dir / straggler.name).write_text(straggler.read_text())
    result = run(promtool, "test", "rules", tests_dir / straggler.name)
    assert result.returncode != 0
    assert 'job_id="jit"' in result.stdout + result.stderr


def test_cli_subcommand_is_registered() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["rules", "--check"])
    assert isinstance(args, argparse.Namespace)
    assert args.check is True
