"""A reader that stops early (``trainguard ... | head``) ends the command quietly.

Python ignores SIGPIPE, so writing to a pipe whose reader has gone raises BrokenPipeError; the
CLI's ``main()`` handles it for every subcommand (Python's note on SIGPIPE).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard import cli

REPO = Path(__file__).resolve().parents[2]
# Far more than a pipe holds (64 KiB on Linux) once rendered: thousands of distinct findings.
XID_LINES = 3000


def _many_findings_log(folder: Path) -> Path:
    """A kernel log where each line is an Xid on its own GPU, so no finding folds into another."""
    log = folder / "kern.log"
    lines = [
        f"NVRM: Xid (PCI:0000:{i // 256:02x}:{i % 256:02x}.0): 79, pid=1, name=python, "
        "GPU has fallen off the bus."
        for i in range(XID_LINES)
    ]
    log.write_text("\n".join(lines) + "\n")
    return log


def _pipe_into_head(command: list[str]) -> tuple[str, str, int]:
    """``command | head -1`` as a real pipeline: head's stdout, the command's stderr and
    exit status."""
    head_binary = shutil.which("head")
    if head_binary is None:
        pytest.skip("head is not installed")
    producer = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, text=True
    )
    assert producer.stdout is not None and producer.stderr is not None
    head = subprocess.Popen(
        [head_binary, "-1"], stdin=producer.stdout, stdout=subprocess.PIPE, text=True
    )
    producer.stdout.close()  # head alone holds the read end: when it exits, the pipe breaks
    first, _ = head.communicate(timeout=120)
    errors = producer.stderr.read()
    producer.stderr.close()
    return first, errors, producer.wait(timeout=120)


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_triage_piped_into_head_exits_without_a_traceback(
    tmp_path: Path, json_output: bool
) -> None:
    log = _many_findings_log(tmp_path)
    command = [sys.executable, "-m", "trainguard", "triage", str(log)]
    if json_output:
        command.insert(4, "--json")
    first, errors, status = _pipe_into_head(command)
    assert "Traceback" not in errors, errors
    assert "BrokenPipeError" not in errors, errors
    assert errors == "", errors  # quiet: not even an "Exception ignored" line at exit
    assert status == 1
    assert "Xid 79" in first
    if json_output:
        assert isinstance(json.loads(first), dict)
    # A run that writes everything ends with its summary on stderr (the test below): the empty
    # stderr here shows the pipe did break mid-output, so the broken pipe was exercised.


def test_triage_still_completes_when_its_reader_reads_everything(tmp_path: Path) -> None:
    log = _many_findings_log(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "trainguard", "triage", "--json", str(log)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1  # found something
    assert len(done.stdout.splitlines()) == XID_LINES
    assert str(XID_LINES) in done.stderr  # its summary, written after the findings


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_main_turns_a_broken_pipe_into_status_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert cli.main(["triage", "--json", str(_many_findings_log(tmp_path))]) == 1
    # argparse ignores the failed write of its help, then exits: the flush on the way out
    # meets the closed pipe and ends the same way.
    assert cli.main(["rules", "--help"]) == 1


def test_main_leaves_other_exits_alone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["rules", "--help"])
    assert exited.value.code == 0
    assert "usage: trainguard rules" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["no-such-command"])
    assert exited.value.code == 2
