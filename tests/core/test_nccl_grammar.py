"""The NCCL log grammar: every error kind from lines of the exporter's and triage's fixtures,
and the order of its rules (the more specific first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.contract import NcclErrorKind
from trainguard.nccl_grammar import ADVICE, RULES, classify

TESTS = Path(__file__).resolve().parents[1]
EXPORTER = TESTS / "exporters" / "fixtures" / "nccl-warnings.log"
TRIAGE_ERRORS = TESTS / "triage" / "fixtures" / "nccl_errors.log"
TRIAGE_INIT = TESTS / "triage" / "fixtures" / "nccl_init_errors.log"

K = NcclErrorKind

# (fixture, 1-based line, kind): NCCL WARN lines and the errors torch raises from them.
CASES = [
    (TRIAGE_ERRORS, 10, K.REMOTE),  # NCCL error: remote process exited or ... network error
    (EXPORTER, 6, K.CUDA),  # Cuda failure 'an illegal memory access was encountered'
    (TRIAGE_ERRORS, 20, K.CUDA),  # Cuda failure 'out of memory'
    (TRIAGE_ERRORS, 22, K.CUDA),  # unhandled cuda error
    (TRIAGE_ERRORS, 16, K.SYSTEM),  # unhandled system error
    (EXPORTER, 10, K.SYSTEM),  # failed to extend /dev/shm/...
    (TRIAGE_INIT, 19, K.INTERNAL),  # internal error - please report this issue
    (TRIAGE_INIT, 12, K.INVALID_USAGE),  # invalid usage
    (TRIAGE_INIT, 4, K.INVALID_USAGE),  # Duplicate GPU detected ... on CUDA device
    (EXPORTER, 9, K.INVALID_USAGE),  # Invalid config blocking attribute (ncclInvalidArgument)
    (EXPORTER, 1, K.IB),  # NET/IB : Got completion ... status=12
    (EXPORTER, 7, K.IB),  # Call to ibv_reg_mr failed ... Cannot allocate memory
    (TRIAGE_ERRORS, 6, K.IB),
    (EXPORTER, 5, K.SOCKET),  # socketProgress: Connection closed by remote peer
    (TRIAGE_ERRORS, 14, K.SOCKET),  # socketStartConnect: Connect to ... failed
    (EXPORTER, 8, K.TIMEOUT),  # Bootstrap : timeout waiting for peer 5 to connect
    (EXPORTER, 4, K.PROXY),  # proxy.cc [Service thread] Error encountered progressing
    (EXPORTER, 11, K.OTHER),  # Attribute busid of node nic not found
    (TRIAGE_INIT, 16, K.OTHER),
]


def line_of(path: Path, number: int) -> str:
    return path.read_text().splitlines()[number - 1]


@pytest.mark.parametrize(
    ("path", "number", "kind"), CASES, ids=[f"{p.name}:{n}" for p, n, _ in CASES]
)
def test_fixture_lines_by_kind(path: Path, number: int, kind: NcclErrorKind) -> None:
    line = line_of(path, number)
    assert "NCCL WARN" in line or "NCCL error" in line
    assert classify(line) is kind


def test_every_kind_has_a_fixture_line_a_rule_and_advice() -> None:
    assert {kind for _, _, kind in CASES} == set(NcclErrorKind)
    assert {kind for kind, _ in RULES} == set(NcclErrorKind) - {K.OTHER}
    assert set(ADVICE) == set(NcclErrorKind)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        # a result code wins over the subsystems its text names
        (
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
            K.SYSTEM,
        ),
        ("NET/IB : ncclRemoteError: remote process exited", K.REMOTE),
        # TCP's own "timed out" is a socket failure, not NCCL waiting for a peer
        (
            "socket.cc:1 socketConnect: Connect to 10.0.0.2<1234> failed : Connection timed out",
            K.SOCKET,
        ),
        # an IB line that mentions a connection stays IB
        ("net_ib.cc:1 NET/IB : connection closed by peer", K.IB),
        # "CUDA" in a device name or version is no CUDA failure when something else matches
        (
            "init.cc:1 Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000",
            K.INVALID_USAGE,
        ),
        ("misc/cudawrap.cc:1 cuMemCreate failed", K.CUDA),
        ("NCCL version 2.21.5+cuda12.4", K.OTHER),
        ("", K.OTHER),
    ],
)
def test_rule_order(message: str, kind: NcclErrorKind) -> None:
    assert classify(message) is kind
