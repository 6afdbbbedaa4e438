"""The demo's rendezvous store, on its own: ``python -m trainguard.demo.rendezvous --port N``.

torchrun's c10d rendezvous keeps its state in a TCP store that one agent hosts (``is_host``) unless
one is already there. Hosted by an agent, the store dies with it, so excluding that agent's node
ends the whole job. A store of its own, as etcd or a head node's store is on a cluster, lets the
remediation service exclude any node; jobs with different ``--rdzv-id`` share it (their keys are
prefixed by it). Runs until it is signalled.
"""

from __future__ import annotations

import argparse
import signal
from datetime import timedelta

from torch._C._distributed_c10d import TCPStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    store = TCPStore(
        args.host, args.port, is_master=True, wait_for_workers=False, timeout=timedelta(hours=1)
    )
    print(f"rendezvous store on {args.host}:{store.port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
