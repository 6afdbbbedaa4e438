"""deploy/filebeat.yml reads what configure_logging writes and targets the same data streams."""

from __future__ import annotations

import json
import logging
import re
import uuid
from pathlib import Path
from typing import Any

import yaml

from trainguard.logs import configure_logging, data_stream_name

FILEBEAT = Path(__file__).parents[2] / "deploy" / "filebeat.yml"


def load() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(FILEBEAT.read_text())
    return config


def test_filestream_input_with_an_ndjson_parser_at_the_top_level() -> None:
    (source,) = load()["filebeat.inputs"]
    assert source["type"] == "filestream"
    assert source["id"]
    (parser,) = source["parsers"]
    ndjson = parser["ndjson"]
    assert ndjson["target"] == ""
    assert ndjson["overwrite_keys"] is True and ndjson["expand_keys"] is True
    assert any(path.endswith("/*.ndjson") for path in source["paths"])


def test_output_index_is_the_data_stream_of_each_record(tmp_path: Path) -> None:
    logger = logging.getLogger(f"trainguard.test.{uuid.uuid4().hex}")
    logger.propagate = False
    log_file = tmp_path / "rank0.ndjson"
    setup = configure_logging(
        service_name="svc", file=log_file, dataset="rank", namespace="prod", logger=logger
    )
    logger.info("hello")
    setup.close()
    record = json.loads(log_file.read_text())
    # Filebeat's expand_keys turns the formatter's dotted keys into objects, as below.
    fields = {**record, **record.get("data_stream", {})}
    index = re.sub(
        r"%\{\[data_stream\.(\w+)\]\}",
        lambda m: str(fields[m.group(1)]),
        load()["output.elasticsearch"]["index"],
    )
    assert index == data_stream_name("rank", "prod")
    # the trainguard template, not Filebeat's, applies to that stream
    assert load()["setup.template.enabled"] is False
