"""The ``trainguard-exporter`` process (also ``trainguard exporter``): one per node.

Chooses the GPU provider (NVML, or the simulated one only when ``--simulate-gpus`` asks for
it), builds the enabled collectors, registers them behind one :class:`ScrapeSupervisor`, and
has a :class:`Sampler` read them every ``--sample.interval`` seconds; ``/metrics`` serves the
last sample until SIGTERM or SIGINT. The server is bound first (a busy port fails before any
hardware is touched), then the first sample is taken, then connections are accepted.

Each collector has ``--collector.NAME`` / ``--no-collector.NAME``; without either flag,
``TRAINGUARD_EXPORTER_COLLECTOR_NAME=1|0`` decides, then the collector's default.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from trainguard import contract
from trainguard.exporters import discovery

DEFAULT_LISTEN_ADDRESS = ":9835"
# Defined here rather than in sampler.py and registry.py, which import prometheus_client:
# --help works without it. 5 s: each 15 s scrape sees a reading taken since the last one
# (docs/exporter.md, "Why 5 s").
DEFAULT_SAMPLE_INTERVAL_SECONDS = 5.0
DEFAULT_COLLECTOR_TIMEOUT_SECONDS = 3.0
DEFAULT_NCCL_LOG_GLOB = "/var/log/nccl/*.log"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

log = logging.getLogger("trainguard.exporter")


def _collector_env(name: str) -> str:
    return contract.ENV_EXPORTER_COLLECTOR_PREFIX + name.upper()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=os.environ.get(contract.ENV_EXPORTER_LISTEN_ADDRESS, DEFAULT_LISTEN_ADDRESS),
        help="[host]:port to serve /metrics on (port 0: any free port). "
        f"Env {contract.ENV_EXPORTER_LISTEN_ADDRESS}. Default %(default)s.",
    )
    parser.add_argument(
        "--sample.interval",
        dest="sample_interval",
        metavar="SECONDS",
        help="seconds between two readings of every collector; scrapes serve the last one. "
        f"Env {contract.ENV_EXPORTER_SAMPLE_INTERVAL}. "
        f"Default {DEFAULT_SAMPLE_INTERVAL_SECONDS:g}.",
    )
    parser.add_argument(
        "--sample.timeout",
        dest="sample_timeout",
        metavar="SECONDS",
        help="how long one collector may take before it is abandoned and counted as timed out "
        f"(at most the interval). Env {contract.ENV_EXPORTER_SAMPLE_TIMEOUT}. "
        f"Default {DEFAULT_COLLECTOR_TIMEOUT_SECONDS:g}, or the interval if shorter.",
    )
    parser.add_argument(
        "--nccl.log-glob",
        dest="nccl_log_globs",
        action="append",
        help="glob of NCCL_DEBUG_FILE files to follow; repeatable. "
        f"Env {contract.ENV_EXPORTER_NCCL_LOG_GLOB} (colon-separated). "
        f"Default {DEFAULT_NCCL_LOG_GLOB}.",
    )
    parser.add_argument(
        "--dcgm-compat",
        action="store_true",
        help="also export dcgm-exporter's default names and labels (DCGM_FI_DEV_*)",
    )
    parser.add_argument(
        "--simulate-gpus",
        type=int,
        metavar="N",
        help="simulate N GPUs whose load follows the local training processes (demos on "
        'machines without GPUs; marked trainguard_exporter_info{provider="simulated"})',
    )
    parser.add_argument(
        "--node",
        default=socket.gethostname(),
        help="this node's name (dcgm-compat hostname label). Default: the hostname.",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        help="the host's /proc (mount it and run with the host's PID namespace in a container)",
    )
    parser.add_argument(
        "--sys-root", type=Path, default=Path("/sys"), help="the host's /sys (IB devices, NICs)"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format",
        default="ecs",
        choices=["ecs", "text"],
        help="ECS JSON (to $TRAINGUARD_LOG_FILE, else stdout) or text on stderr (default ecs)",
    )
    discovery.configure(parser)
    try:
        from trainguard.exporters.registry import registered
    except ImportError:  # the exporter extra is not installed: no collector flags to offer
        return
    for name, spec in registered().items():
        parser.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{spec.help} Env {_collector_env(name)}. "
            f"Default {'on' if spec.enabled_by_default else 'off'}.",
        )


def enabled_collectors(args: argparse.Namespace) -> list[str]:
    """Collector names in registration order: the flag, else the env variable, else default."""
    from trainguard.exporters.registry import registered

    names = []
    for name, spec in registered().items():
        flag: bool | None = getattr(args, f"collector_{name}", None)
        if flag is None:
            env = os.environ.get(_collector_env(name), "").strip().lower()
            if env and env not in _TRUE + _FALSE:
                raise ValueError(f"{_collector_env(name)}={env!r}: expected 1 or 0")
            flag = (env in _TRUE) if env else spec.enabled_by_default
        if flag:
            names.append(name)
    return names


def parse_listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--web.listen-address {value!r}: expected [host]:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def _seconds(flag: str, value: str | None, env: str) -> float | None:
    """A positive number of seconds from the flag, else the env variable, else ``None``."""
    text, source = (value, flag) if value is not None else (os.environ.get(env), env)
    if text is None or not text.strip():
        return None
    problem = f"{source} {text!r}: expected a positive number of seconds"
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(problem) from None
    if not 0 < seconds < float("inf"):  # also refuses nan
        raise ValueError(problem)
    return seconds


def sample_timing(args: argparse.Namespace) -> tuple[float, float]:
    """The sample interval and the collector timeout: flag, else env, else default."""
    interval = _seconds(
        "--sample.interval", args.sample_interval, contract.ENV_EXPORTER_SAMPLE_INTERVAL
    )
    timeout = _seconds(
        "--sample.timeout", args.sample_timeout, contract.ENV_EXPORTER_SAMPLE_TIMEOUT
    )
    interval = DEFAULT_SAMPLE_INTERVAL_SECONDS if interval is None else interval
    if timeout is None:
        return interval, min(DEFAULT_COLLECTOR_TIMEOUT_SECONDS, interval)
    if timeout > interval:
        raise ValueError(
            f"the collector timeout ({timeout:g} s) must not exceed the sample interval "
            f"({interval:g} s)"
        )
    return interval, timeout


def _log_globs(args: argparse.Namespace) -> tuple[str, ...]:
    if args.nccl_log_globs:
        return tuple(args.nccl_log_globs)
    env = os.environ.get(contract.ENV_EXPORTER_NCCL_LOG_GLOB)
    if env is not None:
        return tuple(g for g in env.split(":") if g)
    return (DEFAULT_NCCL_LOG_GLOB,)


def run(args: argparse.Namespace) -> int:
    try:
        import ecs_logging  # noqa: F401  (the exporter extra's dependencies)
        import prometheus_client  # noqa: F401
        import psutil  # noqa: F401
    except ImportError as error:
        print(
            f"trainguard-exporter: {error.name} is missing; "
            "install the exporter extra: pip install 'trainguard[exporter]'",
            file=sys.stderr,
        )
        return 2
    from prometheus_client import CollectorRegistry, ProcessCollector

    from trainguard.exporters.procs import ProcfsSource, SysfsHost
    from trainguard.exporters.provider import GpuProvider
    from trainguard.exporters.registry import (
        ExporterContext,
        ExporterSettings,
        ScrapeSupervisor,
        registered,
    )
    from trainguard.exporters.sampler import Sampler
    from trainguard.exporters.serving import metrics_server, serve_in_background
    from trainguard.logs import configure_process_logging

    configure_process_logging(
        service_name=contract.SERVICE_EXPORTER,
        dataset="exporter",
        level=args.log_level,
        log_format=args.log_format,
    )
    try:
        host, port = parse_listen_address(args.listen_address)
        interval, timeout = sample_timing(args)
        names = enabled_collectors(args)
        registering = discovery.settings(args)
    except ValueError as error:
        print(f"trainguard-exporter: {error}", file=sys.stderr)
        return 2
    processes = ProcfsSource(args.proc_root)
    provider: GpuProvider
    if args.simulate_gpus is not None:
        from trainguard.exporters.simulated import SimulatedProvider

        if args.simulate_gpus < 1:
            print("trainguard-exporter: --simulate-gpus needs N >= 1", file=sys.stderr)
            return 2
        provider = SimulatedProvider(args.simulate_gpus, processes)
        log.warning("simulating %d GPUs: every GPU value is made up", args.simulate_gpus)
    else:
        from trainguard.exporters.nvml import NvmlProvider

        provider = NvmlProvider()
    settings = ExporterSettings(
        hostname=args.node, dcgm_compat=args.dcgm_compat, nccl_log_globs=_log_globs(args)
    )
    context = ExporterContext(provider, processes, SysfsHost(args.sys_root), settings)
    specs = registered()
    supervisor = ScrapeSupervisor(
        {n: specs[n].factory(context) for n in names}, provider.kind, timeout=timeout
    )
    registry = CollectorRegistry()
    registry.register(supervisor)
    ProcessCollector(registry=registry)  # the exporter's own CPU and memory
    sampler = Sampler(registry, interval)
    try:
        server = metrics_server(sampler.current, host, port)
    except OSError as error:
        print(
            f"trainguard-exporter: cannot listen on {args.listen_address}: {error}", file=sys.stderr
        )
        supervisor.close()
        provider.close()
        return 1
    sampler.start()  # the first sample, before any connection is accepted
    serve_in_background(server)
    bound = server.server_address[1]
    registration = discovery.start(registering, host, bound, args.node)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    print(
        f"trainguard-exporter listening on http://{shown}:{bound}/metrics "
        f"(provider {provider.kind}; collectors {', '.join(names) or 'none'})",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop.wait()
    if registration is not None:
        registration.stop()
    server.shutdown()
    server.server_close()
    sampler.close()
    supervisor.close()
    provider.close()
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``trainguard-exporter`` console script."""
    parser = argparse.ArgumentParser(
        prog="trainguard-exporter", description="trainguard's node exporter (GPUs, NCCL)."
    )
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
