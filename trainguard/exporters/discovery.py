"""The exporter's registration with the remediation service's HTTP service discovery.

With ``--discovery.url`` (or ``TRAINGUARD_DISCOVERY_URL``) the exporter registers its
``/metrics`` address with the node label (``--node``) as an ``exporters`` target at start-up,
renews it on a daemon thread (:class:`trainguard.discovery.Registration`) and withdraws it on
SIGTERM or SIGINT, so Prometheus finds the node exporters through ``http_sd_configs`` without
a file system shared with them. A failure never stops the exporter: the first of each kind is
logged as a warning, later ones at debug level, and the registration is retried.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from trainguard import contract
from trainguard.discovery import DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS, Registration

log = logging.getLogger("trainguard.exporter")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--discovery.url",
        dest="discovery_url",
        default=os.environ.get(contract.ENV_DISCOVERY_URL) or None,
        help="the remediation service (http://remediation:9095) to register this exporter "
        f"with for Prometheus' HTTP service discovery. Env {contract.ENV_DISCOVERY_URL}. "
        "Default: none.",
    )
    parser.add_argument(
        "--discovery.address",
        dest="discovery_address",
        help="host:port Prometheus scrapes this exporter on. Default: the listen address, "
        "with the host name for a wildcard host.",
    )
    parser.add_argument(
        "--discovery.ttl-seconds",
        dest="discovery_ttl_seconds",
        type=float,
        default=None,
        help="how long the registration outlives the exporter's last renewal (renewed every "
        f"third of it). Env {contract.ENV_DISCOVERY_TTL}. Default {DEFAULT_TTL_SECONDS:g}.",
    )
    parser.add_argument(
        "--discovery.token-file",
        dest="discovery_token_file",
        type=Path,
        help="file holding the service's bearer token. "
        f"Default: ${contract.ENV_REMEDIATION_TOKEN}.",
    )


@dataclass(frozen=True)
class DiscoverySettings:
    url: str
    address: str | None
    ttl_seconds: float
    token: str | None


def settings(args: argparse.Namespace) -> DiscoverySettings | None:
    """The registration the flags ask for, None without a URL; raises ValueError for flags
    that cannot work (a TTL under the service's minimum, an unreadable token file)."""
    if not args.discovery_url:
        return None
    ttl = args.discovery_ttl_seconds
    if ttl is None:
        raw = os.environ.get(contract.ENV_DISCOVERY_TTL) or str(DEFAULT_TTL_SECONDS)
        try:
            ttl = float(raw)
        except ValueError:
            raise ValueError(f"{contract.ENV_DISCOVERY_TTL}={raw!r}: expected seconds") from None
    if not ttl >= MIN_TTL_SECONDS:
        raise ValueError(f"--discovery.ttl-seconds {ttl:g}: at least {MIN_TTL_SECONDS:g}")
    token = os.environ.get(contract.ENV_REMEDIATION_TOKEN) or None
    if args.discovery_token_file is not None:
        try:
            token = args.discovery_token_file.read_text(encoding="utf-8").strip() or None
        except OSError as error:
            raise ValueError(f"--discovery.token-file: {error}") from None
    return DiscoverySettings(args.discovery_url, args.discovery_address, ttl, token)


def start(config: DiscoverySettings | None, host: str, port: int, node: str) -> Registration | None:
    """Register the exporter serving on ``host:port`` (as bound) as node ``node``."""
    if config is None:
        return None
    address = config.address
    if address is None:
        shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
        address = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
    seen: set[type[BaseException]] = set()

    def failed(error: BaseException) -> None:
        level = logging.DEBUG if type(error) in seen else logging.WARNING
        seen.add(type(error))
        log.log(
            level, "registration of %s with %s failed (retrying): %s", address, config.url, error
        )

    registration = Registration(
        config.url,
        contract.DiscoveryKind.EXPORTERS,
        address,
        {contract.LABEL_NODE: node},
        token=config.token,
        ttl_seconds=config.ttl_seconds,
        on_error=failed,
    )
    registration.start()
    log.info("registering %s with %s for HTTP service discovery", address, config.url)
    return registration
