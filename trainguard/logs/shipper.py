"""Direct shipping of log records to Elasticsearch, for setups without Filebeat.

:class:`ElasticsearchShipper` is a ``logging.Handler``. ``emit`` formats the record as ECS JSON
and appends it to a disk :class:`~trainguard.logs.spool.Spool`; that is the moment the event
is *accepted*. A background thread reads the spool in order and sends batches with
``elasticsearch.helpers.streaming_bulk`` as ``create`` operations into the data stream
``logs-trainguard.<dataset>-<namespace>``:

- a batch is resolved item by item: indexed, or 409 (already there from a send interrupted by
  a crash: the ids are stable), or rejected for good (a 4xx such as a mapping error: written to
  ``dead-letter.ndjson`` beside the spool with the reason, never silently dropped);
- items answered 429 or 5xx, a whole request answered 429/5xx, and connection failures are
  retried with capped exponential backoff; the next batch is never sent before the current one
  is resolved, so delivery resumes in order;
- a whole request answered 413 (too large for Elasticsearch's ``http.max_content_length`` or a
  proxy's limit) is split in halves, sent in order, down to single events; a single event still
  answered 413 can never be indexed and goes to the dead-letter file;
- a whole request answered another 4xx (401/403: a bad or unprivileged API key) says nothing
  about the events: they stay spooled and are retried with capped backoff, and the refusal is
  reported once on standard error;
- the cursor advances only past a resolved batch, so a restart resends at most one batch.

The spool's disk use is bounded; an event that does not fit is refused and counted in
:attr:`ElasticsearchShipper.stats` (``refused``), with a warning on standard error. On startup
the thread first installs the ILM policy and index template with
:class:`~trainguard.logs.install.ElasticsearchInstaller`, retrying until it succeeds, before it
ships: the data stream must get our mappings. The optional Kibana data view is installed by a
thread of its own, retried with backoff until Kibana answers, so a Kibana outage never holds up
delivery.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_transport import TransportError
from elasticsearch import ApiError, Elasticsearch
from elasticsearch.helpers import streaming_bulk

from trainguard.background import BackgroundThread
from trainguard.logs.config import (
    DEFAULT_DATASET,
    DEFAULT_NAMESPACE,
    data_stream_name,
    ecs_formatter,
)
from trainguard.logs.install import ElasticsearchInstaller, InstallError
from trainguard.logs.spool import Entry, Spool

DEAD_LETTER_FILE = "dead-letter.ndjson"
_TOO_LARGE = 413
# 4xx answers to a whole request that only say "try again later".
_TRANSIENT_4XX = frozenset({408, 429})


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): doubling from ``initial``, capped."""
    # The exponent is capped too: 2**attempt as a float overflows after ~1000 retries, which a
    # long outage at a 60 s cap reaches in under a day.
    return min(maximum, initial * 2.0 ** min(attempt, 64))


def _is_refusal(status: int) -> bool:
    """A 4xx for the whole request that waiting alone will not cure (a bad key, a wrong URL)."""
    return 400 <= status < 500 and status not in _TRANSIENT_4XX


@dataclass
class ShipperStats:
    """Counters of what the shipper did since it started (not persisted)."""

    accepted: int = 0  # written to the spool
    refused: int = 0  # did not fit in the spool's disk budget
    shipped: int = 0  # indexed by Elasticsearch
    duplicates: int = 0  # answered 409: Elasticsearch already had them
    rejected: int = 0  # refused by Elasticsearch for good, kept in the dead-letter file
    dead_letter_dropped: int = 0  # rejected and the dead-letter file was full as well
    retries: int = 0  # batches (or their remainders) sent again after a failure
    splits: int = 0  # batches split in two after a whole-request 413
    request_refusals: int = 0  # whole requests answered another 4xx: events kept, retried
    data_view_failures: int = 0  # failed attempts to install the Kibana data view
    data_view_installed: bool = False
    last_error: str | None = None


class ElasticsearchShipper(logging.Handler):
    """A logging handler that spools records to disk and ships them to Elasticsearch."""

    def __init__(
        self,
        client: Elasticsearch,
        spool_dir: str | Path,
        *,
        dataset: str = DEFAULT_DATASET,
        namespace: str = DEFAULT_NAMESPACE,
        max_spool_bytes: int = 1 << 30,
        segment_bytes: int | None = None,
        batch_size: int = 500,
        batch_bytes: int = 5 << 20,
        flush_interval: float = 1.0,
        initial_backoff: float = 0.5,
        max_backoff: float = 60.0,
        close_timeout: float = 10.0,
        installer: ElasticsearchInstaller | None = None,
        dead_letter_max_bytes: int = 64 << 20,
        level: int = logging.NOTSET,
    ) -> None:
        super().__init__(level)
        self.data_stream = data_stream_name(dataset, namespace)
        self.setFormatter(ecs_formatter())
        self.stats = ShipperStats()
        self._client = client
        self._spool = Spool(
            spool_dir,
            max_bytes=max_spool_bytes,
            segment_bytes=segment_bytes or max(min(64 << 20, max_spool_bytes // 16), 1),
        )
        self._dead_letter = Path(spool_dir) / DEAD_LETTER_FILE
        self._dead_letter_max = dead_letter_max_bytes
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes
        self._flush_interval = flush_interval
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._close_timeout = close_timeout
        self._installer = installer
        self._abort = threading.Event()
        self._progress = threading.Condition()
        self._closed = False
        self._reported_refusal: int | None = None
        # Stopping it means: send what is spooled, then stop (close()); _abort stops at once.
        self._shipping = BackgroundThread("trainguard-es-shipper", self._run)
        self._shipping.start()
        self._data_view: BackgroundThread | None = None
        if installer is not None and installer.has_kibana:
            self._data_view = BackgroundThread("trainguard-kibana-setup", self._install_data_view)
            self._data_view.start()

    @classmethod
    def from_url(
        cls,
        url: str,
        spool_dir: str | Path,
        *,
        api_key: str | None = None,
        kibana_url: str | None = None,
        request_timeout: float = 10.0,
        **options: Any,
    ) -> ElasticsearchShipper:
        """A shipper with its own client; ``options`` go to the constructor."""
        # The shipper retries itself, in order; the client must not retry behind its back.
        client = Elasticsearch(url, api_key=api_key, request_timeout=request_timeout, max_retries=0)
        kibana_headers = {"Authorization": f"ApiKey {api_key}"} if api_key else None
        installer = ElasticsearchInstaller(
            client, kibana_url=kibana_url, kibana_headers=kibana_headers
        )
        return cls(client, spool_dir, installer=installer, **options)

    # --- the logging side -----------------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        # The client's own logging on the shipping thread must not feed back into the spool.
        if record.thread == self._shipping.ident:
            return
        try:
            line = self.format(record).encode("utf-8")
        except Exception:
            self.handleError(record)
            return
        if self._spool.append(line):
            self.stats.accepted += 1
        else:
            self.stats.refused += 1
            if self.stats.refused == 1 or self.stats.refused % 1000 == 0:
                sys.stderr.write(
                    f"trainguard: log spool {self._spool.directory} is full "
                    f"({self._spool.max_bytes} bytes); {self.stats.refused} event(s) refused\n"
                )

    def flush(self) -> None:
        """Ask the shipping thread to send what is spooled now (does not wait)."""
        self._shipping.wake()

    def drain(self, timeout: float) -> bool:
        """Wait until everything accepted so far is resolved; False on timeout."""
        self._shipping.wake()
        with self._progress:
            return self._progress.wait_for(lambda: self._spool.pending_bytes == 0, timeout)

    @property
    def pending_bytes(self) -> int:
        return self._spool.pending_bytes

    def close(self) -> None:
        """Send what can be sent within ``close_timeout``; the rest waits in the spool."""
        if self._closed:
            super().close()
            return
        self._closed = True
        self._shipping.stop(self._close_timeout)
        if self._shipping.alive:
            self._abort.set()
            self._shipping.join(self._close_timeout)
        if not self._shipping.alive:
            self._spool.close()
        if self._data_view is not None:
            self._data_view.stop(self._close_timeout)
        super().close()

    # --- the shipping thread ----------------------------------------------------------------
    def _run(self, loop: BackgroundThread) -> None:
        if self._installer is not None and not self._install_elasticsearch(loop):
            return
        while True:
            entries = self._spool.read(self._batch_size, self._batch_bytes)
            if not entries:
                if loop.stopping:
                    return
                loop.wait_for_work(self._flush_interval)
                continue
            if not self._deliver(entries):
                return
            self._spool.commit(entries[-1].end)
            with self._progress:
                self._progress.notify_all()

    def _install_elasticsearch(self, loop: BackgroundThread) -> bool:
        assert self._installer is not None
        attempt = 0
        while True:
            try:
                self._installer.install_elasticsearch()
                return True
            except (ApiError, TransportError, InstallError) as error:
                self.stats.last_error = f"install: {error}"
            if loop.stopping and self._spool.pending_bytes == 0:
                return False
            if not self._sleep(attempt):
                return False
            attempt += 1

    def _install_data_view(self, loop: BackgroundThread) -> None:
        """Install the Kibana data view, retrying until Kibana answers or the shipper closes."""
        assert self._installer is not None
        attempt = 0
        while True:
            try:
                self._installer.install_data_view()
                self.stats.data_view_installed = True
                return
            except InstallError as error:
                self.stats.data_view_failures += 1
                if self.stats.data_view_failures == 1:
                    sys.stderr.write(
                        f"trainguard: cannot install the Kibana data view ({error}); "
                        "logs are shipped meanwhile, retrying in the background\n"
                    )
            if loop.sleep(self._delay(attempt)):
                return
            attempt += 1

    def _delay(self, attempt: int) -> float:
        jitter = random.uniform(0.8, 1.2)
        return backoff_delay(attempt, self._initial_backoff, self._max_backoff) * jitter

    def _sleep(self, attempt: int) -> bool:
        """Back off before retry ``attempt``; False when the shipper is being torn down."""
        self._abort.wait(self._delay(attempt))
        return not self._abort.is_set()

    def _deliver(self, entries: list[Entry]) -> bool:
        """Send until every entry is indexed, already present or dead-lettered; in order."""
        parts = [entries]  # a stack: the part to send next is last
        while parts:
            pending = {entry.id: entry for entry in parts.pop()}
            attempt = 0
            while True:
                try:
                    request_error = self._send(pending)
                except TransportError as error:  # connection refused, reset, timed out
                    self.stats.last_error = str(error)
                    request_error = None
                if not pending:
                    self._reported_refusal = None
                    break
                if request_error is not None and request_error.status_code == _TOO_LARGE:
                    self._split_or_reject(pending, request_error, parts)
                    break
                if request_error is not None and _is_refusal(request_error.status_code):
                    self._report_refusal(request_error)
                self.stats.retries += 1
                if not self._sleep(attempt):
                    return False
                attempt += 1
        return True

    def _split_or_reject(
        self, pending: dict[str, Entry], refusal: ApiError, parts: list[list[Entry]]
    ) -> None:
        """After a 413: send the unresolved entries as two halves, or dead-letter a lone one."""
        remaining = list(pending.values())
        if len(remaining) == 1:
            self._reject(remaining[0], _TOO_LARGE, str(refusal))
            return
        half = len(remaining) // 2
        parts.extend([remaining[half:], remaining[:half]])
        self.stats.splits += 1

    def _report_refusal(self, refusal: ApiError) -> None:
        """Count a whole-request 4xx; say so once per kind until a batch gets through again."""
        self.stats.request_refusals += 1
        if self._reported_refusal == refusal.status_code:
            return
        self._reported_refusal = refusal.status_code
        sys.stderr.write(
            f"trainguard: Elasticsearch refused the bulk request: {refusal}; check the "
            "shipper's URL and its API key's privileges. The events stay in the spool "
            f"{self._spool.directory} and are retried with backoff\n"
        )

    def _actions(self, pending: dict[str, Entry]) -> Iterator[dict[str, Any]]:
        for entry in list(pending.values()):
            try:
                source = json.loads(entry.line)
            except ValueError as error:
                self._reject(entry, 0, f"spooled line is not JSON: {error}")
                del pending[entry.id]
                continue
            yield {
                "_op_type": "create",
                "_index": self.data_stream,
                "_id": entry.id,
                "_source": source,
            }

    def _send(self, pending: dict[str, Entry]) -> ApiError | None:
        """One bulk round; resolved entries leave ``pending``. Returns a whole-request error."""
        results = streaming_bulk(
            self._client,
            self._actions(pending),
            chunk_size=self._batch_size,
            max_chunk_bytes=self._batch_bytes * 2,
            raise_on_error=False,
            raise_on_exception=False,
            max_retries=0,
            yield_ok=True,
        )
        request_error: ApiError | None = None
        for ok, item in results:
            info = next(iter(item.values()))
            entry = pending.get(str(info.get("_id")))
            if entry is None:
                continue
            status = int(info.get("status") or 0)
            if ok:
                self.stats.shipped += 1
            elif status == 409:
                self.stats.duplicates += 1
            elif "exception" in info or status == 429 or status >= 500 or status == 0:
                # The whole request failed, or this item may succeed later: keep it.
                self.stats.last_error = str(info.get("error"))
                if isinstance(info.get("exception"), ApiError):
                    request_error = info["exception"]
                continue
            else:
                self._reject(entry, status, info.get("error"))
            del pending[entry.id]
        return request_error

    def _reject(self, entry: Entry, status: int, error: Any) -> None:
        record = json.dumps(
            {"id": entry.id, "status": status, "error": error, "event": entry.line.decode()},
            default=str,
        )
        try:
            size = self._dead_letter.stat().st_size
        except FileNotFoundError:
            size = 0
        if size + len(record) + 1 > self._dead_letter_max:
            self.stats.dead_letter_dropped += 1
            return
        with self._dead_letter.open("a", encoding="utf-8") as out:
            out.write(record + "\n")
        self.stats.rejected += 1
