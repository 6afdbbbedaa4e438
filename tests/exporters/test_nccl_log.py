"""NCCL debug log parsing (fixtures written from NCCL's INFO/WARN formats) and tail -F following."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.exporters.conftest import one, registry_of, scrape, values
from trainguard import contract
from trainguard.contract import NcclErrorKind
from trainguard.exporters.collectors.nccl import NcclCollector
from trainguard.exporters.nccl_follow import ChildProcessSource, PollingSource
from trainguard.exporters.nccl_log import (
    Channels,
    CommInit,
    Communicator,
    Connection,
    LogFollower,
    NcclLogState,
    NcclWarning,
    NetDevices,
    Trees,
    UsingNetwork,
    Version,
    classify_warning,
    parse_line,
    transport_of,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _state_of(*names: str) -> NcclLogState:
    state = NcclLogState()
    for name in names:
        state.feed(name, (FIXTURES / name).read_bytes().split(b"\n"))
    return state


def _comms(state: NcclLogState) -> dict[str, Communicator]:
    return {c.comm_id: c for c in state.snapshot()[0]}


@pytest.mark.parametrize(
    ("line", "record"),
    [
        (b"h:1:2 [0] NCCL INFO NCCL version 2.18.5+cuda12.2", Version(1, "2.18.5")),
        (b"NCCL version 2.21.5+cuda12.4", Version(0, "2.21.5")),
        (
            b"h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE "
            b"; OOB ib0:10.0.0.1<0>",
            NetDevices(1, "mlx5_0:1,mlx5_1:1"),
        ),
        (b"h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>", NetDevices(1, "eth0")),
        (b"h:1:2 [0] NCCL INFO Using network IB", UsingNetwork(1, "IB")),
        (b"h:1:2 [0] NCCL INFO Using network AWS Libfabric", UsingNetwork(1, "AWS Libfabric")),
        (
            b"h:1:2 [3] NCCL INFO Channel 01/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA",
            Connection(1, 2, "NET/IB"),
        ),
        (
            b"h:1:2 [3] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/CUMEM/read",
            Connection(1, 2, "P2P"),
        ),
        (
            b"h:1:2 [3] NCCL INFO Channel 00 : 1[1] -> 2[0] via NET/Socket/0",
            Connection(1, 2, "NET/Socket"),
        ),
        (b"h:1:2 [3] NCCL INFO Channel 07/16 :    0   1   2   3", Channels(1, 2, 16)),
        (
            b"h:1:2 [3] NCCL INFO 24 coll channels, 0 nvls channels, 32 p2p channels",
            Channels(1, 2, 24),
        ),
        (b"h:1:2 [3] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1", Trees(1, 2, 2)),
        (
            b"h:1:2 [0] NCCL INFO comm 0x55d4 rank 3 nranks 8 cudaDev 3 busId 3b000 "
            b"- Init COMPLETE",
            CommInit(1, 2, "0x55d4", 3, 8, "", complete=True),
        ),
        (
            b"h:1:2 [0] NCCL INFO ncclCommInitRank comm 0xab rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
            b"busId 18000 commId 0x1f2e - Init START",
            CommInit(1, 2, "0xab", 0, 2, "0x1f2e", complete=False),
        ),
        (
            b"h:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by peer",
            NcclWarning(1, NcclErrorKind.SOCKET),
        ),
        # NCCL 2.2x: WARN lines start with a timestamp by default and name the function too.
        (
            b"[2025-01-01 10:00:00] h:1:2 [0] transport/net_ib.cc:1295 (ncclIbTest) NCCL WARN "
            b"NET/IB : Got completion from peer 10.0.0.2<4321> with status=12 opcode=0",
            NcclWarning(1, NcclErrorKind.IB),
        ),
    ],
)
def test_parse_line(line: bytes, record: object) -> None:
    assert parse_line(line) == record


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"h:1:2 [0] NCCL INFO P2P Chunksize set to 131072",
        b"h:1:2 [0] NCCL INFO Connected all rings",
        b"h:1:2 [0] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f datatype 7 op 0 root 0",
        b"[rank0]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout",
        b"\x00\xff\xfe\x80garbage\x1b[31m NCCL WARN",
        b"h:1:2 [0] NCCL INFO comm 0x55d4 rank 3 nran",  # cut off mid-line
        b"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via",
        bytes(range(256)),
    ],
)
def test_lines_that_say_nothing_exported_are_none(line: bytes) -> None:
    assert parse_line(line) is None


def test_transport_names() -> None:
    assert transport_of(b"NET/IBext_v8/0/GDRDMA") == "NET/IBext_v8"
    assert transport_of(b"SHM/direct/direct") == "SHM"
    assert transport_of(b"CollNet/0") == "CollNet"


def test_warning_kinds_from_the_fixture() -> None:
    state = _state_of("nccl-warnings.log")
    _, errors = state.snapshot()
    assert errors == {
        NcclErrorKind.IB: 2,
        NcclErrorKind.PROXY: 1,
        NcclErrorKind.SOCKET: 1,
        NcclErrorKind.CUDA: 1,
        NcclErrorKind.TIMEOUT: 1,
        NcclErrorKind.INVALID_USAGE: 1,  # "Invalid config ...": NCCL returns ncclInvalidArgument
        NcclErrorKind.SYSTEM: 1,
        NcclErrorKind.OTHER: 1,
    }
    assert classify_warning(b"enqueue.cc:1", b"Cuda failure 'out of memory'") is NcclErrorKind.CUDA
    # bytes that are not UTF-8 are still classified (latin-1 decodes anything)
    assert classify_warning(b"\xff\xfe socket.cc:1", b"Connection refused") is NcclErrorKind.SOCKET


def test_nccl_2_18_multi_node_infiniband() -> None:
    comm = _comms(_state_of("nccl-2.18.5-ib.log"))["0x7e1b2c3d4e5f6a7b"]
    assert comm.version == "2.18.5"
    assert comm.transport == "NET/IB,P2P"
    assert comm.network == "IB"
    assert comm.interface == "mlx5_0:1,mlx5_1:1"
    assert (comm.rank, comm.nranks, comm.channels, comm.trees) == (0, 16, 4, 4)


def test_nccl_2_7_socket_fallback_without_comm_id() -> None:
    comms = _comms(_state_of("nccl-2.7.8-socket.log"))
    comm = comms["5120:0x7f3a9c001000"]  # no commId before 2.12: pid and pointer instead
    assert comm.transport == "NET/Socket"
    assert comm.network == "Socket"
    assert comm.version == "2.7.8"
    assert (comm.rank, comm.nranks, comm.channels, comm.trees) == (1, 4, 2, 2)


def test_nccl_2_21_connections_made_after_init_join_their_communicator() -> None:
    comm = _comms(_state_of("nccl-2.21.5-shm-lazy.log"))["0x9a8b7c6d5e4f3a2b"]
    assert comm.transport == "SHM"
    assert comm.interface == "eno1,eno2"
    assert comm.channels == 2


def test_communicators_are_bounded() -> None:
    state = NcclLogState(max_communicators=3)
    lines = [
        f"h:{pid}:{pid} [0] NCCL INFO comm 0x{pid:x} rank 0 nranks 2 - Init COMPLETE".encode()
        for pid in range(10)
    ]
    state.feed("f", lines)
    assert [c.comm_id for c in state.snapshot()[0]] == ["7:0x7", "8:0x8", "9:0x9"]


# --- following ---------------------------------------------------------------------------


def _write(path: Path, data: bytes, mode: str = "ab") -> None:
    with path.open(mode) as f:
        f.write(data)


def _follower(tmp_path: Path, **kwargs: int) -> LogFollower:
    return LogFollower([str(tmp_path / "*.log")], NcclLogState(), **kwargs)


def _warnings(follower: LogFollower) -> int:
    return sum(follower.state.snapshot()[1].values())


WARN = b"h:1:1 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer\n"


def test_partial_lines_wait_for_their_newline(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    follower = _follower(tmp_path)
    _write(log, WARN[:30])
    follower.poll()
    assert _warnings(follower) == 0
    _write(log, WARN[30:])
    follower.poll()
    assert _warnings(follower) == 1
    assert follower.bytes_read == len(WARN)


def test_rotation_reads_the_old_tail_then_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    follower = _follower(tmp_path)
    _write(log, WARN)
    follower.poll()
    _write(log, WARN)  # written after the last poll, before rotation
    log.rename(tmp_path / "rank0.log.1")  # not matched by the glob any more
    _write(log, WARN * 3, "wb")
    follower.poll()
    assert _warnings(follower) == 5
    assert follower.files == 1


def test_rotation_by_rename_over_the_path(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    follower = _follower(tmp_path)
    _write(log, WARN * 2)
    follower.poll()
    replacement = tmp_path / "new.tmp"
    _write(replacement, WARN, "wb")
    replacement.replace(log)  # new inode under the same name
    follower.poll()
    assert _warnings(follower) == 3


def test_truncation_starts_over(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    follower = _follower(tmp_path)
    _write(log, WARN * 4)
    follower.poll()
    _write(log, WARN, "wb")  # truncated in place (copytruncate), same inode
    follower.poll()
    assert _warnings(follower) == 5


def test_binary_garbage_and_overlong_lines_are_dropped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    follower = _follower(tmp_path, max_line_bytes=1024, chunk_bytes=512)
    _write(log, os.urandom(5000).replace(b"\n", b"x"))  # no newline for 5000 bytes
    follower.poll()
    _write(log, b"tail of the garbage\n" + WARN + b"\x00\x01\xff\n" + WARN)
    follower.poll()
    assert follower.lines_dropped == 1
    assert _warnings(follower) == 2


def test_files_appearing_later_and_deleted_files(tmp_path: Path) -> None:
    follower = _follower(tmp_path)
    follower.poll()
    assert follower.files == 0
    _write(tmp_path / "a.log", WARN)
    _write(tmp_path / "b.log", WARN + WARN[:10])  # deleted before its last line ended
    follower.poll()
    assert follower.files == 2
    (tmp_path / "b.log").unlink()
    follower.poll()
    assert follower.files == 1
    assert _warnings(follower) == 2
    follower.close()


def test_collector_exports_info_and_every_error_kind(tmp_path: Path) -> None:
    for name in ("nccl-2.18.5-ib.log", "nccl-warnings.log"):
        _write(tmp_path / name, (FIXTURES / name).read_bytes(), "wb")
    collector = NcclCollector(PollingSource(_follower(tmp_path)))
    registry, _ = registry_of({"nccl": collector})
    samples = scrape(registry)
    info = values(samples, "trainguard_nccl_info")
    assert len(info) == 1
    assert dict(next(iter(info))) == {
        "version": "2.18.5",
        "transport": "NET/IB,P2P",
        "network": "IB",
        "interface": "mlx5_0:1,mlx5_1:1",
        "nranks": "16",
        "channels": "4",
        "trees": "4",
        "comm_id": "0x7e1b2c3d4e5f6a7b",
        "rank": "0",
    }
    errors = values(samples, contract.NCCL_LOG_ERRORS.name)
    assert len(errors) == len(NcclErrorKind)
    assert one(samples, contract.NCCL_LOG_ERRORS.name, kind="ib") == 2.0
    assert one(samples, contract.NCCL_LOG_FILES.name) == 2.0
    assert one(samples, contract.NCCL_LOG_BYTES.name) > 0


def test_collector_follows_in_a_child_process(tmp_path: Path) -> None:
    _write(tmp_path / "r.log", WARN)
    source = ChildProcessSource([str(tmp_path / "*.log")], interval=0.05)
    registry, _ = registry_of({"nccl": NcclCollector(source)})
    deadline = time.monotonic() + 60
    while one(scrape(registry), contract.NCCL_LOG_ERRORS.name, kind="socket") == 0.0:
        assert time.monotonic() < deadline, "the follower process never reported"
        time.sleep(0.05)
    _write(tmp_path / "r.log", WARN)  # appended later: picked up at the next period
    while one(scrape(registry), contract.NCCL_LOG_ERRORS.name, kind="socket") == 1.0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = source.pid
    assert pid is not None
    # Lowered by the parent as soon as it started, not by the child after its imports.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(own + 10, 19)
    os.kill(pid, signal.SIGKILL)  # a dead follower is restarted and the scrape says so
    while source.pid == pid or not source.snapshot().bytes_read:
        samples = scrape(registry)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="nccl") == 0.0
    source.close()
    assert source.pid is None


def test_a_large_backlog_is_read_in_bounded_polls(tmp_path: Path) -> None:
    _write(tmp_path / "big.log", WARN * 1000)
    follower = _follower(tmp_path, chunk_bytes=4096)
    first = follower.poll(max_bytes=10_000)
    assert 10_000 <= first < 10_000 + 4096
    assert follower.poll() == len(WARN) * 1000 - first
    assert _warnings(follower) == 1000


def test_feed_block_equals_feeding_lines() -> None:
    data = b"".join(path.read_bytes() for path in sorted(FIXTURES.glob("*.log")))
    data += b"\x00\xffNCCL WARN\nNCCL version 2.19.3+cuda12.3\nNCCL INFO NCCL version x\n"
    by_lines, by_block = NcclLogState(), NcclLogState()
    by_lines.feed("f", data.split(b"\n"))
    by_block.feed_block("f", data)
    assert by_block.snapshot() == by_lines.snapshot()
    assert sum(by_block.snapshot()[1].values()) == 9  # the garbage WARN has no prefix


def test_processes_and_half_seen_inits_are_bounded() -> None:
    state = NcclLogState(max_processes=5)
    lines = [f"h:{pid}:{pid} [0] NCCL INFO Channel 00/02 :    0   1".encode() for pid in range(100)]
    lines += [f"h:{pid}:9 [0] NCCL INFO NCCL version 2.18.{pid}".encode() for pid in range(100)]
    state.feed("f", lines)
    assert len(state._pending) == 5
    assert len(state._processes) == 5
