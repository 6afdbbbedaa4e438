"""The OOM detector's patterns, one wording per test, each as the PyTorch code that prints it
lays the message out (``tests/triage/corpus/oom/SOURCES.md`` quotes the format strings).

The strings here are built from those format strings with made-up figures; the real messages
users pasted are in ``tests/triage/corpus/oom/``.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from trainguard.triage.detectors.oom import CudaOomDetector
from trainguard.triage.scanner import Scanner

MIB = 1 << 20
GIB = 1 << 30


def scan(text: str, name: str = "x.log") -> list[dict[str, Any]]:
    scanner = Scanner([CudaOomDetector()])
    scanner.scan_stream(io.BytesIO(text.encode()), name)
    return [f.to_json() for f in scanner.findings()]


def one(text: str) -> dict[str, Any]:
    (finding,) = scan(text)
    fields: dict[str, Any] = finding["fields"]
    return fields


# --- c10/cuda/CUDACachingAllocator.cpp, PyTorch 1.0 .. 1.4: "... free; X cached)" -----------
def test_cached_wording_counts_cached_as_unallocated() -> None:
    fields = one(
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 10.92 GiB total "
        "capacity; 9.00 GiB already allocated; 4.00 MiB free; 300.00 MiB cached)\n"
    )
    assert (fields["gpu"], fields["tried_bytes"]) == (1, 20 * MIB)
    assert fields["reserved_unallocated_bytes"] == 300 * MIB
    assert fields["reserved_bytes"] == 9 * GIB + 300 * MIB
    assert fields["verdict"] == "fragmentation"  # 300 MiB idle in the cache, 20 MiB asked


# --- 1.5 .. 2.0: "reserved in total by PyTorch)", 1.8+ "allowed; ", 1.10+ the hint ---------------
def test_reserved_wording_with_memory_fraction() -> None:
    fields = one(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 11.91 GiB total "
        "capacity; 4.50 GiB already allocated; 6.00 GiB free; 4.77 GiB allowed; 4.74 GiB "
        "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF\n"
    )
    assert fields["format"] == "pytorch<2.1"
    assert fields["allowed_bytes"] == round(4.77 * GIB)
    assert fields["reserved_bytes"] == round(4.74 * GIB)
    assert fields["free_bytes"] == 6 * GIB


# --- 2.1 "capacty", 2.2+ "capacity", NVML process lines, private pools (001074d2) -------------
def test_new_wording_with_private_pools_and_processes() -> None:
    fields = one(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 3 has a "
        "total capacity of 79.10 GiB of which 512.00 MiB is free. Process 11 has 2.00 GiB memory "
        "in use. Including non-PyTorch memory, this process has 76.00 GiB memory in use. "
        "4.00 GiB allowed; Of the allocated memory 70.00 GiB is allocated by PyTorch, with "
        "1.00 GiB allocated in private pools (e.g., CUDA Graphs), and 3.00 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
    )
    assert (fields["gpu"], fields["tried_bytes"]) == (3, GIB)
    assert fields["processes_in_use_bytes"] == {11: 2 * GIB}
    assert fields["process_in_use_bytes"] == 76 * GIB
    assert fields["allowed_bytes"] == 4 * GIB
    assert fields["reserved_bytes"] == 73 * GIB
    assert fields["verdict"] == "fragmentation"


def test_capacty_typo_of_2_1() -> None:
    fields = one(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 "
        "has a total capacty of 4.00 GiB of which 0 bytes is free.\n"
    )
    assert (fields["gpu"], fields["total_bytes"], fields["free_bytes"]) == (0, 4 * GIB, 0)


@pytest.mark.parametrize(("shown", "gpu"), [("", None), ("\x03", 3)])
def test_device_index_streamed_as_a_char(shown: str, gpu: int | None) -> None:
    # DeviceIndex is int8_t: operator<< printed it as a character until commit 001074d2.
    fields = one(
        f"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 216.00 MiB. "
        f"GPU {shown} has a total capacity of 44.42 GiB of which 118.12 MiB is free.\n"
    )
    assert fields.get("gpu") == gpu
    assert (fields["rank"], fields["tried_bytes"]) == (3, 216 * MIB)


# --- wrapped messages: the detector reads on while the lines look like the rest ----------------
def test_old_wording_hard_wrapped_is_read_across_lines() -> None:
    findings = scan(
        "| WARNING | fairseq.trainer | OOM: Ran out of memory with exception: CUD\n"
        "A out of memory. Tried to allocate 3.02 GiB (GPU 1; 23.70 GiB total capacity; \n"
        "16.92 GiB already allocated; 1019.69 MiB free; 21.03 GiB reserved in total by \n"
        "PyTorch)\n"
        "2022-04-14 02:39:35 | WARNING | fairseq.trainer | |=====\n"
    )
    (finding,) = findings
    fields = finding["fields"]
    assert finding["line"] == 2
    assert (fields["gpu"], fields["tried_bytes"]) == (1, round(3.02 * GIB))
    assert fields["reserved_bytes"] == round(21.03 * GIB)
    assert fields["allocated_bytes"] == round(16.92 * GIB)


def test_reading_on_stops_at_a_line_that_is_not_the_message() -> None:
    fields = one(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a\n"
        "Traceback (most recent call last):\n"
        "  total capacity of 9.00 GiB\n"
    )
    assert "total_bytes" not in fields
    assert fields["tried_bytes"] == 2 * GIB


def test_a_second_message_right_after_an_unfinished_one_is_its_own() -> None:
    findings = scan(
        "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0;\n"
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 8.00 GiB total "
        "capacity; 1.00 GiB already allocated; 0 bytes free; 7.00 GiB reserved in total by "
        "PyTorch)\n"
    )
    assert sorted((f["fields"]["gpu"], f["fields"]["tried_bytes"]) for f in findings) == [
        (0, GIB),
        (1, 2 * GIB),
    ]


# --- c10/cuda/CUDAMallocAsyncAllocator.cpp: one figure per line -------------------------------
def test_malloc_async_reads_the_request_from_a_later_line() -> None:
    fields = one(
        "torch.OutOfMemoryError: Allocation on device 2 would exceed allowed memory. "
        "(out of memory)\n"
        "Currently allocated     : 6.89 GiB\n"
        "Requested               : 320.00 MiB\n"
        "Device limit            : 23.69 GiB\n"
        "Free (according to CUDA): 2.94 MiB\n"
        "PyTorch limit (set by user-supplied memory fraction)\n"
        "                        : 17179869184.00 GiB\n"
        "next line\n"
    )
    assert fields["format"] == "cuda_malloc_async"
    assert (fields["gpu"], fields["tried_bytes"]) == (2, 320 * MIB)
    assert "allowed_bytes" not in fields  # SIZE_MAX: no fraction set
    assert fields["verdict"] == "does_not_fit"


def test_malloc_async_collapsed_to_one_line() -> None:
    fields = one(
        "OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory) "
        "Currently allocated : 5.96 GiB Requested : 12.50 MiB Device limit : 12.00 GiB Free "
        "(according to CUDA): 5.00 GiB PyTorch limit (set by user-supplied memory fraction) : "
        "17179869184.00 GiB\n"
    )
    assert fields["tried_bytes"] == round(12.5 * MIB)
    assert fields["verdict"] == "fragmentation"  # CUDA had it free; the pool did not


# --- CUDA's own error and the THC allocator of 0.x --------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: out of memory",
        "torch.AcceleratorError: CUDA error: out of memory",
        "CUDA error: out of memorySearch for `cudaErrorMemoryAllocation' in https://docs",
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=663 error=2 : out of "
        "memory",
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/generic/"
        "THCStorage.cu:58",
    ],
)
def test_cuda_error_out_of_memory(line: str) -> None:
    fields = one(line + "\n")
    assert fields == {"format": "cuda_error", "verdict": "outside_allocator"}


def test_exception_head_alone_is_an_oom_without_figures() -> None:
    fields = one("torch.OutOfMemoryError: CUDA out of memory.\n")
    assert fields["format"] == "exception_only"
    assert "tried_bytes" not in fields


# --- what is not a CUDA OOM, or not this detector's ------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        # NCCL's own wording is an nccl_error (kind cuda), not the allocator's OOM.
        "host:1:1 [0] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'",
        "Last error:\nCuda failure 2 'out of memory'",
        # Host memory, and people talking about OOMs.
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes.",
        "I keep running out of memory on the GPU, any idea?",
        "if 'CUDA out of memory' in str(e): retry()",
    ],
)
def test_not_a_cuda_oom(line: str) -> None:
    assert scan(line + "\n") == []


def test_repeats_fold_and_files_do_not_share_an_open_message() -> None:
    message = (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
        "capacity; 13.91 GiB already allocated; 3.75 MiB free; 14.71 GiB reserved in total by "
        "PyTorch)\n"
    )
    (finding,) = scan(message * 3)
    assert finding["count"] == 3
    scanner = Scanner([CudaOomDetector()])
    scanner.scan_stream(
        io.BytesIO(b"CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0;\n"), "a"
    )
    scanner.scan_stream(io.BytesIO(b"15.90 GiB total capacity; 1.00 GiB free;\n"), "b")
    (only,) = scanner.findings()
    assert "total_bytes" not in only.fields
