"""``trainguard triage`` on log text in the formats PyTorch, NCCL, torchrun and the kernel print."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest

from trainguard import cli, contract, thresholds
from trainguard.contract import Failure
from trainguard.thresholds import load_default
from trainguard.triage import detectors, xid
from trainguard.triage.cli import EXIT_FOUND, EXIT_NOTHING_FOUND, EXIT_UNREADABLE
from trainguard.triage.detectors import default_detectors
from trainguard.triage.detectors.straggler import StragglerDetector
from trainguard.triage.scanner import Progress, Scanner, rank_hint

FIXTURES = Path(__file__).parent / "fixtures"


def triage_json(
    capsys: pytest.CaptureFixture[str], *inputs: str | Path
) -> tuple[int, list[dict[str, Any]]]:
    code = cli.main(["triage", "--json", "--no-progress", *map(str, inputs)])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines()]


def only(findings: list[dict[str, Any]], failure: Failure) -> list[dict[str, Any]]:
    return [f for f in findings if f["failure"] == failure.value]


def test_new_format_oom_with_large_cached_share_is_fragmentation(capsys) -> None:
    code, findings = triage_json(capsys, FIXTURES / "oom_new.log")
    assert code == EXIT_FOUND
    (oom,) = only(findings, Failure.OOM)
    fields = oom["fields"]
    assert oom["line"] == 9
    assert fields["rank"] == 1 and fields["gpu"] == 1
    assert fields["tried_bytes"] == 2 << 30
    assert fields["reserved_unallocated_bytes"] == round(8.69 * (1 << 30))
    assert fields["verdict"] == "fragmentation"
    assert "expandable_segments:True" in oom["advice"]


def test_oom_that_does_not_fit_gets_batch_advice_not_fragmentation(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "oom_fit.log")
    (oom,) = only(findings, Failure.OOM)
    fields = oom["fields"]
    # PyTorch 2.1 spells "capacty"; the figures must still be read.
    assert fields["total_bytes"] == round(23.65 * (1 << 30))
    assert fields["processes_in_use_bytes"] == {"4242": round(22.52 * (1 << 30))}
    assert fields["verdict"] == "does_not_fit"
    assert "expandable_segments" not in oom["advice"]
    assert "micro-batch" in oom["advice"]


def test_old_format_oom(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "oom_old.log")
    (oom,) = only(findings, Failure.OOM)
    fields = oom["fields"]
    assert fields["format"] == "pytorch<2.1"
    assert fields["tried_bytes"] == 20 << 20
    assert fields["allocated_bytes"] == round(13.91 * (1 << 30))
    assert fields["reserved_unallocated_bytes"] == round(14.71 * (1 << 30)) - round(
        13.91 * (1 << 30)
    )
    # 0.8 GiB cached but unused and a 20 MiB request failed: the cache is fragmented.
    assert fields["verdict"] == "fragmentation"


def test_watchdog_timeouts_across_rank_files(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "nccl_timeout")
    (timeout,) = only(findings, Failure.NCCL_TIMEOUT)
    fields = timeout["fields"]
    assert (fields["op_type"], fields["seq_num"]) == ("ALLREDUCE", 4821)
    assert (fields["numel_in"], fields["numel_out"]) == (26214400, 26214400)
    assert fields["timeout_ms"] == 600000
    assert fields["elapsed_ms"] == 600088
    assert fields["ranks"] == [0, 1, 2]
    # rank 2's glog timestamp is the earliest although its file is read third
    assert fields["first_rank"] == 2
    assert timeout["file"].endswith("rank2.log") and timeout["line"] == 2
    assert fields["flight_recorder"] == "written"
    assert fields["laggard_ranks"] == [3]
    assert "fr_trace" in timeout["advice"]


def test_old_watchdog_format_without_element_counts(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "nccl_timeout_old.log")
    (timeout,) = only(findings, Failure.NCCL_TIMEOUT)
    fields = timeout["fields"]
    assert fields["op_type"] == "BROADCAST" and fields["seq_num"] == 12
    assert "numel_in" not in fields
    assert fields["ranks"] == [1] and timeout["count"] == 2
    assert fields["flight_recorder"] == "not_seen"
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in timeout["advice"]


def test_nccl_errors_by_kind(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "nccl_errors.log")
    by_kind = {f["fields"]["kind"]: f for f in only(findings, Failure.NCCL_ERROR)}
    assert set(by_kind) == {"ib", "remote", "socket", "system", "cuda"}
    ib = by_kind["ib"]
    assert ib["count"] == 2 and ib["fields"]["ib_status"] == 12
    assert "retry counter exceeded" in ib["fields"]["ib_status_text"]
    assert ib["fields"]["hosts"] == ["gpu-a17"]
    assert by_kind["cuda"]["count"] == 2
    assert by_kind["remote"]["fields"]["ranks"] == [3]
    assert by_kind["system"]["fields"]["ranks"] == [8]
    assert by_kind["socket"]["fields"]["hosts"] == ["gpu-b02"]
    assert by_kind["remote"]["fields"]["nccl_versions"] == ["2.20.5", "2.21.5"]


def test_nccl_internal_error_and_invalid_usage(capsys) -> None:
    # torch's DistBackendError lines carry ncclGetErrorString's wording for both kinds
    _, findings = triage_json(capsys, FIXTURES / "nccl_init_errors.log")
    by_kind = {f["fields"]["kind"]: f for f in only(findings, Failure.NCCL_ERROR)}
    # NCCL's "Duplicate GPU detected" WARN (line 4) is the ncclInvalidUsage torch reports
    invalid = by_kind["invalid_usage"]
    assert (invalid["line"], invalid["count"]) == (4, 2)
    assert invalid["fields"]["ranks"] == [1]
    assert "Duplicate GPU detected" in invalid["fields"]["message"]
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in invalid["advice"]
    internal = by_kind["internal"]
    assert (internal["line"], internal["count"]) == (19, 1)
    assert internal["fields"]["ranks"] == [10]
    assert "please report this issue" in internal["fields"]["message"]
    assert "same NCCL and PyTorch versions" in internal["advice"]
    assert internal["fields"]["nccl_versions"] == ["2.21.5"]
    assert by_kind["other"]["line"] == 16  # "Attribute busid of node nic not found"


def test_xid_meanings_and_drain_advice(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "kern.log")
    xids = {(f["fields"]["pci"], f["fields"]["xid"]): f for f in only(findings, Failure.GPU_FAULT)}
    fell_off = xids[("0000:b3:00", 79)]
    assert fell_off["count"] == 2 and fell_off["fields"]["drain"] == "now"
    assert fell_off["fields"]["host"] == "gpu-node-07"
    assert xids[("0000:3b:00", 48)]["fields"]["drain"] == "now"
    assert xids[("0000:3b:00", 63)]["fields"]["drain"] == "after_job"
    assert xids[("0000:5e:00", 13)]["fields"]["drain"] == "no"
    assert xids[("0000:5e:00", 13)]["fields"]["pids"] == [30112]
    assert xids[("0000:18:00", 154)]["fields"]["recovery_action"] == "Node Reboot Required"
    assert xids[("0000:18:00", 154)]["fields"]["drain"] == "now"
    assert xids[("0000:19:00", 999)]["fields"]["drain"] == "unknown"


def test_xid_drain_follows_the_thresholds_xid_critical() -> None:
    critical = set(thresholds.load_default().xid_critical)
    for code in xid.CATALOGUE:
        drain = xid.lookup(code, critical).drain
        assert (drain in ("now", "after_job")) == (code in critical), code
    # every code that pages is one trainguard can explain
    assert critical <= set(xid.CATALOGUE)
    # the list decides, not the table: a custom list drains on what it names
    assert xid.lookup(13, critical={13}).drain == "now"
    assert xid.lookup(48, critical=set()).drain == "no"
    assert xid.lookup(63, critical={63}).drain == "after_job"
    # Xid 154 is not in the list on purpose: its message says whether anything is needed
    assert 154 not in critical
    assert xid.recovery_drain("None") == "no"
    assert xid.recovery_drain("GPU Reset Required") == "now"


def test_torchrun_root_cause_signal_and_restarts(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "torchrun_agent.log")
    (failure,) = only(findings, Failure.RANK_FAILURE)
    fields = failure["fields"]
    root = fields["root_cause"]
    assert (root["rank"], root["local_rank"], root["host"]) == (1, 1, "gpu-node-07")
    assert (root["exitcode"], root["signal"], root["pid"]) == (-6, "SIGABRT", 140233)
    assert fields["other_failed_ranks"] == [2]
    assert fields["restarts"] == 2 and fields["max_restarts"] == 3
    assert fields["script"] == "train.py"
    assert "watchdog" in failure["advice"]


def test_torchrun_root_cause_traceback(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "torchrun_traceback.log")
    (failure,) = only(findings, Failure.RANK_FAILURE)
    root = failure["fields"]["root_cause"]
    assert root["rank"] == 12 and root["exitcode"] == 1 and root["signal"] is None
    assert root["error"].startswith("ValueError: Expected input batch_size")
    assert root["error_file"].endswith("/error.json")
    assert failure["fields"]["other_failures"] == 0


def test_agent_failure_without_summary(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "agent_only.log")
    (failure,) = only(findings, Failure.RANK_FAILURE)
    assert failure["fields"]["root_cause"]["signal"] == "SIGKILL"
    assert "OOM killer" in failure["advice"]


def test_straggler_from_per_rank_timings_in_mixed_units(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES / "straggler.log")
    (slow,) = only(findings, Failure.STRAGGLER)
    fields = slow["fields"]
    assert fields["rank"] == 2 and fields["metric"] == "compute_time"
    assert fields["samples"] == 40 and fields["ranks_compared"] == 4
    # ranks 1 and 3 print milliseconds; their medians must be in seconds like the others'
    assert 0.49 < fields["peer_median_seconds"] < 0.53
    assert 1.25 < fields["slowdown"] < 1.45


def test_straggler_judged_by_the_thresholds_file() -> None:
    defaults = thresholds.load_default()
    (detector,) = [
        d for d in detectors.default_detectors(defaults) if isinstance(d, StragglerDetector)
    ]
    assert (detector.factor, detector.min_ranks) == (
        defaults.straggler_factor,
        defaults.straggler_min_ranks,
    )
    # rank 2 is about 1.35x its peers: a stricter factor in the file finds nothing
    strict = dataclasses.replace(defaults, straggler_factor=1.5)
    scanner = Scanner(detectors.default_detectors(strict))
    scanner.scan_paths([str(FIXTURES / "straggler.log")])
    assert scanner.findings() == []
    fewer = dataclasses.replace(defaults, straggler_min_ranks=5)  # the log has 4 ranks
    scanner = Scanner(detectors.default_detectors(fewer))
    scanner.scan_paths([str(FIXTURES / "straggler.log")])
    assert scanner.findings() == []


def test_straggler_threshold_flag(capsys) -> None:
    code = cli.main(
        ["triage", "--json", "--straggler-threshold", "0.5", str(FIXTURES / "straggler.log")]
    )
    assert code == EXIT_NOTHING_FOUND
    assert capsys.readouterr().out == ""


def test_clean_log_exits_nothing_found(capsys) -> None:
    code = cli.main(["triage", str(FIXTURES / "clean.log")])
    captured = capsys.readouterr()
    assert code == EXIT_NOTHING_FOUND
    assert captured.out == ""
    assert "0 finding(s)" in captured.err


def test_unreadable_input_has_its_own_exit_code(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    assert cli.main(["triage", str(missing)]) == EXIT_UNREADABLE
    assert "cannot read" in capsys.readouterr().err
    # a failure found elsewhere still says "found"
    assert cli.main(["triage", str(missing), str(FIXTURES / "kern.log")]) == EXIT_FOUND


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_damaged_gzip_is_reported_unreadable(capsys, tmp_path: Path, damage: str) -> None:
    packed = gzip.compress(b"step=1 loss=2.0\n" * 10_000)
    if damage == "corrupt":
        # flip the deflate data just after the 10-byte header: zlib.error, not a bad CRC
        broken = packed[:10] + bytes(b ^ 0xFF for b in packed[10:40]) + packed[40:]
    else:
        broken = packed[: len(packed) // 2]  # EOFError: no end-of-stream marker
    log = tmp_path / f"{damage}.log.gz"
    log.write_bytes(broken)
    assert cli.main(["triage", "--no-progress", str(log)]) == EXIT_UNREADABLE
    assert f"cannot read {log}:" in capsys.readouterr().err
    # the inputs after it are still read
    assert cli.main(["triage", "--no-progress", str(log), str(FIXTURES / "kern.log")]) == EXIT_FOUND


def test_binary_lines_are_skipped_and_counted(capsys) -> None:
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths([str(FIXTURES / "binary_mixed.log")])
    findings = scanner.findings()
    assert scanner.stats.binary_lines == 2
    assert scanner.stats.lines == 5
    failures = sorted(f.failure for f in findings)
    # the Xid after the binary lines and the unterminated last line are both read
    assert failures == sorted([Failure.NCCL_ERROR, Failure.GPU_FAULT])
    assert {f.location.line for f in findings} == {4, 5}


def test_tiny_chunks_give_the_same_findings_as_large_ones() -> None:
    def run(chunk: int) -> list[dict[str, Any]]:
        scanner = Scanner(default_detectors(load_default()), chunk_bytes=chunk)
        scanner.scan_paths([str(FIXTURES)])
        return sorted(
            (f.to_json() for f in scanner.findings()), key=lambda f: (f["file"], f["line"])
        )

    large = run(8 << 20)
    assert len(large) > 20
    assert run(97) == large
    assert run(1) == large


def test_overlong_lines_are_skipped_without_buffering(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    xid_line = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
    log.write_bytes(b"x" * 5000 + b" NCCL WARN hidden\n" + xid_line + b"y" * 3000)
    scanner = Scanner(default_detectors(load_default()), chunk_bytes=256, max_line_bytes=1024)
    scanner.scan_paths([str(log)])
    findings = scanner.findings()
    assert scanner.stats.overlong_lines == 2
    assert [(f.failure, f.location.line) for f in findings] == [(Failure.GPU_FAULT, 2)]


@pytest.mark.parametrize("chunk", [8 << 20, 1 << 20, 64 << 10])
def test_overlong_lines_count_the_same_whatever_the_chunk_size(tmp_path: Path, chunk: int) -> None:
    xid_line = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
    log = tmp_path / "long.log"
    log.write_bytes(
        b"step=1\n"
        + b"x" * (2 << 20)  # no keyword: a chunk holding it whole never looks at it otherwise
        + b"\n"
        + b"y" * (2 << 20)
        + b" NCCL WARN hidden\n"
        + b"\x00" * (2 << 20)  # counted as overlong, not as binary
        + b"\n"
        + b"z" * ((1 << 20) + 1)  # one byte over the limit
        + b"\n"
        + b"w" * (1 << 20)  # exactly the limit: kept
        + b"\n"
        + xid_line
    )
    scanner = Scanner(default_detectors(load_default()), chunk_bytes=chunk)
    scanner.scan_paths([str(log)])
    findings = scanner.findings()
    assert (scanner.stats.overlong_lines, scanner.stats.binary_lines) == (4, 0)
    assert scanner.stats.lines == 7
    assert [(f.failure, f.location.line) for f in findings] == [(Failure.GPU_FAULT, 7)]


def test_stdin_and_gzip_inputs(tmp_path: Path) -> None:
    text = (FIXTURES / "nccl_errors.log").read_bytes()
    packed = tmp_path / "nccl_errors.log.gz"
    packed.write_bytes(gzip.compress(text))
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths(["-", str(packed)], stdin=io.BytesIO(text))
    files = [f.location.file for f in scanner.findings()]
    assert files.count("-") == files.count(str(packed)) == 5
    assert scanner.stats.bytes == 2 * len(text)


def test_repeats_fold_into_one_finding_and_groups_are_bounded(monkeypatch, tmp_path) -> None:
    log = tmp_path / "many.log"
    lines = [
        f"NVRM: Xid (PCI:0000:{i % 7:02x}:00): 79, pid=1, name=python, GPU has fallen off the bus."
        for i in range(10_000)
    ]
    log.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(detectors.base, "MAX_GROUPS", 3)
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths([str(log)])
    findings = scanner.findings()
    assert len(findings) == 3
    assert sum(f.count for f in findings) == sum(1 for i in range(10_000) if i % 7 < 3)
    assert scanner.stats.dropped_findings == sum(1 for i in range(10_000) if i % 7 >= 3)


def test_rank_hint_from_file_names() -> None:
    assert rank_hint("logs/rank7.log") == 7
    assert rank_hint("logs/rank_12.txt") == 12
    assert rank_hint("/tmp/torchelastic_x/none_y/attempt_0/3/stderr.log") == 3
    assert rank_hint("logs/train.log") is None


def test_progress_line_is_written_and_cleared(monkeypatch) -> None:
    monkeypatch.setattr(Progress, "INTERVAL", 0.0)
    out = io.StringIO()
    progress = Progress(out, 2_000_000)
    progress.update(1_000_000, "rank0.log")
    progress.close()
    text = out.getvalue()
    assert "50.0%" in text and "rank0.log" in text
    assert text.endswith("\r")


def test_human_output_names_file_line_and_advice(capsys) -> None:
    code = cli.main(["triage", "--no-progress", str(FIXTURES / "kern.log")])
    out = capsys.readouterr().out
    assert code == EXIT_FOUND
    assert f"[{Failure.GPU_FAULT.value}] Xid 79 (GPU has fallen off the bus)" in out
    assert f"at {FIXTURES / 'kern.log'}:2 (seen 2 times)" in out
    assert "advice: Drain the node" in out


def test_json_names_the_failure_and_each_detector_declares_its_own(capsys) -> None:
    _, findings = triage_json(capsys, FIXTURES)
    registered = contract.FAILURES.implementations(detectors.DETECTORS)
    assert {f["failure"] for f in findings} == {spec.failure.value for spec, _ in registered}
    assert all("category" not in f for f in findings)
    for spec, detector in registered:
        assert detector.failure is spec.failure
        assert detector.__module__ == f"trainguard.triage.detectors.{spec.failure.value}"
