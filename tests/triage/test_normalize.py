"""Decoration that logs pick up on the way to us (terminal colours, markdown, CRLF) is taken off
before the detectors see a line; timestamps and rank prefixes stay."""

from __future__ import annotations

import io
import json

import pytest

from trainguard import cli
from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.detectors.base import Source, rank_of
from trainguard.triage.normalize import clean
from trainguard.triage.scanner import Scanner

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
    "capacity of 79.15 GiB of which 1.12 GiB is free."
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\x1b[31mERROR\x1b[0m: boom\r", "ERROR: boom"),
        ("\x1b[1;38;5;196mred\x1b[K", "red"),
        ("> > quoted line", "quoted line"),
        ("  > [rank3]: text", "[rank3]: text"),
        ("2024-01-01 10:00:00 [rank3]: a > b", "2024-01-01 10:00:00 [rank3]: a > b"),
    ],
)
def test_clean(raw: str, expected: str) -> None:
    assert clean(raw) == expected


def test_rank_prefix_after_a_collectors_timestamp() -> None:
    source = Source("x.log")
    assert rank_of("2024-05-01T10:00:00.123Z stderr F [rank5]: boom", source) == 5
    assert rank_of("[rank2]:[E ProcessGroupNCCL.cpp:1] x", source) == 2
    # Far into a message, "[rank7]:" is not a prefix.
    assert rank_of("x" * 80 + " [rank7]: quoted", source) is None


def test_a_pasted_coloured_windows_log_is_read_like_the_original() -> None:
    pasted = f"> \x1b[31m[rank1]: {OOM}\x1b[0m\r\n> done\r\n".encode()
    scanner = Scanner(default_detectors(load_default()))
    scanner.scan_stream(io.BytesIO(pasted), "pasted.log")
    (finding,) = scanner.findings()
    assert finding.fields["tried_bytes"] == 2 << 30
    assert finding.fields["rank"] == 1


def test_command_line_reads_a_pasted_log(monkeypatch, capsys) -> None:
    pasted = f"> \x1b[31m[rank1]: {OOM}\x1b[0m\r\n".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(pasted)))
    cli.main(["triage", "--json", "--no-progress", "-"])
    (finding,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert finding["failure"] == "oom" and finding["fields"]["gpu"] == 1
