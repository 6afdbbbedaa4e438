"""``trainguard logs-setup``: install the ILM policy, index template and Kibana data view.

For the Filebeat path (``deploy/filebeat.yml``), where no trainguard process talks to
Elasticsearch; the direct shipper runs the same installer itself on startup. Idempotent.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--elasticsearch", required=True, metavar="URL", help="e.g. http://elasticsearch:9200"
    )
    parser.add_argument("--kibana", metavar="URL", help="also create the Kibana data view")
    parser.add_argument("--api-key", help="Elasticsearch/Kibana API key (base64 id:key)")
    parser.add_argument("--rollover-max-age", default="1d", help="ILM hot rollover age (1d)")
    parser.add_argument(
        "--rollover-max-size", default="50gb", help="ILM hot rollover primary shard size (50gb)"
    )
    parser.add_argument("--delete-after", default="30d", help="ILM delete age (30d)")


def run(args: argparse.Namespace) -> int:
    from elastic_transport import TransportError
    from elasticsearch import ApiError, Elasticsearch

    from trainguard.logs.install import ElasticsearchInstaller, InstallError, Retention

    client = Elasticsearch(args.elasticsearch, api_key=args.api_key, request_timeout=30)
    installer = ElasticsearchInstaller(
        client,
        retention=Retention(args.rollover_max_age, args.rollover_max_size, args.delete_after),
        kibana_url=args.kibana,
        kibana_headers={"Authorization": f"ApiKey {args.api_key}"} if args.api_key else None,
    )
    try:
        changed = installer.install()
    except (ApiError, TransportError, InstallError) as error:
        sys.stderr.write(f"logs-setup: {error}\n")
        return 1
    print("installed: " + ", ".join(changed) if changed else "already up to date")
    return 0
