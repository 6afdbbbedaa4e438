"""torch's Flight Recorder analyzer over a stall's dumps: the collective some ranks never joined.

The hook writes every rank's Flight Recorder trace into one folder when a collective stalls
(``trainguard.instrumentation.watchdog``); :func:`analyze` runs torch's own analyzer
(``torch.distributed.flight_recorder``) over that folder. torch is imported only here, and only
when a diagnosis has dumps to read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trainguard import contract

# The logger torch's analyzer (torch.distributed.flight_recorder) writes its findings to.
ANALYZER_LOGGER = "Flight Recorder"


@dataclass(frozen=True, slots=True)
class CollectiveMismatch:
    """One finding of torch's analyzer: a collective some ranks never joined."""

    collective_seq_id: int
    name: str
    process_group: str
    missing_ranks: frozenset[int]


def analyze(dump_dir: Path, allow_incomplete: bool = False) -> list[CollectiveMismatch]:
    """Run torch's Flight Recorder analyzer over every rank's dump in ``dump_dir``.

    The analyzer reports through its own logger, which writes to stderr; its findings come back
    here as :class:`CollectiveMismatch` values, so that logger is muted while it runs (a
    diagnosis or the demo's terminal view would otherwise print every mismatch twice).
    """
    analyzer_log = logging.getLogger(ANALYZER_LOGGER)
    muted = analyzer_log.disabled
    analyzer_log.disabled = True
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir

        argv = [str(dump_dir), "--prefix", contract.FLIGHT_RECORDER_DUMP_PREFIX]
        if allow_incomplete:
            argv.append("--allow-incomplete-ranks")
        args = JobConfig().parse_args(argv)
        details, version = read_dir(args)
        database = build_db(details, args, version)
    finally:
        analyzer_log.disabled = muted
    return [
        CollectiveMismatch(
            collective_seq_id=int(c.collective_seq_id),
            name=str(c.collective_name),
            process_group=str(c.pg_desc),
            missing_ranks=frozenset(c.missing_ranks or ()),
        )
        for c in database.collectives
        if c.missing_ranks
    ]
