"""A rank that died and torchrun restarted the worker group: the restart count in a real
Prometheus (see synthetic.py), the torchrun agents' output and the ranks' ECS lines.

The agents' lines in ``logs/`` are copied from the fault matrix's runs (a rank SIGKILLed, a
rank whose process group raised; two earlier, failed starts of the first run share its file);
the ranks' ECS lines are the hook's ``instrumented`` event with each worker's pid.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

from tests.diagnose import synthetic
from tests.diagnose.conftest import History
from trainguard.contract import Failure
from trainguard.diagnose import Report, ScopeLevel, diagnose
from trainguard.diagnose.render import as_json, markdown
from trainguard.thresholds import load_default
from trainguard.triage import Scanner
from trainguard.triage.detectors import default_detectors

LOGS = Path(__file__).parent / "logs"
AGENT = "torch/distributed/elastic/multiprocessing/api.py:1002]"
BINARY = "of binary: /work/main/.venv/bin/python"


def advised(report: Report) -> Report:
    """The report, once every candidate it holds says what to do now and what prevents it."""
    assert all(c.do_now and c.prevention for c in report.candidates), report.candidates
    return report


def run(history: History, job_id: str, logs: Path) -> Report:
    return advised(
        diagnose(
            history.url, job_id, until=history.now, thresholds=synthetic.SHIPPED, logs=[str(logs)]
        )
    )


def copy(job_id: str, tmp_path: Path, to_job: str | None = None) -> Path:
    """The job's logs in ``tmp_path``, its ECS lines relabelled to ``to_job``."""
    out = tmp_path / job_id
    shutil.copytree(LOGS / job_id, out)
    if to_job is not None:
        for path in out.glob("*.ndjson"):
            path.write_text(path.read_text().replace(f'"{job_id}"', f'"{to_job}"'))
    return out


def agent_line(stamp: str, agent: int, code: int, local: int, pid: int) -> str:
    return (
        f"E1205 {stamp} {agent} {AGENT} failed (exitcode: {code}) local_rank: {local} "
        f"(pid: {pid}) {BINARY}\n"
    )


def append(path: Path, text: str) -> None:
    with path.open("a") as stream:
        stream.write(text)


def test_triage_keeps_every_failed_worker_of_an_agent_with_its_time() -> None:
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths([str(LOGS / synthetic.RANK_KILL / "agent-rank-kill-node-b.log")])
    (finding,) = scanner.findings()
    failed = finding.fields["agent_failures"]
    assert [(f["pid"], f["exitcode"], f["time"]) for f in failed] == [
        (26585, 1, "12-05 11:28:23.386000"),
        (27002, 1, "12-05 11:29:22.846000"),
        (27632, -9, "12-05 11:30:19.070000"),
    ]
    assert failed[-1]["signal"] == "SIGKILL" and failed[-1]["local_rank"] == 0
    # The first observed failure of the file stays the finding's root cause.
    assert finding.fields["root_cause"]["pid"] == 26585


def test_the_killed_rank_is_named(history: History) -> None:
    report = run(history, synthetic.RANK_KILL, LOGS / synthetic.RANK_KILL)
    assert report.failure is Failure.RANK_FAILURE
    first = report.symptoms[0]
    assert first.ranks == [2] and first.severity == 3
    assert report.scope.level is ScopeLevel.RANK and report.scope.ranks == [2]
    restart = history.now - 3600 + synthetic.RESTART_AT * synthetic.INTERVAL
    assert first.since is not None and abs(first.since - restart) <= 30
    top = report.candidates[0]
    assert top.cause == "rank_killed"
    assert (top.facts["pid"], top.facts["signal"]) == (27632, "SIGKILL")
    assert top.facts["failed_at"] == "12-05 11:30:19.070000"
    # The earlier starts' workers (exit 1, pids of no rank of this job) are left out, named.
    assert any("2 other failed worker(s)" in e for e in top.evidence)
    assert "rank 2 died first (SIGKILL (exit code -9))" in markdown(report)
    (rendered, *_) = json.loads(as_json(report))["symptoms"]
    assert (rendered["failure"], rendered["ranks"]) == ("rank_failure", [2])


def test_a_signal_outranks_an_error_stamped_earlier(history: History, tmp_path: Path) -> None:
    """Rank 1 (node-a) exits 1 once rank 2 is gone; its agent's clock runs 20 ms ahead."""
    logs = copy(synthetic.RANK_KILL, tmp_path)
    append(logs / "agent-rank-kill-node-a.log", agent_line("11:30:19.050000", 27595, 1, 1, 27635))
    report = run(history, synthetic.RANK_KILL, logs)
    assert report.failure is Failure.RANK_FAILURE and report.symptoms[0].ranks == [2]
    top = report.candidates[0]
    assert top.cause == "rank_killed"
    assert any(e.startswith("then: ") and "rank 1 (pid 27635)" in e for e in top.evidence)


def test_the_pg_error_rank_is_named_over_its_peers_later_failures(
    history: History, tmp_path: Path
) -> None:
    logs = copy(synthetic.RANK_PG_ERROR, tmp_path)
    # Rank 1 on node-a fails on its closed connection 480 ms after rank 2's error.
    append(logs / "agent-rank-pgerr-node-a.log", agent_line("11:34:02.390000", 29302, 1, 1, 29328))
    report = run(history, synthetic.RANK_PG_ERROR, logs)
    assert report.failure is Failure.RANK_FAILURE
    assert report.symptoms[0].ranks == [2] and report.scope.ranks == [2]
    top = report.candidates[0]
    assert top.cause == "rank_error" and top.facts["pid"] == 29325
    assert any(e.startswith("then: ") and "rank 1 (pid 29328)" in e for e in top.evidence)


def test_without_the_restart_count_the_logs_alone_name_the_rank(
    history: History, tmp_path: Path
) -> None:
    logs = copy(synthetic.RANK_PG_ERROR, tmp_path, to_job=synthetic.RANK_OLD_HOOK)
    report = run(history, synthetic.RANK_OLD_HOOK, logs)
    assert report.failure is Failure.RANK_FAILURE
    assert report.symptoms[0].ranks == [2] and report.symptoms[0].since is None


def test_a_pid_two_ranks_logged_as_names_no_rank(history: History, tmp_path: Path) -> None:
    """Rank 0 on node-a had the same pid as rank 2 on node-b, and the same local rank."""
    logs = copy(synthetic.RANK_PG_ERROR, tmp_path)
    rank2 = (logs / "rank2.ndjson").read_text().splitlines()[0]
    append(logs / "rank0.ndjson", rank2.replace('"rank":"2"', '"rank":"0"') + "\n")
    report = run(history, synthetic.RANK_PG_ERROR, logs)
    assert report.failure is Failure.RANK_FAILURE
    assert report.symptoms[0].ranks == [] and report.scope.level is ScopeLevel.JOB
    assert any("logged as several ranks" in e for e in report.candidates[0].evidence)


def test_workers_stopped_from_outside_are_no_failed_rank(history: History, tmp_path: Path) -> None:
    """A repair's restart: every worker SIGTERMed (exit -15)."""
    logs = tmp_path / "terminated"
    shutil.copytree(LOGS / synthetic.RANK_KILL, logs, ignore=shutil.ignore_patterns("*.log"))
    (logs / "agent-node-a.log").write_text(agent_line("11:30:19.100000", 27595, -15, 0, 27633))
    (logs / "agent-node-b.log").write_text(agent_line("11:30:19.090000", 27614, -15, 0, 27632))
    report = run(history, synthetic.RANK_KILL, logs)
    (symptom,) = report.symptoms
    assert symptom.failure is Failure.RANK_FAILURE
    assert symptom.severity == 1 and symptom.ranks == []
    assert report.candidates[0].cause == "workers_terminated"


def test_a_healthy_job_has_no_rank_failure_given_other_jobs_failures(history: History) -> None:
    report = run(history, synthetic.HEALTHY, LOGS / synthetic.RANK_KILL)
    assert report.symptoms == [] and report.candidates == []
    assert any("none of this job's processes" in n for n in report.notes)


def test_a_node_excluded_on_purpose_is_no_rank_failure(history: History) -> None:
    """The survivors of an exclusion restart too (their peers are gone), but the job re-formed
    smaller: the straggler that caused the exclusion is the report's failure."""
    report = advised(
        diagnose(history.url, synthetic.EXCLUDED, until=history.now, thresholds=synthetic.SHIPPED)
    )
    assert report.failure is Failure.STRAGGLER and report.symptoms[0].ranks == [2]
    (left,) = [s for s in report.symptoms if s.failure is Failure.RANK_FAILURE]
    assert left.severity == 1 and left.ranks == []
    assert "re-formed at world size 2 (from 4)" in left.summary
    assert not any(c.cause in ("rank_killed", "rank_error") for c in report.candidates)


def test_a_restart_right_after_a_repair_is_the_repair_s(history: History) -> None:
    """The remediation service restarted the job (its incident says when): the restart is
    reported, and no rank is blamed for it."""
    restart = history.now - 3600 + synthetic.RESTART_AT * synthetic.INTERVAL
    doc = json.loads((Path(__file__).parent / "incidents" / "recovered.json").read_text())
    incident = doc["incidents"][0]
    acted = datetime.fromtimestamp(restart - 20, timezone.utc).isoformat()
    incident.update(job_id=synthetic.RANK_KILL, acted_at=acted)
    incident["tried"][0]["at"] = acted
    report = advised(
        diagnose(
            history.url,
            synthetic.RANK_KILL,
            until=history.now,
            thresholds=synthetic.SHIPPED,
            logs=[str(LOGS / synthetic.RANK_KILL)],
            incidents=[incident],
        )
    )
    (restarted,) = [s for s in report.symptoms if s.failure is Failure.RANK_FAILURE]
    assert restarted.severity == 1 and restarted.ranks == []
    assert "after the remediation service's restart_from_checkpoint" in restarted.summary
    assert not any(c.cause == "rank_killed" for c in report.candidates)


def test_a_rank_that_dies_mid_collective_is_the_cause_and_its_peers_stall_the_consequence(
    history: History, tmp_path: Path
) -> None:
    """Rank 2's process group fails in the gradient sync and the process aborts (SIGABRT, as
    gloo's teardown can); its peers wait in the collective for it past the stall threshold
    until torchrun restarts the group. Restarted, rank 2 waits 45 s for its peers to start:
    no part of the job as it was when it died."""
    logs = copy(synthetic.RANK_PG_ERROR, tmp_path, to_job=synthetic.RANK_DEATH_STALL)
    agent = logs / "agent-rank-pgerr-node-b.log"
    agent.write_text(
        agent.read_text().replace("(exitcode: 1) local_rank: 0", "(exitcode: -6) local_rank: 0")
    )
    report = run(history, synthetic.RANK_DEATH_STALL, logs)
    assert report.failure is Failure.RANK_FAILURE
    first = report.symptoms[0]
    assert (first.failure, first.ranks, first.severity) == (Failure.RANK_FAILURE, [2], 3)
    assert "rank 2 died first (SIGABRT" in first.summary
    (hang,) = [s for s in report.symptoms if s.failure is Failure.HANG]
    assert hang.severity == 2
    assert "the consequence of rank 2's death" in hang.summary
    death = history.now - 3600 + synthetic.DEATH_AT * synthetic.INTERVAL
    assert hang.since is not None and abs(hang.since - death) <= synthetic.INTERVAL
    top = report.candidates[0]
    assert (top.cause, top.facts["pid"], top.facts["signal"]) == ("rank_killed", 29325, "SIGABRT")
    never_joined = [c for c in report.candidates if c.cause == "rank_never_joined"]
    assert all(c.confidence < top.confidence for c in never_joined)
    assert report.scope.ranks == [2]
