"""The rank_failure detector on every layout torchrun's source prints, whole and in part.

The summaries are rendered from ChildFailedError's templates as pytorch/pytorch prints them
(torch/distributed/elastic/multiprocessing/errors/__init__.py; >= 1.11 and 1.9/1.10), the agent
lines from their logger calls; tests/triage/corpus/rank_failure/SOURCES.md cites each.
"""

from __future__ import annotations

import signal
from pathlib import Path
from string import Template
from typing import Any

import pytest

from trainguard.contract import Failure
from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.scanner import Scanner

# torch >= 1.11
FAILURE = Template(
    """[${idx}]:
  time      : 2024-11-07_10:45:02
  host      : ${host}
  rank      : ${rank} (local_rank: ${local})
  exitcode  : ${code} (pid: ${pid})
  error_file: <N/A>
  traceback : ${message}"""
)
# the exception line ends in ": " (the message starts with a newline)
SUMMARY = Template(
    """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ${nothing}
${border}
train.py FAILED
${section}
Failures:
${others}
${section}
Root Cause (first observed failure):
${root}
${border}"""
)
# torch 1.9/1.10
FAILURE_19 = Template(
    """[${idx}]:
  time: 2021-08-26_17:12:07
  rank: ${rank} (local_rank: ${local})
  exitcode: ${code} (pid: ${pid})
  error_file: <N/A>
  msg: "${message}\""""
)
SUMMARY_19 = Template(
    """${border}
                    train.py FAILED
${section}
Root Cause:
${root}
${section}
Other Failures:
${others}
${border}"""
)


def failure(template: Template, idx: int, rank: int, code: int, **kw: Any) -> str:
    name = signal.Signals(-code).name if code < 0 else ""
    message = kw.pop("message", f"Signal {-code} ({name}) received by PID {1000 + rank}")
    return template.substitute(
        idx=idx,
        host=kw.pop("host", "gpu-node-07"),
        rank=rank,
        local=rank % 8,
        code=code,
        pid=1000 + rank,
        message=message,
    )


def summary_2x(root: str, others: list[str]) -> str:
    return SUMMARY.substitute(
        nothing="",
        border="=" * 60,
        section="-" * 60,
        root=root,
        others="\n".join(others) or "  <NO_OTHER_FAILURES>",
    )


def rank_failures(tmp_path: Path, text: str, *also: Failure) -> list[dict[str, Any]]:
    """The rank_failure findings' fields; any other finding must be one of ``also``."""
    log = tmp_path / "torchrun.log"
    log.write_text(text)
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_paths([str(log)])
    findings = [f.to_json() for f in scanner.findings()]
    assert {f["failure"] for f in findings} <= {
        Failure.RANK_FAILURE.value,
        *(a.value for a in also),
    }
    return [f["fields"] for f in findings if f["failure"] == Failure.RANK_FAILURE.value]


def test_whole_summary(tmp_path) -> None:
    text = summary_2x(
        failure(FAILURE, 0, 3, -9),
        [failure(FAILURE, 1, 1, -15), failure(FAILURE, 2, 2, -15)],
    )
    (fields,) = rank_failures(tmp_path, text + "\nafter the summary\n")
    root = fields["root_cause"]
    assert (root["rank"], root["local_rank"], root["exitcode"], root["signal"]) == (
        3,
        3,
        -9,
        "SIGKILL",
    )
    assert fields["other_failed_ranks"] == [1, 2] and fields["script"] == "train.py"


def test_traceback_in_the_root_cause(tmp_path) -> None:
    traceback = (
        'Traceback (most recent call last):\n    File "train.py", line 9, in <module>\n'
        "      main()\n  torch.OutOfMemoryError: CUDA out of memory.\n  "
    )
    root = failure(FAILURE, 0, 5, 1, message=traceback)
    (fields,) = rank_failures(tmp_path, summary_2x(root, []), Failure.OOM)
    assert fields["root_cause"]["error"] == "torch.OutOfMemoryError: CUDA out of memory."


@pytest.mark.parametrize(
    "keep",
    [
        slice(13, None),  # from "Root Cause (first observed failure):"
        slice(0, 19),  # cut inside the root cause, after its exit code
        slice(5, 21),  # no header, no rules
    ],
)
def test_partial_summaries(tmp_path, keep) -> None:
    lines = summary_2x(failure(FAILURE, 0, 6, -6), [failure(FAILURE, 1, 2, -15)]).split("\n")
    (fields,) = rank_failures(tmp_path, "\n".join(lines[keep]) + "\n")
    assert (fields["root_cause"]["rank"], fields["root_cause"]["signal"]) == (6, "SIGABRT")


def test_prefixed_summary(tmp_path) -> None:
    text = summary_2x(failure(FAILURE, 0, 4, 1), [])
    prefixed = "\n".join(f"stderr: {line}" for line in text.split("\n"))
    stamped = "\n".join(f"2024-11-20 14:38:16   {line}" for line in text.split("\n"))
    for variant in (prefixed, stamped):
        (fields,) = rank_failures(tmp_path, variant + "\n")
        assert (fields["root_cause"]["rank"], fields["root_cause"]["exitcode"]) == (4, 1)


def test_summary_of_torch_1_9(tmp_path) -> None:
    text = SUMMARY_19.substitute(
        border="*" * 60,
        section="=" * 60,
        root=failure(FAILURE_19, 0, 0, 1, message="Process failed with exitcode 1"),
        others=failure(FAILURE_19, 1, 1, 1, message="Process failed with exitcode 1"),
    )
    (fields,) = rank_failures(tmp_path, text + "\n")
    assert (fields["root_cause"]["rank"], fields["root_cause"]["exitcode"]) == (0, 1)
    assert fields["root_cause"]["error"] == "Process failed with exitcode 1"
    assert fields["other_failed_ranks"] == [1]


def test_failures_without_their_root_cause(tmp_path) -> None:
    text = summary_2x(failure(FAILURE, 0, 0, 1), [failure(FAILURE, 1, 1, 1)])
    cut = "\n".join(text.split("\n")[:12])  # ends before "Root Cause"
    (fields,) = rank_failures(tmp_path, cut + "\n")
    assert fields["root_cause"] == {} and fields["other_failed_ranks"] == [1]


@pytest.mark.parametrize(
    ("line", "local", "code"),
    [
        # multiprocessing/api.py in each logger format: <= 2.0, 2.1-2.2, >= 2.3
        (
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
            "local_rank: 3 (pid: 812917) of binary: /usr/bin/python",
            3,
            -9,
        ),
        (
            "[2024-05-08 08:47:31,877] torch.distributed.elastic.multiprocessing.api: [ERROR] "
            "failed (exitcode: 1) local_rank: 2 (pid: 5939) of binary: /bin/python",
            2,
            1,
        ),
        (
            "E0325 20:57:27.620000 2606 torch/distributed/elastic/multiprocessing/api.py:869] "
            "failed (exitcode: -6) local_rank: 5 (pid: 2630) of binary: /root/bin/python",
            5,
            -6,
        ),
        # MultiprocessContext (start_method spawn)
        (
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
            "local_rank: 0 (pid: 77) of fn: main (start_method: spawn)",
            0,
            1,
        ),
        # torch 1.9/1.10 _no_error_file_warning_msg
        ("Child process 17057 (local_rank 1) FAILED (exitcode 1)", 1, 1),
        # torch.distributed.launch <= 1.8
        (
            "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', "
            "'--local_rank=3']' returned non-zero exit status 1.",
            3,
            1,
        ),
        (
            "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', "
            "'--local_rank=1']' died with <Signals.SIGKILL: 9>.",
            1,
            -9,
        ),
    ],
)
def test_agent_lines(tmp_path, line, local, code) -> None:
    (fields,) = rank_failures(tmp_path, line + "\n")
    assert (fields["root_cause"]["local_rank"], fields["root_cause"]["exitcode"]) == (local, code)


@pytest.mark.parametrize(
    "line",
    [
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
        "[default] Worker group UNHEALTHY. 2/3 attempts left; will restart worker group",
        "[default] Worker group FAILED, is failure node: False,3/3 attempts left; will restart "
        "worker group.",
    ],
)
def test_restarts_alone(tmp_path, line) -> None:
    (fields,) = rank_failures(tmp_path, f"INFO:torch.distributed.elastic.agent.server.api:{line}\n")
    assert fields["restarts"] == 1 and fields["max_restarts"] == 3 and fields["root_cause"] == {}


def test_restarts_join_the_failure(tmp_path) -> None:
    text = (
        "W1107 10:32:40.101000 139906 torch/distributed/elastic/agent/server/api.py:704] "
        "[default] Worker group FAILED. 3/3 attempts left; will restart worker group\n"
        "W1107 10:45:01.800000 139906 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 140234 closing signal SIGTERM\n"
        "E1107 10:45:02.700000 139906 torch/distributed/elastic/multiprocessing/api.py:869] "
        "failed (exitcode: -6) local_rank: 1 (pid: 140233) of binary: /usr/bin/python3\n"
    )
    (fields,) = rank_failures(tmp_path, text)
    assert fields["restarts"] == 1 and fields["max_restarts"] == 3
    assert fields["root_cause"]["local_rank"] == 1


@pytest.mark.parametrize(
    "text",
    [
        "W0217 16:43:26.140000 355419 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 355718 closing signal SIGTERM\n",
        "subprocess.CalledProcessError: Command '['gcc', '-c', 'x.c']' returned non-zero exit "
        "status 1.\n",
        "Root Cause Analysis: the loader was slow\nrank: 0 (local_rank: 0) started\n",
        "Namespace(local_rank=0, lr=0.1)\nlocal_rank: 0 world_size: 8\n",
    ],
)
def test_no_failure(tmp_path, text) -> None:
    assert rank_failures(tmp_path, text) == []
