"""The nccl_timeout detector on each wording ProcessGroupNCCL has printed, release by release.

The corpus (``corpus/nccl_timeout``) holds what users posted; some wordings are in no excerpt
found (torch 1.8's TensorShape, the 2.2 monitor thread, the desync report, the 2026 WorkNCCL
prefix). These lines are assembled from the format strings of the source cited beside each test
(``corpus/nccl_timeout/SOURCES.md`` lists them), with made-up values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.contract import Failure
from trainguard.thresholds import load_default
from trainguard.triage import corpus
from trainguard.triage.detectors.nccl_timeout import NcclTimeoutDetector


def _timeouts(tmp_path: Path, *lines: str) -> list[dict[str, Any]]:
    log = tmp_path / "x.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [
        f for f in corpus.triage(log, load_default()) if f["failure"] == Failure.NCCL_TIMEOUT.value
    ]


def test_torch18_report_with_tensor_shape_and_no_seqnum(tmp_path: Path) -> None:
    # torch/lib/c10d/ProcessGroupNCCL.cpp @00f5dfd5: operator<< and abortTimedOutCollectives.
    (found,) = _timeouts(
        tmp_path,
        "[E ProcessGroupNCCL.cpp:566] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(OpType=ALLREDUCE, TensorShape=[1024, 3], Timeout(ms)=1800000) ran for 1800577 "
        "milliseconds before timing out.",
    )
    fields = found["fields"]
    assert fields["op_type"] == "ALLREDUCE" and "seq_num" not in fields
    assert fields["tensor_shape"] == "[1024, 3]" and fields["timeout_ms"] == 1800000
    assert fields["elapsed_ms"] == 1800577 and fields["ranks"] == [0]


def test_torch18_blocking_wait_wording(tmp_path: Path) -> None:
    # @00f5dfd5 WorkNCCL::synchronizeInternal: "Caught collective operation timeout: ...".
    (found,) = _timeouts(
        tmp_path,
        "RuntimeError: [Rank 1] Caught collective operation timeout: WorkNCCL(OpType=BROADCAST, "
        "Timeout(ms)=10000) ran for 10008 milliseconds before timing out.",
    )
    assert found["fields"]["op_type"] == "BROADCAST" and found["fields"]["ranks"] == [1]


def test_blocking_wait_line_counts_as_a_report_of_the_same_work(tmp_path: Path) -> None:
    # >= 2.1 WorkNCCL::synchronizeInternal: "[Rank N] Work WorkNCCL(...) timed out in blocking
    # wait (NCCL_BLOCKING_WAIT=1)." (pytorch/pytorch@0007e752).
    (found,) = _timeouts(
        tmp_path,
        "[rank3]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 3] Work "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=60000) timed "
        "out in blocking wait (NCCL_BLOCKING_WAIT=1).",
    )
    assert (found["fields"]["seq_num"], found["fields"]["ranks"]) == (9, [3])


def test_work_prefix_with_pg_guid(tmp_path: Path) -> None:
    # pytorch/pytorch#191440: WorkNCCL::logPrefix() becomes "[PG GUID <guid> Rank <rank>] ".
    (found,) = _timeouts(
        tmp_path,
        "[rank1]:[E729 10:00:00.000000001 ProcessGroupNCCL.cpp:757] [PG GUID 2 Rank 0] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=5000) ran for 5012 milliseconds before timing out.",
    )
    fields = found["fields"]
    assert fields["ranks"] == [1] and fields["process_groups"] == ["2"]
    assert fields["first_time"] == "0729 10:00:00.000000001"


def test_torch22_monitor_thread(tmp_path: Path) -> None:
    # pytorch/pytorch@0007e752 heartbeatMonitor (PR #112518): dump_debugging_info and exitMsg.
    (found,) = _timeouts(
        tmp_path,
        "[E ProcessGroupNCCL.cpp:1172] No PGNCCL's watchdog heartbeat detected, so we are "
        "dumping debug info.",
        "[F ProcessGroupNCCL.cpp:1180] [Rank 5] NCCL monitor thread timeout. Basically, this "
        "could be due to CUDA or NCCL calls being unexpectedly blocking, especially when your "
        "program enters a deadlock state in watchdogor destructors. If you see this error, "
        "please file a bug to pytorch.",
    )
    assert found["fields"]["evidence"] == "heartbeat" and found["fields"]["ranks"] == [5]


def test_heartbeat_is_folded_into_a_collective_timeout(tmp_path: Path) -> None:
    (found,) = _timeouts(
        tmp_path,
        "[rank0]:[E1019 01:04:03.3 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
        "[rank1]:[E1019 01:14:03.3 ProcessGroupNCCL.cpp:1413] [PG 0 Rank 1] Heartbeat monitor "
        "timed out! Process will be terminated after dumping debug info. workMetaList_.size()=3",
    )
    assert found["fields"]["seq_num"] == 7 and found["fields"]["watchdog_stuck_ranks"] == [1]


def test_desync_report_names_the_op_and_the_lagging_ranks(tmp_path: Path) -> None:
    # TraceUtils.h retrieveDesyncReport/analyzeMissingRanks, logged as one message after the
    # glog header (ProcessGroupNCCL.cpp: LOG(ERROR) << logPrefix() << desyncMsg).
    (found,) = _timeouts(
        tmp_path,
        "[rank0]:[E ProcessGroupNCCL.cpp:1300] [PG 0 Rank 0] ",
        "\t - [0] Timeout at collective: ALLREDUCE, #5",
        "\t - To our best knowledge, ranks [2, 3] are the lagging ranks that caused this "
        "timeout. They never joined any collectives",
        "[rank0]:[E ProcessGroupNCCL.cpp:500] [Rank 0] Some NCCL operations have failed or "
        "timed out.",
    )
    fields = found["fields"]
    assert (fields["op_type"], fields["seq_num"]) == ("ALLREDUCE", 5)
    assert fields["desync_lagging_ranks"] == [2, 3]
    assert "Rank(s) 2, 3" in found["advice"]


def test_desync_lagging_ranks_that_finished_the_previous_collective(tmp_path: Path) -> None:
    # TraceUtils.h analyzeLaggingRanks.
    (found,) = _timeouts(
        tmp_path,
        "[E ProcessGroupNCCL.cpp:1300] ",
        "\t - [1] Timeout at collective: BROADCAST, #12",
        "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
        "\t   - [0, 1] joined but didn't finish collective #12 (count from 1)",
        "\t     [3] finished collective #12, but didn't join collective #13 (count from 1)",
    )
    assert found["fields"]["desync_lagging_ranks"] == [3]
    assert found["fields"]["ranks"] == [1]


def test_failure_detected_beside_an_nccl_error_is_not_a_timeout(tmp_path: Path) -> None:
    # torch >= 2.6 logs "failure detected by watchdog" for NCCL errors as well.
    found = _timeouts(
        tmp_path,
        "[rank0]:[E1218 20:27:21.4 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0]  failure detected by watchdog at work sequence id: 7 PG status: last enqueued "
        "work: 7, last completed work: 6",
        "[rank0]:[E1218 20:27:21.5 ProcessGroupNCCL.cpp:1900] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Process group watchdog thread terminated with exception: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or there "
        "was a network error, NCCL version 2.21.5",
    )
    assert found == []


def test_failure_detected_alone_is_reported_with_its_sequence_number(tmp_path: Path) -> None:
    (found,) = _timeouts(
        tmp_path,
        "[rank5]:[E626 16:48:25.4 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 5]  failure detected by watchdog at work sequence id: 42 PG status: last enqueued "
        "work: 43, last completed work: 41",
    )
    assert found["fields"]["seq_num"] == 42 and found["fields"]["evidence"] == "watchdog_summary"


def test_wrap_inside_a_number_and_before_milliseconds(tmp_path: Path) -> None:
    (found,) = _timeouts(
        tmp_path,
        "[rank2]:[E424 01:11:21.1 ProcessGroupNCCL.cpp:629] [Rank 2] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, "
        "Timeout(ms)=18",
        "00000) ran for 1800010 ",
        "milliseconds before timing out.",
    )
    fields = found["fields"]
    assert (fields["timeout_ms"], fields["elapsed_ms"], fields["ranks"]) == (1800000, 1800010, [2])


def test_a_cut_report_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    (found,) = _timeouts(
        tmp_path,
        "[rank2]:[E424 01:11:21.1 ProcessGroupNCCL.cpp:629] [Rank 2] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=4, OpTy",
        "[rank3]:[E424 01:11:21.2 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, "
        "Timeout(ms)=1800000) ran for 1800011 milliseconds before timing out.",
    )
    assert found["fields"]["ranks"] == [3] and found["count"] == 1


def test_laggards_are_compared_within_the_failing_process_group(tmp_path: Path) -> None:
    line = (
        "[rank{r}]:[E1107 10:32:33.5 ProcessGroupNCCL.cpp:1785] [PG ID {pg} PG GUID {pg} Rank "
        "{r}] Exception (either an error or timeout) detected by watchdog at work: {seq}, last "
        "enqueued NCCL work: {enq}, last completed NCCL work: {done}."
    )
    (found,) = _timeouts(
        tmp_path,
        line.format(r=0, pg=1, seq=30, enq=31, done=29),
        line.format(r=1, pg=1, seq=30, enq=31, done=29),
        # Rank 2 is behind on PG 1; rank 3's PG 4 counts its own collectives.
        "[rank2]:[E1107 10:32:34.1 ProcessGroupNCCL.cpp:1683] [PG ID 1 PG GUID 1 Rank 2] "
        "Received a dump signal due to a collective timeout from rank 0 and we will try our "
        "best to dump the debug info. Last enqueued NCCL work: 29, last completed NCCL work: 29.",
        "[rank3]:[I1107 10:32:34.1 ProcessGroupNCCL.cpp:1683] [PG ID 4 PG GUID 4 Rank 0] NCCL "
        "Work update periodically: last enqueued NCCL work: 2, last completed NCCL work: 2.",
    )
    assert found["fields"]["seq_num"] == 30 and found["fields"]["laggard_ranks"] == [2]


def test_keywords_stay_few() -> None:
    assert len(NcclTimeoutDetector.keywords) <= 3
