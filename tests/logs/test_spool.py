"""The disk spool: order, stable ids, segment clean-up, crash repair, locking, the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.logs.spool import Spool, SpoolLockedError


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b'{"message": "event %d"}' % i for i in range(start, start + n)]


def test_reads_in_order_and_commits_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)
    for line in lines(20):
        assert spool.append(line)
    assert len(list(tmp_path.glob("segment-*"))) > 3
    seen: list[bytes] = []
    while batch := spool.read(7, 1 << 20):
        seen.extend(entry.line for entry in batch)
        spool.commit(batch[-1].end)
    assert seen == lines(20)
    assert spool.pending_bytes == 0
    # delivered segments are gone; only the one being written remains
    assert len(list(tmp_path.glob("segment-*"))) == 1
    spool.close()


def test_ids_are_stable_across_reopen_and_cursor_is_persisted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    for line in lines(6):
        spool.append(line)
    first = spool.read(6, 1 << 20)
    spool.commit(first[2].end)
    spool.close()

    reopened = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    rest = reopened.read(10, 1 << 20)
    assert [e.id for e in rest] == [e.id for e in first[3:]]
    assert [e.line for e in rest] == lines(3, start=3)
    reopened.close()


def test_half_written_last_line_is_cut_on_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    for line in lines(3):
        spool.append(line)
    spool.close()
    (segment,) = tmp_path.glob("segment-*")
    with segment.open("ab") as out:
        out.write(b'{"message": "torn wri')
    reopened = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    assert [e.line for e in reopened.read(10, 1 << 20)] == lines(3)
    reopened.append(b'{"message": "after"}')
    assert reopened.read(10, 1 << 20)[-1].line == b'{"message": "after"}'
    reopened.close()


def test_a_second_user_of_the_directory_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    with pytest.raises(SpoolLockedError):
        Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    spool.close()
    Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10).close()


def test_bound_refuses_and_counts_and_frees_space_after_delivery(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=200, segment_bytes=100)
    accepted = [line for line in lines(20) if spool.append(line)]
    assert 0 < len(accepted) < 20
    assert spool.refused == 20 - len(accepted)
    assert spool.size_bytes <= 200
    batch = spool.read(100, 1 << 20)
    spool.commit(batch[-1].end)
    assert spool.append(b'{"message": "room again"}')
    spool.close()


def test_an_event_larger_than_the_read_budget_is_read_alone(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 16)
    big = b'{"message": "' + b"x" * 5000 + b'"}'
    spool.append(b'{"message": "small"}')
    spool.append(big)
    first = spool.read(10, 1000)
    assert [e.line for e in first] == [b'{"message": "small"}']
    spool.commit(first[-1].end)
    assert [e.line for e in spool.read(10, 1000)] == [big]
    spool.close()


def test_multi_line_events_are_rejected(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 10)
    with pytest.raises(ValueError):
        spool.append(b'{"a": 1}\n{"b": 2}')
    spool.close()
