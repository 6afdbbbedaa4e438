"""The closed loop, end to end on the real Prometheus and Alertmanager: a fault on a fake job
is alerted on by the project's rules, routed by Alertmanager to the service, repaired through
the ranks or the scheduler, and verified; a repair that does not work climbs its ladder and
pages a human through Alertmanager; a node taken out of its job raises no rank-down alert.

The harness (:mod:`tests.remediation.loop_harness`) runs every part but the job as a process;
one stack serves the module, each test its own job.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.remediation.loop_harness import LOOP_THRESHOLDS, LoopStack, Received, wait_for
from trainguard import contract
from trainguard.contract import Action, Alert, Failure, IncidentOutcome, JobOutcome
from trainguard.thresholds import duration_seconds

pytestmark = pytest.mark.e2e

# Job ids unique to this run: the local executor acts on every process of a job on the host,
# and another run of these tests may share the host.
RUN = secrets.token_hex(3)
RECOVERS = f"loop-recovers-{RUN}"
ESCALATES = f"loop-escalates-{RUN}"
MEMBERS = f"loop-members-{RUN}"
NODES = ("node-a", "node-b")
# A rung that cannot work is given this long before the next one is tried.
SHORT_VERIFY_SECONDS = 8.0
# Long enough for a repair that works: it is judged recovered once a scrape after it counts no
# new OOM, well before the alert resolves (one OOM window after the last OOM).
VERIFY_SECONDS = 60.0
R = contract.LABEL_RANK
RANK_DOWN_FOR = duration_seconds(LOOP_THRESHOLDS["rank_down_for"])
RANK_ABSENT_WINDOW = duration_seconds(LOOP_THRESHOLDS["rank_absent_window"])
OOM_WINDOW = duration_seconds(LOOP_THRESHOLDS["oom_window"])


def _only(job_id: str) -> list[str]:
    return [f'{contract.LABEL_JOB_ID}="{job_id}"']


POLICY: dict[str, Any] = {
    "version": 1,
    "rules": [
        {
            "alert": Alert.TRAINING_OOM.value,
            "matchers": _only(RECOVERS),
            "actions": [{"action": Action.SPLIT_MICRO_BATCHES.value, "params": {"factor": 2}}],
            "verify_seconds": VERIFY_SECONDS,
            "escalate": [{"action": Action.PAGE.value}],
        },
        {
            "alert": Alert.TRAINING_OOM.value,
            "matchers": _only(ESCALATES),
            "actions": [{"action": Action.SPLIT_MICRO_BATCHES.value, "params": {"factor": 2}}],
            "verify_seconds": SHORT_VERIFY_SECONDS,
            "escalate": [
                {
                    "action": Action.DUMP_DIAGNOSTICS.value,
                    "verify_seconds": SHORT_VERIFY_SECONDS,
                },
                {"action": Action.PAGE.value, "verify_seconds": SHORT_VERIFY_SECONDS},
            ],
        },
        {
            "alert": Alert.TRAINING_STRAGGLER.value,
            "matchers": [f'{contract.LABEL_JOB_ID}=~"{MEMBERS}-.+"'],
            "actions": [{"action": Action.EXCLUDE_NODE.value}],
            "verify_seconds": VERIFY_SECONDS,
        },
        {
            "alert": Alert.TRAINING_RANK_DOWN.value,
            "matchers": [f'{contract.LABEL_JOB_ID}=~"{MEMBERS}-.+"'],
            # A repair (advice alone opens no incident): save the survivors' state.
            "actions": [{"action": Action.CHECKPOINT_NOW.value}],
            "verify_seconds": VERIFY_SECONDS,
        },
    ],
}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopStack]:
    with LoopStack(tmp_path_factory.mktemp("loop"), POLICY) as running:
        yield running


@pytest.fixture
def stack(services: LoopStack) -> Iterator[LoopStack]:
    """The module's services; the test's job and agents end with the test."""
    yield services
    services.finish()


def _in_order(incident: dict[str, Any], *fields: str) -> None:
    times = [(name, incident[name]) for name in fields]
    assert all(value is not None for _, value in times), times
    parsed = [datetime.fromisoformat(value) for _, value in times]
    assert parsed == sorted(parsed), times


def _kinds(received: list[Received]) -> list[Action]:
    """The directive kinds the ranks carried out, each once, in the order they first came."""
    kinds: list[Action] = []
    for each in received:
        if each.directive.kind not in kinds:
            kinds.append(each.directive.kind)
    return kinds


def test_a_repair_that_works_is_verified_as_recovered(stack: LoopStack) -> None:
    """Rank 0 runs out of memory at every step; the split directive the service sends ends it.
    The ranks carry it out, training steps on, the alert resolves: recovered on rung 0."""
    job = stack.job(RECOVERS, NODES[:1], 2)
    wait_for("the job's step in Prometheus", lambda: stack.job_step(RECOVERS), 30)
    job.oom(0, cured_by=[Action.SPLIT_MICRO_BATCHES])
    stuck_at = job.current_step()

    incident = stack.closed_incident(RECOVERS, timeout=90)

    assert incident["outcome"] == IncidentOutcome.RECOVERED.value, incident
    assert incident["job_outcome"] == JobOutcome.RESUMED.value, incident
    assert incident["failure"] == Failure.OOM.value
    assert incident["alert"]["name"] == Alert.TRAINING_OOM.value
    assert incident["alert"]["labels"][contract.LABEL_RANK] == "0"
    assert incident["rung"] == 0
    assert incident["rung_action"] == Action.SPLIT_MICRO_BATCHES.value
    assert incident["paged"] is False
    assert incident["baseline_step"] == stuck_at
    _in_order(
        incident,
        "first_evidence_at",
        "detected_at",
        "received_at",
        "acted_at",
        "recovered_at",
        "closed_at",
    )
    (tried,) = incident["tried"]
    assert (tried["rung"], tried["action"]) == (0, Action.SPLIT_MICRO_BATCHES.value), tried
    assert tried["verdict"], tried
    # Every rank carried the split out, and training went past the step it was stuck at.
    assert {r.rank for r in job.directives()} == {0, 1}
    assert _kinds(job.directives()) == [Action.SPLIT_MICRO_BATCHES]
    assert job.current_step() > stuck_at
    # No OOM after the repair: the alert resolves once its window no longer holds the last one.
    ooms = job.rank(0).oom_events
    wait_for(
        "TrainingOOM resolved",
        lambda: not stack.firing(Alert.TRAINING_OOM, job_id=RECOVERS),
        OOM_WINDOW + 30,
    )
    assert job.rank(0).oom_events == ooms
    assert stack.incident(incident["id"]) == incident
    recovered = stack.incidents(state="closed", outcome=IncidentOutcome.RECOVERED.value)
    assert incident["id"] in {i["id"] for i in recovered}
    assert not [
        a for a in stack.pager.alerts() if a["labels"].get(contract.LABEL_JOB_ID) == RECOVERS
    ]


def test_a_repair_that_does_not_work_climbs_the_ladder_and_pages(stack: LoopStack) -> None:
    """Rank 1 runs out of memory whatever the ranks are told: split (rung 0) and dump (rung 1)
    are carried out and verified in vain, and the page (rung 2) reaches the pager through
    Alertmanager; the incident closes unrecovered."""
    job = stack.job(ESCALATES, NODES[:1], 2)
    wait_for("the job's step in Prometheus", lambda: stack.job_step(ESCALATES), 30)
    job.oom(1)  # no directive cures it

    def paged() -> list[dict[str, Any]]:
        return [
            alert
            for alert in stack.pager.alerts()
            if alert["labels"].get(contract.LABEL_JOB_ID) == ESCALATES
            and alert["status"] == "firing"
        ]

    (page, *_) = stack.wait_for(ESCALATES, "the page delivered by Alertmanager", paged, 90)
    incident = stack.closed_incident(ESCALATES, timeout=60)

    labels = page["labels"]
    assert labels["alertname"] == contract.REMEDIATION_FAILED_ALERT
    assert labels[contract.LABEL_SEVERITY] == contract.Severity.CRITICAL.value
    assert labels[contract.LABEL_INCIDENT] == str(incident["id"])
    assert labels[contract.LABEL_FAILURE] == Failure.OOM.value
    # The rung that failed last: the one before the page.
    assert labels[contract.LABEL_RUNG] == "1"
    assert incident["outcome"] in (IncidentOutcome.NOT_RECOVERED.value, IncidentOutcome.WORSE.value)
    assert incident["job_outcome"] == JobOutcome.LOST.value
    assert incident["paged"] is True
    assert incident["rung"] == 2
    assert incident["rung_action"] == Action.PAGE.value
    assert incident["recovered_at"] is None
    tried = [(t["rung"], t["action"]) for t in incident["tried"]]
    assert tried == [
        (0, Action.SPLIT_MICRO_BATCHES.value),
        (1, Action.DUMP_DIAGNOSTICS.value),
        (2, Action.PAGE.value),
    ], incident["tried"]
    # The rungs that did not recover it say so.
    assert all(t["verdict"] for t in incident["tried"][:2]), incident["tried"]
    _in_order(incident, "detected_at", "acted_at", "closed_at")
    # The ranks carried out both directives, in the ladder's order, and stayed out of memory.
    assert _kinds(job.directives()) == [Action.SPLIT_MICRO_BATCHES, Action.DUMP_DIAGNOSTICS]
    assert stack.firing(Alert.TRAINING_OOM, job_id=ESCALATES)


@pytest.mark.parametrize("departure", ["withdrawn", "left_behind"])
def test_an_excluded_node_raises_no_rank_down(stack: LoopStack, departure: str) -> None:
    """A straggler's node is excluded through the local executor; its ranks die, either with
    their targets withdrawn or with the targets left behind (a killed rank's file_sd file stays,
    and Prometheus keeps scraping it down). Neither raises TrainingRankDown, over the rule's
    ``for`` and past the window a vanished rank is remembered for; a member that dies does."""
    job_id = f"{MEMBERS}-{departure.replace('_', '-')}"
    job = stack.job(job_id, NODES, 2)
    agent = stack.agent(job_id, NODES[1], 2)
    wait_for("the job's step in Prometheus", lambda: stack.job_step(job_id), 30)
    job.straggle(2, 3.0)

    stack.wait_for(job_id, "node-b's agent terminated", lambda: not agent.alive(), timeout=90)
    job.leave(NODES[1], withdrawn=departure == "withdrawn")
    left_at = time.monotonic()
    (exclude,) = [
        a
        for a in stack.actions()
        if a["action"] == Action.EXCLUDE_NODE.value
        and a["alert"]["labels"].get(contract.LABEL_JOB_ID) == job_id
    ]
    assert exclude["state"] == "succeeded", exclude
    assert exclude["alert"]["labels"][contract.LABEL_NODE] == NODES[1]

    # Watch past the rule's `for` and past the window a vanished rank is remembered for.
    observe = RANK_ABSENT_WINDOW + 2 * RANK_DOWN_FOR + 5
    time.sleep(max(0.0, observe - (time.monotonic() - left_at)))
    watched = time.monotonic() - left_at
    fired = stack.firing(
        Alert.TRAINING_RANK_DOWN, over_seconds=watched, job_id=job_id, node=NODES[1]
    )
    assert fired == [], fired

    # The control: a member dying raises it, and the service acts on it.
    job.kill(1)
    down = wait_for(
        "TrainingRankDown of rank 1",
        lambda: stack.firing(Alert.TRAINING_RANK_DOWN, job_id=job_id, rank="1"),
        timeout=60,
    )
    assert [(a[contract.LABEL_NODE], a[R]) for a in down] == [(NODES[0], "1")]

    def rank_down_incidents() -> list[dict[str, Any]]:
        return [
            i
            for i in stack.incidents(job_id=job_id)
            if i["alert"]["name"] == Alert.TRAINING_RANK_DOWN.value
        ]

    opened = stack.wait_for(job_id, "the rank-down incident", rank_down_incidents, timeout=30)
    where = [(i["alert"]["labels"][contract.LABEL_NODE], i["alert"]["labels"][R]) for i in opened]
    assert where == [(NODES[0], "1")], opened
    (incident,) = opened
    assert incident["tried"][0]["action"] == Action.CHECKPOINT_NOW.value
    # The service did nothing about node-b's ranks, even where a member's death had the rule
    # call them down too (their indexes forgotten): any action naming them was skipped.
    for action in stack.actions():
        labels = action["alert"]["labels"]
        if (
            action["alert"]["name"] == Alert.TRAINING_RANK_DOWN.value
            and labels.get(contract.LABEL_JOB_ID) == job_id
            and labels.get(contract.LABEL_NODE) == NODES[1]
        ):
            assert action["state"] == "skipped", action
    # The exclusion repaired the straggler: its alert resolved and training went on.
    straggler = wait_for(
        "the straggler's incident closed",
        lambda: [
            i
            for i in stack.incidents(job_id=job_id)
            if i["alert"]["name"] == Alert.TRAINING_STRAGGLER.value and i["state"] == "closed"
        ],
        timeout=30,
    )
    assert [(i["state"], i["outcome"]) for i in straggler] == [
        ("closed", IncidentOutcome.RECOVERED.value)
    ], straggler
