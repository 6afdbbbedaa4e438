"""A failure kind added through the registry alone reaches every component that dispatches
through the catalogue: the rendered rules (checked by the real promtool), triage's detectors,
diagnose's analyses, the demo's fault kinds and the runbook check.

The toy failure is not a member of ``contract.Failure`` (an enum cannot grow at run time): it is
a value of its own enum, registered the way a module named after a failure registers (the
roles' ``register``) into a catalogue that is the shipped one plus the toy's entry. Nothing
else is edited, so whatever the toy reaches, the code reached through the catalogue.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, cast

import pytest
import yaml

from tests.alerts.tools import binary, run
from trainguard import contract
from trainguard.alerts import rules, runbook
from trainguard.alerts.rule import (
    ALERT_RULES,
    RECORDING_RULES,
    AlertRule,
    Recorded,
    RecordingGroup,
)
from trainguard.contract import FAILURES, Action, Alert, Failure, FailureSpec, Severity
from trainguard.demo.faults import FAULT_KINDS, FaultKind, fault_kinds
from trainguard.diagnose.analysis import ANALYSES, Analysis
from trainguard.diagnose.analysis import run as run_analyses
from trainguard.diagnose.context import Context
from trainguard.diagnose.model import Report, Scope, ScopeLevel, Symptom
from trainguard.diagnose.signals import Signals
from trainguard.thresholds import Thresholds, load_default
from trainguard.triage.detectors import DETECTORS, Source, default_detectors
from trainguard.triage.findings import Finding, Location
from trainguard.triage.scanner import Scanner


class _ToyFailure(str, enum.Enum):
    TOY = "toy_failure"


class _ToyAlert(str, enum.Enum):
    TOY = "TrainingToyFailure"


TOY = cast(Failure, _ToyFailure.TOY)
TOY_ALERT = cast(Alert, _ToyAlert.TOY)
TOY_RECORD = "job:trainguard_steps:toy_ratio5m"
SPEC = FailureSpec(
    TOY,
    "A toy failure that only this test knows.",
    alerts=(TOY_ALERT,),
    signals=(contract.STEPS,),
    actions=(Action.RECOMMEND,),
    dashboards=("trainguard-overview",),
)
CATALOGUE = FAILURES.with_failure(SPEC)


def toy_rules(t: Thresholds) -> list[AlertRule]:
    return [
        AlertRule(
            alert=TOY_ALERT,
            severity=Severity.WARNING,
            expr=f"{TOY_RECORD} > 2",
            summary="Toy failure in job {{ $labels.job_id }}",
            description="The toy ratio of job {{ $labels.job_id }} is {{ $value }}.",
            for_=t.straggler_for,
        )
    ]


def toy_recording(t: Thresholds) -> list[Recorded]:
    return [
        Recorded(
            RecordingGroup.JOBS,
            TOY_RECORD,
            f"max by (job_id) ({contract.REC_RANK_STEPS_RATE})\n"
            f"/ on (job_id) {contract.REC_JOB_STEPS_RATE}",
        )
    ]


class ToyDetector:
    """Finds ``TOY FAILURE`` lines."""

    failure: ClassVar[Failure] = TOY
    keywords: tuple[str, ...] = ("TOY FAILURE",)
    needles = keywords

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> ToyDetector:
        return cls()

    def __init__(self) -> None:
        self.dropped = 0
        self._seen: list[Location] = []

    def feed(self, line: str, where: Location, source: Source) -> bool:
        if "TOY FAILURE" in line:
            self._seen.append(where)
        return False

    def findings(self) -> list[Finding]:
        return [Finding(TOY, "a toy failure", where, "none") for where in self._seen[:1]]


def toy_analyse(ctx: Context) -> None:
    ctx.symptom(
        Symptom(TOY, "the toy failure was analysed", [TOY_RECORD], None, [], [], 3),
        Scope(ScopeLevel.JOB, "the whole toy job"),
    )


TOY_FAULT = FaultKind("toy_fault", TOY, "does nothing", (TOY_ALERT,))


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    """The toy's module, as it would register itself; forgotten after the test."""
    ALERT_RULES.register(TOY)(toy_rules)
    RECORDING_RULES.register(TOY)(toy_recording)
    DETECTORS.register(TOY)(ToyDetector)
    ANALYSES.register(TOY)(Analysis(toy_analyse))
    FAULT_KINDS.register(TOY)((TOY_FAULT,))
    yield
    for role in (ALERT_RULES, RECORDING_RULES, DETECTORS, ANALYSES, FAULT_KINDS):
        role.unregister(TOY)


def test_the_toy_is_in_the_rendered_rules_and_promtool_accepts_them(tmp_path: Path) -> None:
    t = load_default()
    text = rules.render(t, CATALOGUE)
    groups = {g["name"]: g["rules"] for g in yaml.safe_load(text)["groups"]}
    (toy,) = groups["trainguard-alerts-toy_failure"]
    assert toy["alert"] == TOY_ALERT.value
    assert toy["annotations"]["runbook_url"].endswith("#trainingtoyfailure")
    assert {"record": TOY_RECORD, "expr": toy_recording(t)[0].expr} in groups["trainguard-jobs"]
    # The shipped catalogue renders as before: the toy is the catalogue's, not a global's.
    assert "toy" not in rules.render(t)
    path = tmp_path / "toy.rules.yml"
    path.write_text(text)
    checked = run(binary("promtool"), "check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_triage_builds_the_toys_detector_and_reports_its_finding(tmp_path: Path) -> None:
    detectors = default_detectors(load_default(), catalogue=CATALOGUE)
    assert isinstance(detectors[-1], ToyDetector)
    log = tmp_path / "job.log"
    log.write_text("step 1 ok\n[rank3]: TOY FAILURE here\n")
    scanner = Scanner(detectors)
    scanner.scan_paths([str(log)])
    assert [f.failure for f in scanner.findings()] == [TOY]
    assert not any(isinstance(d, ToyDetector) for d in default_detectors(load_default()))


def test_diagnose_runs_the_toys_analysis_in_catalogue_order() -> None:
    report = Report("toy-job", 0.0, 60.0, 60.0, "http://prometheus")
    run_analyses(
        Signals("toy-job", 0.0, 60.0, 15.0), None, [], report, load_default(), [], CATALOGUE
    )
    assert [s.failure for s in report.symptoms] == [TOY]
    assert report.scope.explanation == "the whole toy job"


def test_the_demo_draws_the_toys_fault_kind() -> None:
    assert fault_kinds(CATALOGUE)[-1] is TOY_FAULT
    assert TOY_FAULT not in fault_kinds()


def test_the_runbook_check_asks_for_the_toys_section_and_accepts_it_once_written() -> None:
    text = runbook.packaged_text()
    assert runbook.check(text) == []
    missing = runbook.check(text, CATALOGUE)
    assert missing and any("toy_failure" in problem for problem in missing)
    failures_end = text.index("\n# When remediation gives up")
    section = (
        "\n## toy_failure\n\n"
        f"*{SPEC.summary}*\n\n"
        "- **Alerts**: [TrainingToyFailure](#trainingtoyfailure).\n"
        "- **Signals**: `trainguard_steps_total`.\n"
        "- **Thresholds**: none.\n"
        "- **Dashboards**: *Training overview* (`trainguard-overview`).\n"
        "- **Default actions**: `recommend`.\n"
        "- **Triage**: the toy's detector.\n"
        "- **Diagnose**: the toy's analysis.\n\n"
        "### TrainingToyFailure\n\n"
        "- **Symptom**: a toy.\n- **Scope**: the job.\n- **Root cause**: none.\n"
        "- **Fix**: none.\n- **Prevention**: none.\n"
    )
    written = text[:failures_end] + section + text[failures_end:]
    assert runbook.check(written, CATALOGUE) == []
