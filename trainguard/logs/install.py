"""Idempotent setup of Elasticsearch and Kibana for trainguard's logs.

Installs an ILM policy (rollover, then delete after a configurable age), an index template
for the data streams ``logs-trainguard.*-*`` that applies the policy and maps our labels and
trace ids as keywords on top of Elasticsearch's own ``logs@*``/``ecs@mappings`` component
templates, and a Kibana data view over those streams. Each object carries a hash of its
definition in ``_meta``; a second install with the same definition changes nothing, a changed
definition (a new retention, say) replaces the old one.

The two halves can run apart: :meth:`ElasticsearchInstaller.install_elasticsearch` is what
indexing needs (the template must exist before the first event creates the data stream), while
:meth:`ElasticsearchInstaller.install_data_view` only serves people browsing in Kibana, so the
direct shipper never lets it hold up delivery.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticsearch import Elasticsearch, NotFoundError

from trainguard import contract

# Elasticsearch's built-in component templates for logs; missing ones (older clusters) are
# tolerated so the template installs everywhere.
_COMPONENTS = ["logs@mappings", "logs@settings", "ecs@mappings"]
# Above the built-in "logs" template (priority 100) that also matches logs-*-*.
TEMPLATE_PRIORITY = 200
DATA_VIEW_ID = "trainguard-logs"

_KEYWORD = {"type": "keyword"}
_MAPPINGS: dict[str, Any] = {
    "properties": {
        "@timestamp": {"type": "date"},
        "message": {"type": "match_only_text"},
        "labels": {
            "properties": {
                contract.LABEL_JOB_ID: _KEYWORD,
                contract.LABEL_RANK: _KEYWORD,
                contract.LABEL_NODE: _KEYWORD,
                "step": _KEYWORD,
            }
        },
        "trace": {"properties": {"id": _KEYWORD}},
        "span": {"properties": {"id": _KEYWORD}},
        "event": {
            "properties": {
                "kind": _KEYWORD,
                "category": _KEYWORD,
                "action": _KEYWORD,
                "outcome": _KEYWORD,
                "dataset": _KEYWORD,
            }
        },
        "service": {"properties": {"name": _KEYWORD}},
        "host": {"properties": {"name": _KEYWORD}},
        # Event details differ per event kind; flattened keeps them searchable without a
        # mapping explosion.
        contract.FIELD_DETAILS: {"type": "flattened"},
    }
}


class InstallError(RuntimeError):
    """Kibana refused or could not be reached (Elasticsearch errors keep their own types)."""


@dataclass(frozen=True)
class Retention:
    """ILM: roll the backing index over at an age or size, delete it ``delete_after`` later."""

    rollover_max_age: str = "1d"
    rollover_max_primary_shard_size: str = "50gb"
    delete_after: str = "30d"


def _with_hash(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return body, digest


class ElasticsearchInstaller:
    """Installs the ILM policy, index template and Kibana data view; safe to run repeatedly."""

    def __init__(
        self,
        client: Elasticsearch,
        *,
        retention: Retention | None = None,
        kibana_url: str | None = None,
        kibana_headers: Mapping[str, str] | None = None,
        name: str = contract.LOG_DATA_STREAM_PREFIX,
        timeout: float = 10.0,
    ) -> None:
        self._client = client
        self.retention = retention or Retention()
        self._kibana_url = kibana_url.rstrip("/") if kibana_url else None
        self._kibana_headers = dict(kibana_headers or {})
        self.name = name
        self._timeout = timeout

    # --- definitions --------------------------------------------------------------------------
    def policy(self) -> dict[str, Any]:
        r = self.retention
        return {
            "phases": {
                "hot": {
                    "actions": {
                        "rollover": {
                            "max_age": r.rollover_max_age,
                            "max_primary_shard_size": r.rollover_max_primary_shard_size,
                        }
                    }
                },
                "delete": {"min_age": r.delete_after, "actions": {"delete": {}}},
            }
        }

    def template(self) -> dict[str, Any]:
        return {
            "index_patterns": [f"{self.name}.*-*"],
            "data_stream": {},
            "priority": TEMPLATE_PRIORITY,
            "composed_of": list(_COMPONENTS),
            "ignore_missing_component_templates": list(_COMPONENTS),
            "template": {
                "settings": {"index.lifecycle.name": self.name},
                "mappings": _MAPPINGS,
            },
        }

    def data_view(self) -> dict[str, Any]:
        return {
            "id": DATA_VIEW_ID,
            "title": f"{self.name}.*",
            "name": "trainguard logs",
            "timeFieldName": "@timestamp",
        }

    @property
    def has_kibana(self) -> bool:
        """Whether a Kibana URL was given, so there is a data view to install."""
        return self._kibana_url is not None

    # --- install ------------------------------------------------------------------------------
    def install(self) -> list[str]:
        """Bring every object up to date; returns the names of those created or replaced."""
        changed = self.install_elasticsearch()
        if self.install_data_view():
            changed.append("data_view")
        return changed

    def install_elasticsearch(self) -> list[str]:
        """The ILM policy and index template; returns the names of those created or replaced."""
        changed = []
        if self._ensure_policy():
            changed.append("ilm_policy")
        if self._ensure_template():
            changed.append("index_template")
        return changed

    def install_data_view(self) -> bool:
        """The Kibana data view, when a Kibana URL was given; True if it was created."""
        return self._kibana_url is not None and self._ensure_data_view()

    def _ensure_policy(self) -> bool:
        policy, digest = _with_hash(self.policy())
        try:
            current = self._client.ilm.get_lifecycle(name=self.name).body
            existing = current.get(self.name, {}).get("policy", {})
            if existing.get("_meta", {}).get("hash") == digest:
                return False
        except NotFoundError:
            pass
        self._client.ilm.put_lifecycle(
            name=self.name, policy={**policy, "_meta": {"managed_by": "trainguard", "hash": digest}}
        )
        return True

    def _ensure_template(self) -> bool:
        template, digest = _with_hash(self.template())
        try:
            current = self._client.indices.get_index_template(name=self.name).body
            for entry in current.get("index_templates", []):
                meta = entry.get("index_template", {}).get("_meta", {})
                if entry.get("name") == self.name and meta.get("hash") == digest:
                    return False
        except NotFoundError:
            pass
        self._client.indices.put_index_template(
            name=self.name, meta={"managed_by": "trainguard", "hash": digest}, **template
        )
        return True

    def _ensure_data_view(self) -> bool:
        view = self.data_view()
        status, _ = self._kibana("GET", f"/api/data_views/data_view/{view['id']}")
        if status == 200:
            return False
        if status != 404:
            raise InstallError(f"Kibana answered {status} when looking up the data view")
        status, body = self._kibana("POST", "/api/data_views/data_view", {"data_view": view})
        if status != 200:
            raise InstallError(f"Kibana answered {status} creating the data view: {body[:200]}")
        return True

    def _kibana(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self._kibana_url}{path}", data=data, method=method)
        request.add_header("kbn-xsrf", "trainguard")
        request.add_header("Content-Type", "application/json")
        for header, value in self._kibana_headers.items():
            request.add_header(header, value)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as error:
            raise InstallError(f"cannot reach Kibana at {self._kibana_url}: {error}") from error
