"""The streaming reader behind ``trainguard triage``.

Logs are read in fixed-size binary chunks, so memory stays flat however large the input. Each
chunk is searched in place for the detectors' needles with ``bytes.find`` (C speed); only the
lines holding one are decoded, cleaned of decoration (:mod:`.normalize`) and handed to the
detectors whose keywords they hold, and line numbers come from counting newlines. A chunk that
is not clean text (NUL bytes, invalid UTF-8) falls back to a per-line pass that skips and counts
the binary lines. Lines longer than ``MAX_LINE_BYTES`` are skipped and counted instead of being
buffered, whether they arrive whole in one chunk or across several, so the counts do not depend
on the chunk size. A ``.gz`` input that turns out to be corrupt or truncated is reported as
unreadable.
"""

from __future__ import annotations

import gzip
import os
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from trainguard.triage import normalize
from trainguard.triage.detectors import Detector, Source
from trainguard.triage.findings import Finding, Location

CHUNK_BYTES = 8 << 20
MAX_LINE_BYTES = 1 << 20


@dataclass
class ScanStats:
    files: int = 0
    bytes: int = 0
    lines: int = 0
    binary_lines: int = 0
    overlong_lines: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    dropped_findings: int = 0


def rank_hint(path: str) -> int | None:
    """The rank a log file's path implies: rank3.log, rank_3.txt, or torchrun's
    ``--log-dir`` layout ``.../attempt_0/<local rank>/stderr.log``."""
    parts = Path(path).parts
    name = parts[-1] if parts else ""
    stem = name.split(".", 1)[0].lower()
    for prefix in ("rank_", "rank-", "rank"):
        if stem.startswith(prefix) and stem[len(prefix) :].isdigit():
            return int(stem[len(prefix) :])
    if len(parts) >= 2 and parts[-2].isdigit() and name in ("stdout.log", "stderr.log"):
        return int(parts[-2])
    return None


class Progress:
    """A one-line progress display on a terminal; silent otherwise."""

    INTERVAL = 0.2

    def __init__(self, stream: TextIO, total_bytes: int | None) -> None:
        self._stream = stream
        self._total = total_bytes
        self._started = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done_bytes: int, name: str) -> None:
        now = time.monotonic()
        if now - self._last < self.INTERVAL:
            return
        self._last = now
        rate = done_bytes / max(now - self._started, 1e-9) / 1e6
        done_mb = done_bytes / 1e6
        if self._total:
            share = min(done_bytes / self._total, 1.0)
            text = f"triage {share:6.1%} {done_mb:,.0f}/{self._total / 1e6:,.0f} MB"
        else:
            text = f"triage {done_mb:,.0f} MB"
        text = f"{text} {rate:,.0f} MB/s {name}"[:120]
        self._stream.write("\r" + text.ljust(120))
        self._stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * 120 + "\r")
            self._stream.flush()


class Scanner:
    """Feeds the lines of one or more inputs that matter to the detectors."""

    def __init__(
        self,
        detectors: list[Detector],
        *,
        progress: Progress | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.detectors = detectors
        self.stats = ScanStats()
        self._progress = progress
        self._chunk_bytes = chunk_bytes
        self._max_line = max_line_bytes
        # Each needle costs one pass of bytes.find over every chunk (3-5 ms per 8 MiB here),
        # whatever it finds: the detectors' needles are few, and shared where they can be.
        self._needles = sorted({n.encode() for d in self.detectors for n in d.needles})
        self._routes = [(d, d.keywords) for d in self.detectors]
        self._follow: Detector | None = None

    # --- inputs -----------------------------------------------------------------------------
    def scan_paths(self, paths: Iterable[str], stdin: BinaryIO | None = None) -> None:
        for name in paths:
            if name == "-":
                if stdin is None:
                    stdin = sys.stdin.buffer
                self.scan_stream(stdin, "-")
                continue
            for path in self._expand(name):
                self._scan_file(path)

    def _expand(self, name: str) -> Iterator[str]:
        if Path(name).is_dir():
            for root, dirs, files in os.walk(name, onerror=self._walk_error):
                dirs.sort()
                for file_name in sorted(files):
                    path = Path(root) / file_name
                    if path.is_file():
                        yield str(path)
        else:
            yield name

    def _walk_error(self, error: OSError) -> None:
        self.stats.unreadable.append((str(error.filename), error.strerror or str(error)))

    def _scan_file(self, path: str) -> None:
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as compressed:
                    self.scan_stream(compressed, path)  # type: ignore[arg-type]
            else:
                with open(path, "rb") as stream:  # noqa: PTH123
                    self.scan_stream(stream, path)
        # gzip raises OSError for a bad header or CRC, EOFError for a truncated stream and
        # zlib.error for corrupt deflate data.
        except (OSError, EOFError, zlib.error) as error:
            reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
            self.stats.unreadable.append((path, reason))

    # --- the scan ---------------------------------------------------------------------------
    def scan_stream(self, stream: BinaryIO, name: str) -> None:
        """Scan one binary stream; ``name`` is what findings will say as their file."""
        source = Source(name, rank_hint(name))
        self.stats.files += 1
        self._follow = None
        carry = b""
        skipping = False  # inside an overlong line, dropping bytes up to its newline
        line_no = 0
        while True:
            block = stream.read(self._chunk_bytes)
            if not block:
                break
            self.stats.bytes += len(block)
            if skipping:
                newline = block.find(b"\n")
                if newline == -1:
                    continue
                block = block[newline + 1 :]
                line_no += 1
                skipping = False
            data = carry + block if carry else block
            cut = data.rfind(b"\n")
            if cut == -1:
                carry = data
            else:
                line_no = self._chunk(data, cut + 1, line_no, source)
                carry = data[cut + 1 :]
            if len(carry) > self._max_line:
                self.stats.overlong_lines += 1
                carry = b""
                skipping = True
            if self._progress is not None:
                self._progress.update(self.stats.bytes, name)
        if carry:
            carry += b"\n"
            line_no = self._chunk(carry, len(carry), line_no, source)
        self.stats.lines += line_no

    # The chunk's lines are read in place, by offsets into ``data``: slicing a chunk of 8 MiB
    # copied it, twice per chunk, which cost a tenth of the scan.
    def _chunk(self, data: bytes, stop: int, first_line: int, source: Source) -> int:
        """Process the complete lines of ``data[:stop]``, skipping and counting overlong ones;
        return the line count after them."""
        line_no, start = first_line, 0
        for begin, end in self._overlong_lines(data, stop):
            if begin > start:
                line_no = self._lines(data, start, begin, line_no, source)
            self.stats.overlong_lines += 1
            line_no += 1
            start = end + 1
        if start < stop:
            line_no = self._lines(data, start, stop, line_no, source)
        return line_no

    def _overlong_lines(self, data: bytes, stop: int) -> list[tuple[int, int]]:
        """(start, newline offset) of each line in ``data[:stop]`` longer than the limit.

        A line starting at ``start`` is overlong exactly when the next ``limit + 1`` bytes hold
        no newline; otherwise every line up to the last newline in that window is short, so the
        search jumps past it: a few ``rfind`` calls per chunk, each stopping at its window's
        last newline.
        """
        limit = self._max_line
        spans: list[tuple[int, int]] = []
        start = 0
        while stop - start > limit + 1:
            last = data.rfind(b"\n", start, start + limit + 1)
            if last == -1:
                end = data.find(b"\n", start + limit + 1, stop)
                spans.append((start, end))
                start = end + 1
            else:
                start = last + 1
        return spans

    def _lines(self, data: bytes, begin: int, stop: int, first_line: int, source: Source) -> int:
        """Process the lines of ``data[begin:stop]`` (complete, none overlong); return the line
        count after them."""
        if data.find(b"\x00", begin, stop) != -1 or not self._is_text(data, begin, stop):
            return self._slow_chunk(data[begin:stop], first_line, source)
        starts: set[int] = set()
        find, rfind = data.find, data.rfind
        for needle in self._needles:
            hit = find(needle, begin, stop)
            while hit != -1:
                starts.add(rfind(b"\n", begin, hit) + 1 or begin)
                hit = find(needle, find(b"\n", hit, stop), stop)
        position = begin  # everything before this offset has been handed out
        counted_to, line_no = begin, first_line
        if self._follow is not None:
            position, line_no = self._follow_lines(data, begin, stop, line_no, source)
            counted_to = position
        for start in sorted(starts):
            if start < position:
                continue  # already handed over as part of a multi-line block
            line_no += data.count(b"\n", counted_to, start)
            end = find(b"\n", start, stop)
            self._line(data[start:end], line_no + 1, source)
            position = counted_to = end + 1
            line_no += 1
            if self._follow is not None:
                position, line_no = self._follow_lines(data, position, stop, line_no, source)
                counted_to = position
        return line_no + data.count(b"\n", counted_to, stop)

    def _follow_lines(
        self, data: bytes, position: int, stop: int, line_no: int, source: Source
    ) -> tuple[int, int]:
        """Hand a multi-line block's next lines to the detector that asked for them."""
        while self._follow is not None and position < stop:
            end = data.find(b"\n", position, stop)
            self._line(data[position:end], line_no + 1, source)
            position = end + 1
            line_no += 1
        return position, line_no

    @staticmethod
    def _is_text(data: bytes, begin: int, stop: int) -> bool:
        if data.isascii():  # the whole buffer, in place: the common case costs no copy
            return True
        try:
            data[begin:stop].decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def _slow_chunk(self, chunk: bytes, first_line: int, source: Source) -> int:
        line_no = first_line
        for raw in chunk.split(b"\n")[:-1]:
            line_no += 1
            if b"\x00" in raw:
                self.stats.binary_lines += 1
                continue
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                self.stats.binary_lines += 1
                continue
            if self._follow is not None or any(k in raw for k in self._needles):
                self._line(raw, line_no, source)
        return line_no

    def _line(self, raw: bytes, line_no: int, source: Source) -> None:
        line = normalize.clean(raw.decode("utf-8", errors="replace"))
        where = Location(source.name, line_no)
        follower = self._follow
        self._follow = None
        if follower is not None and follower.feed(line, where, source):
            self._follow = follower
        for detector, keywords in self._routes:
            if detector is follower:
                continue
            for keyword in keywords:
                if keyword in line:
                    if detector.feed(line, where, source):
                        self._follow = detector
                    break

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for detector in self.detectors:
            out.extend(detector.findings())
            self.stats.dropped_findings += detector.dropped
        return out
