"""The nccl_error detector on every wording NCCL 2.7 to 2.30 and its callers print.

Each line below is built from the format string NCCL or torch prints it with (the citation names
the file and release, NVIDIA/nccl tags; tests/triage/corpus/nccl_error/SOURCES.md has the full
table), with values from the corpus's real excerpts. The corpus scores real pastes; this file
pins every source variant, the prefix's shapes, and the multi-line blocks (torch's "Last error",
lines a terminal wrapped) one at a time.
"""

from __future__ import annotations

import io

import pytest

from trainguard.contract import Failure, NcclErrorKind
from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.findings import Finding
from trainguard.triage.scanner import Scanner

K = NcclErrorKind
HOST = "gpu-a17:48211:48377 [3]"  # src/debug.cc: "%s:%d:%d [%d] " host, pid, tid, device


def nccl_findings(text: str, chunk_bytes: int | None = None) -> list[Finding]:
    scanner = (
        Scanner(default_detectors(load_default()))
        if chunk_bytes is None
        else Scanner(default_detectors(load_default()), chunk_bytes=chunk_bytes)
    )
    scanner.scan_stream(io.BytesIO(text.encode()), "rank0.log")
    return [f for f in scanner.findings() if f.failure is Failure.NCCL_ERROR]


def kinds(text: str) -> dict[str, int]:
    return {f.fields["kind"]: f.count for f in nccl_findings(text)}


# --- NCCL's WARN lines: the prefix ------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        # 2.3-2.25: "\n%s:%d:%d [%d] %s:%d NCCL WARN " (src/debug.cc; include/debug.h in 2.3)
        f"{HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<41223> "
        "failed : Connection refused",
        # 2.26+: WARN lines start with "[%F %T] " by default (NCCL_DEBUG_TIMESTAMP_FORMAT,
        # NCCL_DEBUG_TIMESTAMP_LEVELS=WARN; src/debug.cc v2.26.2)
        f"[2026-04-22 21:34:20] {HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect "
        "to 10.0.0.2<41223> failed : Connection refused",
        # a user's NCCL_DEBUG_TIMESTAMP_FORMAT with sub-seconds ("%6f")
        f"2026-04-22T21:34:20.123456 {HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: "
        "Connect to 10.0.0.2<41223> failed : Connection refused",
        # 2.30: "[%d] %s:%d (%s) NCCL WARN " with the function (src/debug.cc, 0456df2)
        f"{HOST} misc/socket.cc:350 (ncclSocketConnect) NCCL WARN ncclOsSocketPollConnect to "
        "10.0.0.2<41223> failed with error Connection refused",
        # launchers' prefixes: Open MPI, pdsh, torchrun, Ray
        f"[1,2]<stdout>:{HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.0.0.2<41223> failed : Connection refused",
        f"node-1: {HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.0.0.2<41223> failed : Connection refused",
        f"[rank3]:{HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.0.0.2<41223> failed : Connection refused",
        f"(RayWorkerWrapper pid=2657296) {HOST} misc/socket.cc:484 NCCL WARN socketStartConnect: "
        "Connect to 10.0.0.2<41223> failed : Connection refused",
        # the poster cut the host off, or kept the WARN text alone
        "[1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<41223> failed "
        ": Connection refused",
        "NCCL WARN Connect to 10.38.10.112<21724> failed : Connection refused",
    ],
)
def test_warn_prefix_shapes(line: str) -> None:
    assert kinds(line + "\n") == {"socket": 1}


def test_warn_host_comes_from_the_prefix() -> None:
    (finding,) = nccl_findings(
        f"[2026-04-22 21:34:20] {HOST} misc/shmutils.cc:132 NCCL WARN Error while creating "
        "shared memory segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on "
        "device (28)\n"
    )
    assert finding.fields["kind"] == "system"
    assert finding.fields["hosts"] == ["gpu-a17"]


# --- NCCL's WARN lines: the messages, release by release ---------------------------------------
@pytest.mark.parametrize(
    ("message", "kind"),
    [
        # src/transport/net_ib.cc
        (
            "transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 12, opcode 0, "
            "len 0, vendor err 129",
            K.IB,
        ),  # 2.7-2.11
        (
            "transport/net_ib.cc:1198 NCCL WARN NET/IB : Got completion from peer "
            "10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81",
            K.IB,
        ),  # 2.12-20
        (
            "transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer "
            "10.20.1.18<54112> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
            "::ffff:10.20.1.17 remoteGids::ffff:10.20.1.18",
            K.IB,
        ),  # 2.21-2.22
        (
            "transport/net_ib.cc:2358 NCCL WARN NET/IB: Got completion from peer "
            "10.20.1.18<54112> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
            "::ffff:10.20.1.17 remoteGids::ffff:10.20.1.18 hca mlx5_0",
            K.IB,
        ),  # 2.23-2.29
        (
            "transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer "
            "10.20.1.18<54112> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV(128) "
            "vendor_err=129  localGid ::ffff:10.20.1.17 remoteGids::ffff:10.20.1.18 hca mlx5_0",
            K.IB,
        ),  # 2.30
        ("misc/ibvwrap.cc:268 NCCL WARN Call to ibv_create_cq failed", K.IB),  # 2.7
        (
            "misc/ibvwrap.cc:190 NCCL WARN Call to ibv_modify_qp failed with error Network is "
            "unreachable",
            K.IB,
        ),
        # src/misc/socket.cc (include/socket.h up to 2.11)
        (
            "include/socket.h:403 NCCL WARN Connect to 10.0.0.2<45763> failed : Connection timed "
            "out",
            K.SOCKET,
        ),  # 2.7-2.11
        (
            "misc/socket.cc:456 NCCL WARN Net : Connect to 10.0.0.2<45763> failed : Connection "
            "refused",
            K.SOCKET,
        ),  # 2.12-2.16
        (
            "misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.200.84.247<58355> failed : "
            "Broken pipe",
            K.SOCKET,
        ),  # 2.12-2.16
        (
            "misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer node1<47861>",
            K.SOCKET,
        ),  # 2.12-2.16
        (
            "misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
            "node1<57557>",
            K.SOCKET,
        ),  # 2.17+
        (
            "misc/socket.cc:30 NCCL WARN socketProgressOpt: Call to recv from 172.31.0.2<33759> "
            "failed : Connection reset by peer",
            K.SOCKET,
        ),  # 2.17-2.25
        ("misc/socket.cc:476 NCCL WARN socketStartConnect: exceeded timeouts (20)", K.SOCKET),
        (
            "misc/socket.cc:622 NCCL WARN socketPollConnect to 10.0.0.2<45763> failed with error "
            "Connection refused",
            K.SOCKET,
        ),  # 2.28
        ("misc/socket.cc:441 NCCL WARN socketFinalizeAccept: wrong type 4 != 3", K.SOCKET),
        # src/bootstrap.cc
        ("bootstrap.cc:48 NCCL WARN Bootstrap : no socket interface found", K.SOCKET),
        # src/proxy.cc
        ("proxy.cc:808 NCCL WARN Proxy Call to rank 3 failed (Connect)", K.PROXY),  # 2.12-2.17
        (
            "proxy.cc:1519 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from "
            "rank 0, retcode 2",
            K.PROXY,
        ),  # 2.12+
        (
            "proxy.cc:1485 NCCL WARN [Service thread] Error encountered progressing "
            "operation=Connect, res=2, closing connection",
            K.PROXY,
        ),
        # src/init.cc
        (
            "init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 both on CUDA "
            "device 1000",
            K.INVALID_USAGE,
        ),
        (  # 2.30
            "init.cc:1057 NCCL WARN Multiple Ranks are using the same GPU/Partition. Set "
            "NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.",
            K.INVALID_USAGE,
        ),
        # CUDACHECK (src/include/checks.h) "Cuda failure '%s'"; CUCHECK (include/cudawrap.h,
        # driver API) "Cuda failure %d '%s'" from 2.19
        ("enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'", K.CUDA),
        ("include/alloc.h:112 NCCL WARN Cuda failure 999 'unknown error'", K.CUDA),
        # shared memory: include/shm.h (2.7-2.11), misc/shmutils.cc (2.12+, errno from 2.23)
        (
            "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
            "nccl-shm-recv-c43b846667d22574-1-1-0 (size 9637888)",
            K.SYSTEM,
        ),
        (
            "misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to "
            "5967876 bytes",
            K.SYSTEM,
        ),
        (
            "misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
            "/dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)",
            K.SYSTEM,
        ),
    ],
)
def test_warn_messages_by_release(message: str, kind: NcclErrorKind) -> None:
    assert kinds(f"{HOST} {message}\n") == {kind.value: 1}


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (
            f"{HOST} transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 12, "
            "opcode 0, len 0, vendor err 129",
            12,
        ),
        (
            f"{HOST} transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer "
            "10.20.1.18<54112> with status=5 opcode=0 len=0 vendor err 249 (Recv)",
            5,
        ),
        (
            f"{HOST} transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer "
            "10.20.1.18<54112> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV(128) "
            "vendor_err=129  hca mlx5_0",
            12,
        ),
        # quoted without NCCL's prefix, a plugin's tag
        (
            "NET/IBP:Got completion from peer 7.6.13.83<36315> with status=12 opcode=32698 "
            "len=32696 vendor err 129 (Send)",
            12,
        ),
    ],
)
def test_ib_status_in_every_wording(line: str, status: int) -> None:
    (finding,) = nccl_findings(line + "\n")
    assert finding.fields["kind"] == "ib"
    assert finding.fields["ib_status"] == status


def test_info_and_benign_warn_lines_are_no_error() -> None:
    text = "\n".join(
        [
            # INFO lines that name result codes or look like errors
            f"{HOST} NCCL INFO ncclCommInitRank comm 0x55f90cbfd740 rank 0 nranks 2 - Init START",
            f"{HOST} NCCL INFO Call to connect returned Connection refused, retrying",
            f"{HOST} NCCL INFO misc/socket.cc:565 -> 2",
            f"{HOST} NCCL INFO [Service thread] Connection closed by localRank 0",
            # NCCL 2.7.8 WARNs when libibverbs is missing and goes on over sockets (2.9+ say
            # it at INFO): pytorch/pytorch#68893
            "[0m ip-172-31-0-137:14605:14673 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open "
            "libibverbs.so[.1]",
            "NCCL version 2.7.8+cuda11.1",
        ]
    )
    assert nccl_findings(text + "\n") == []


# --- the callers' errors and torch's "Last error" blocks --------------------------------------
def test_torch_block_counts_once_and_keeps_its_result_code() -> None:
    # ProcessGroupNCCL's watchdog (torch 2.x), NCCL 2.19: the last error names IB, the result
    # code says a peer was lost
    text = (
        "[rank3]:[E1107 11:02:10.118220311 ProcessGroupNCCL.cpp:1599] [PG ID 0 PG GUID "
        "0(default_pg) Rank 3] Process group watchdog thread terminated with exception: NCCL "
        "error: remote process exited or there was a network error, NCCL version 2.19.3\n"
        "[rank3]:ncclRemoteError: A call failed possibly due to a network error or a remote "
        "process exiting prematurely.\n"
        "[rank3]:Last error:\n"
        "[rank3]:NET/IB : Got completion from peer 10.42.0.2<47534> with error 5, opcode 48, "
        "len 32764, vendor err 244\n"
    )
    (finding,) = nccl_findings(text)
    assert (finding.fields["kind"], finding.count, finding.location.line) == ("remote", 1, 1)
    assert finding.fields["ranks"] == [3]
    assert finding.fields["last_error"].startswith("NET/IB : Got completion")
    assert finding.fields["ib_status"] == 5
    assert finding.fields["nccl_versions"] == ["2.19.3"]


@pytest.mark.parametrize(
    ("last_error", "kind"),
    [
        ("Bootstrap : no socket interface found", K.SOCKET),
        ("socketProgress: Connection closed by remote peer node2<42830>", K.SOCKET),
        ("Cuda failure 'out of memory'", K.CUDA),
        ("Attribute busid of node nic not found", K.INTERNAL),  # a genuine internal check
    ],
)
def test_internal_error_takes_the_last_errors_kind(last_error: str, kind: NcclErrorKind) -> None:
    # NCCL <= 2.18 surfaced network errors as ncclInternalError (NVIDIA/nccl#795, #1092)
    text = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1333, internal error - please report this issue to the NCCL "
        "developers, NCCL version 2.18.1\n"
        "ncclInternalError: Internal check failed.\n"
        "Last error:\n"
        f"{last_error}\n"
    )
    (finding,) = nccl_findings(text)
    assert finding.fields["kind"] == kind.value
    assert finding.fields["last_error"] == last_error
    assert finding.fields.get("reported_as") == (None if kind is K.INTERNAL else "internal")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # torch 1.x, NCCL < 2.13: result string only, then the old interpretation
        (
            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
            "unhandled system error, NCCL version 2.7.8\n"
            "ncclSystemError: System call (socket, malloc, munmap, etc) failed.\n",
            K.SYSTEM,
        ),
        # NCCL 2.18+: "(run with NCCL_DEBUG=... for details)" after the result string
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "NCCLUtils.hpp:275, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
            "version 2.20.5\n",
            K.INVALID_USAGE,
        ),
        # callers naming the NCCL call (titles of horovod/horovod#1651, Oneflow-Inc/oneflow#3586)
        (
            "tensorflow.python.framework.errors_impl.UnknownError: ncclCommInitRank failed: "
            "unhandled system error\n",
            K.SYSTEM,
        ),
        ("NCCL Check failed: ncclGroupEnd() : unhandled system error\n", K.SYSTEM),
        # torch.cuda.nccl / DataParallel (torch/csrc/cuda/nccl.cpp throw_nccl_error)
        ("RuntimeError: NCCL Error 1: unhandled cuda error\n", K.CUDA),
        # vLLM's pynccl wrapper
        (
            "RuntimeError: NCCL error: internal error - please report this issue to the NCCL "
            "developers\n",
            K.INTERNAL,
        ),
        # nccl-tests (src/common.h NCCLCHECK, NCCL >= 2.13): the last error inline
        (
            "gpu004: Test NCCL failure common.cu:958 'internal error - please report this issue "
            "to the NCCL developers / socketProgress: Connection closed by remote peer "
            "gpu005<55693>'\n",
            K.SOCKET,
        ),
        (
            "gpu004: Test NCCL failure common.cu:1005 'unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details) / Cuda failure 'out of memory''\n",
            K.CUDA,
        ),
        # torch's detail line alone, the line above it lost (NVIDIA/nccl#1837)
        (
            "[trainer0|0]:ncclInternalError: Internal check failed.\n"
            "[trainer0|0]:Last error:\n"
            "[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither "
            "AF_INET(2) nor AF_INET6(10)\n",
            K.SOCKET,
        ),
        # the whole block joined on one line by a terminal-width paste (deepseek-ai/DeepEP#106)
        (
            "ith exception: NCCL error: remote process exited or there was a network error, NCCL "
            "version 2.20.5  ncclRemoteError: A call failed possibly due to a network error or a "
            "remote process exiting prematurely.         Last error:          NET/IB : Got "
            "completion from peer 172.21.17.89<38536> with error 5, opcode 48, len 32710, vendor "
            "err 249        Exception raised from checkForNCCLErrorsInternal\n",
            K.REMOTE,
        ),
    ],
)
def test_caller_wordings(text: str, kind: NcclErrorKind) -> None:
    assert kinds(text) == {kind.value: 1}


def test_last_error_of_another_rank_is_not_taken() -> None:
    text = (
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/NCCLUtils.hpp:317, internal error - please report this issue to the NCCL "
        "developers, NCCL version 2.21.5\n"
        "[rank1]: ncclInternalError: Internal check failed.\n"
        "[rank1]: Last error:\n"
        "[rank2]: Traceback (most recent call last):\n"
        "[rank2]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL "
        "version 2.21.5\n"
    )
    assert kinds(text) == {"internal": 1, "remote": 1}


def test_last_error_behind_a_logger_prefix_with_a_moving_clock() -> None:
    text = (
        "2024-05-11 14:10:52.224 ERROR torch.distributed.DistBackendError: NCCL error in: "
        "ProcessGroupNCCL.cpp:1333, internal error, NCCL version 2.18.6\n"
        "2024-05-11 14:10:52.224 ERROR ncclInternalError: Internal check failed.\n"
        "2024-05-11 14:10:52.224 ERROR Last error:\n"
        "2024-05-11 14:10:52.225 ERROR Net : Connection closed by remote peer node7<41223>\n"
    )
    assert kinds(text) == {"socket": 1}


def test_block_across_a_chunk_boundary() -> None:
    head = "x" * 90 + "\n"
    text = head * 40 + (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:317, internal error "
        "- please report this issue to the NCCL developers, NCCL version 2.21.5\n"
        "ncclInternalError: Internal check failed.\nLast error:\n"
        "Bootstrap : no socket interface found\n"
    )
    for chunk in (64, 128, 1000, 4096):
        assert {f.fields["kind"]: f.count for f in nccl_findings(text, chunk)} == {"socket": 1}


# --- lines a terminal wrapped (the scanner does not join them) ---------------------------------
def test_wrapped_warn_line_is_read_with_its_continuation() -> None:
    text = (
        "mt-l-x86iavx512-45-172-t4-4-csmpw-runner-g4sfw-workflow:202016:202235 [0] misc/shmu"
        "tils.cc:88 NCCL WARN Error: fai\n"
        "led to extend /dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device "
        "(28)\n"
        f"{HOST} NCCL INFO transport/shm.cc:551 -> 2\n"
    )
    assert kinds(text) == {"system": 1}


def test_warn_line_of_no_kind_stays_other_when_the_next_line_is_not_its_rest() -> None:
    text = (
        f"{HOST} graph/xml.h:85 NCCL WARN Attribute busid of node nic not found\n"
        f"{HOST} NCCL INFO graph/xml.cc:629 -> 3\n"
        f"{HOST} misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
        "node1<57557>\n"
    )
    assert kinds(text) == {"other": 1, "socket": 1}


def test_wrapped_torch_line_finds_its_result_string_on_the_next_line() -> None:
    text = (
        "RuntimeError: NCCL error in: /opt/conda/conda-bld/pytorch_1607370128159/work/torch/lib/"
        "c10d/ProcessGroupNCCL.cpp:784, unhandl\n"
        "ed system error, NCCL version 2.7.8\n"
    )
    (finding,) = nccl_findings(text)
    assert finding.fields["kind"] == "system"
    assert finding.fields["nccl_versions"] == ["2.7.8"]
