"""The direct shipper's disk spool: an append-only log of accepted events with a read cursor.

Every event the shipper accepts is appended here first, so nothing it accepted is lost when
Elasticsearch is down, answers 429/5xx, or the process restarts. Events live in numbered
segment files (one JSON document per line); ``cursor.json`` records how far delivery has got
and is replaced atomically after each delivered batch; fully delivered segments are deleted.
Each event's id is ``<spool id>-<segment>-<offset>``: stable across restarts, so a batch resent
after a crash is recognised by Elasticsearch (409 on ``create``) instead of being duplicated.

The spool's size on disk is bounded: an append that would exceed ``max_bytes`` is refused and
counted. A lock file keeps two processes from sharing one spool.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".ndjson"
CURSOR_FILE = "cursor.json"
ID_FILE = "spool-id"
LOCK_FILE = "lock"
_REPAIR_STEP = 64 << 10


class SpoolLockedError(RuntimeError):
    """Another process (or another shipper in this one) already uses this spool directory."""


@dataclass(frozen=True, order=True)
class Position:
    segment: int
    offset: int


@dataclass(frozen=True)
class Entry:
    """One spooled event: its stable id, the JSON line, and the position just after it."""

    id: str
    line: bytes
    end: Position


class Spool:
    """Append-only segments plus a delivery cursor; safe for one writer and one reader thread."""

    def __init__(self, directory: str | Path, *, max_bytes: int, segment_bytes: int) -> None:
        if segment_bytes <= 0 or max_bytes < segment_bytes:
            raise ValueError("need 0 < segment_bytes <= max_bytes")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock_fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLockedError(f"spool {self.directory} is in use by another shipper") from None
        self.id = self._load_id()
        self._mutex = threading.Lock()
        self.refused = 0

        existing = self._segment_numbers()
        if existing:
            self._repair_tail(existing[-1])
        cursor = self._load_cursor()
        for number in existing:
            if number < cursor.segment:
                self._path(number).unlink()
        self._sizes = {n: self._path(n).stat().st_size for n in existing if n >= cursor.segment}
        # A restart always writes to a fresh segment: the old ones are never appended to again.
        self._writing = (existing[-1] + 1) if existing else 1
        self._sizes[self._writing] = 0
        self._file = self._path(self._writing).open("ab", buffering=0)
        first = min(self._sizes)
        if cursor.segment not in self._sizes:
            cursor = Position(first, 0)
        self._cursor = Position(cursor.segment, min(cursor.offset, self._sizes[cursor.segment]))

    # --- paths and persistent state -----------------------------------------------------------
    def _path(self, number: int) -> Path:
        return self.directory / f"{SEGMENT_PREFIX}{number:012d}{SEGMENT_SUFFIX}"

    def _segment_numbers(self) -> list[int]:
        numbers = []
        for path in self.directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
            digits = path.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
            if digits.isdigit():
                numbers.append(int(digits))
        return sorted(numbers)

    def _load_id(self) -> str:
        path = self.directory / ID_FILE
        try:
            value = path.read_text().strip()
        except FileNotFoundError:
            value = ""
        if not value:
            value = uuid.uuid4().hex[:16]
            path.write_text(value + "\n")
        return value

    def _load_cursor(self) -> Position:
        try:
            data = json.loads((self.directory / CURSOR_FILE).read_text())
            return Position(int(data["segment"]), int(data["offset"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            # No (readable) cursor: start from the oldest segment. Resending is safe, the ids
            # make Elasticsearch answer 409 for events it already has.
            return Position(0, 0)

    def _store_cursor(self, position: Position) -> None:
        target = self.directory / CURSOR_FILE
        temporary = target.with_suffix(".tmp")
        temporary.write_text(json.dumps({"segment": position.segment, "offset": position.offset}))
        temporary.replace(target)

    def _repair_tail(self, number: int) -> None:
        """Cut a half-written last line left by a crash (that event was never accepted)."""
        with self._path(number).open("r+b") as segment:
            end = segment.seek(0, os.SEEK_END)
            position = end
            while position > 0:
                start = max(0, position - _REPAIR_STEP)
                segment.seek(start)
                block = segment.read(position - start)
                newline = block.rfind(b"\n")
                if newline != -1:
                    keep = start + newline + 1
                    break
                position = start
            else:
                keep = 0
            if keep != end:
                segment.truncate(keep)

    # --- writer side ----------------------------------------------------------------------------
    def append(self, line: bytes) -> bool:
        """Store one JSON document (no newline inside); False when the spool is full."""
        record = line.rstrip(b"\n") + b"\n"
        if b"\n" in record[:-1]:
            raise ValueError("a spooled event must be a single line")
        with self._mutex:
            if sum(self._sizes.values()) + len(record) > self.max_bytes:
                self.refused += 1
                return False
            if self._sizes[self._writing] and (
                self._sizes[self._writing] + len(record) > self.segment_bytes
            ):
                self._file.close()
                self._writing += 1
                self._sizes[self._writing] = 0
                self._file = self._path(self._writing).open("ab", buffering=0)
            self._file.write(record)
            self._sizes[self._writing] += len(record)
        return True

    # --- reader side ----------------------------------------------------------------------------
    def read(self, max_entries: int, max_bytes: int) -> list[Entry]:
        """The next undelivered events from the cursor, oldest first (the cursor stays put)."""
        with self._mutex:
            sizes = dict(self._sizes)
            position = self._cursor
        entries: list[Entry] = []
        budget = max_bytes
        segment, offset = position.segment, position.offset
        numbers = sorted(sizes)
        while len(entries) < max_entries and budget > 0:
            size = sizes.get(segment, 0)
            if offset >= size:
                later = [n for n in numbers if n > segment]
                if not later:
                    break
                segment, offset = later[0], 0
                continue
            with self._path(segment).open("rb") as stream:
                stream.seek(offset)
                data = stream.read(min(size - offset, budget))
                cut = data.rfind(b"\n")
                if cut == -1:  # one event larger than the budget: send it alone
                    if entries:
                        break
                    stream.seek(offset)
                    data = stream.readline()
                    cut = len(data) - 1
            for line in data[: cut + 1].splitlines(keepends=True):
                if len(entries) >= max_entries:
                    break
                end = offset + len(line)
                entries.append(
                    Entry(f"{self.id}-{segment}-{offset}", line[:-1], Position(segment, end))
                )
                budget -= len(line)
                offset = end
        return entries

    def commit(self, position: Position) -> None:
        """Everything before ``position`` is delivered: persist that and drop spent segments."""
        with self._mutex:
            spent = [n for n in self._sizes if n < position.segment]
            if position.segment != self._writing and position.offset >= self._sizes.get(
                position.segment, 0
            ):
                spent.append(position.segment)
                later = [n for n in self._sizes if n > position.segment]
                position = Position(min(later), 0)
            for number in spent:
                del self._sizes[number]
            self._cursor = position
        self._store_cursor(position)
        for number in spent:
            with contextlib.suppress(FileNotFoundError):
                self._path(number).unlink()

    # --- state ----------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        with self._mutex:
            return sum(self._sizes.values())

    @property
    def pending_bytes(self) -> int:
        """Bytes accepted and not yet delivered."""
        with self._mutex:
            return sum(self._sizes.values()) - self._cursor.offset

    def close(self) -> None:
        with self._mutex:
            self._file.close()
        os.close(self._lock_fd)
