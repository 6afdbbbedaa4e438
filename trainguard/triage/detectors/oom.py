"""CUDA out of memory: the caching allocator's messages across PyTorch releases, the
cudaMallocAsync backend's, and CUDA's own ``out of memory`` error.

Every pattern below is derived from the code that prints the message; the comment beside it
names the file and the release (or the commit read) it comes from. The full survey, with the
format strings quoted, is ``tests/triage/corpus/oom/SOURCES.md``.

A message is recognised by its head (the literal text before the first figure) and its figures
are then read one by one, so a message cut short, wrapped by a terminal or an issue form, or
decorated by a launcher keeps what it still shows. When the head's line ends before the last
figure, the detector asks for the following lines (``feed`` returns True) and reads on while they
look like the rest of the message.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from trainguard.contract import Cause, Failure
from trainguard.thresholds import Thresholds
from trainguard.triage.detectors.base import (
    SIZE,
    Source,
    bounded_get,
    gib,
    parse_size,
    rank_of,
    register,
)
from trainguard.triage.findings import Finding, Location

# Citations: "file @ commit" is pytorch/pytorch source read for this detector (SOURCES.md quotes
# it); copies of a file at older versions, vendored by PyTorch forks and ports, were read through
# the public code index where pytorch/pytorch's own history was not at hand ("copy"). Release
# numbers come from the dates and versions of the reports in the corpus, not from tags read here.
#
# --- the caching allocator: c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc.
# Every wording since 1.0 starts with (@ 001074d25084, @ eb42ad6eca0c, 2.1 and 1.x copies):
#   "CUDA out of memory. Tried to allocate ", format_size(alloc_size)
# The anchor leaves out the API's name: a ROCm build says "HIP", and an 80-column terminal can
# split "CUDA" ("CUD" / "A out of memory", corpus oom/fairseq4352_wrapped_mid_word).
_HEAD = re.compile(rf"out of memory\. Tried to allocate (?P<tried>{SIZE})")
# What follows the request tells the two wordings apart:
#   1.0 .. 2.0: " (GPU ", device, "; "                                      (1.x copies)
#   2.1:        ". GPU ", device, " has a total capacty of "               (2.1 copy: the typo)
#   2.2+:       ". GPU ", device, " has a total capacity of "              (@ eb42ad6eca0c)
#   @ eb42ad6eca0c streams `device` (c10::DeviceIndex, int8_t) as a char: GPU 3 prints "\x03",
#   and pasted text shows "GPU  has" (torch 2.3/2.4, corpus oom/stepvideo8_rank3_gpu_blank);
#   @ 001074d25084 prints static_cast<int>(device).
_AFTER_HEAD = re.compile(
    r"\s*(?:\(GPU (?P<old_gpu>\d+);"
    r"|\.\s*GPU (?:(?P<new_gpu>\d+)|(?P<gpu_chr>[\x00-\x1f]))?\s*has a total capaci?ty)"
)
# 1.0 .. 2.0, after " (GPU N; " each figure is followed by its label (1.x copies):
#   format_size(device_total), " total capacity; "
_OLD_TOTAL = re.compile(rf"(?P<v>{SIZE}) total capacity;")
#   format_size(stats.allocated_bytes[AGGREGATE].current), " already allocated; "
_OLD_ALLOCATED = re.compile(rf"(?P<v>{SIZE}) already allocated;")
#   format_size(device_free), " free; "
_OLD_FREE = re.compile(rf"(?P<v>{SIZE}) free;")
#   allowed_info = format_size(allowed_memory_maximum) + " allowed; " when
#   torch.cuda.set_per_process_memory_fraction was called (1.8+, pytorch#48172); in the 2.x
#   wording it stands before "Of the allocated memory" (@ 001074d25084; @ eb42ad6eca0c builds it
#   but leaves it out of the message)
_ALLOWED = re.compile(rf"(?P<v>{SIZE}) allowed;")
#   format_size(stats.reserved_bytes[AGGREGATE].current), " reserved in total by PyTorch)"
#   (1.5 .. 2.0; from 1.10/1.11 followed by " If reserved memory is >> allocated memory try
#   setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management
#   and PYTORCH_CUDA_ALLOC_CONF")
_OLD_RESERVED = re.compile(rf"(?P<v>{SIZE}) reserved in total by PyTorch")
#   format_size(stats.amount_cached - stats.amount_allocated), " cached)" (1.0 .. 1.4: the
#   cache that holds no tensor; copy in the NPU port of the 1.x allocator)
_OLD_CACHED = re.compile(rf"(?P<v>{SIZE}) cached\)")
# 2.1+, after ". GPU N has a total capacity of " (@ eb42ad6eca0c, @ 001074d25084, 2.1 copy):
#   format_size(device_total), " of which ", format_size(device_free), " is free. "
_NEW_TOTAL = re.compile(rf"has a total capaci?ty of (?P<v>{SIZE})")
_NEW_FREE = re.compile(rf"of which (?P<v>{SIZE}) is free")
#   proc_info = reportProcessMemoryInfo(device) (NVML; empty without it, e.g. on Windows):
#   "Process ", pid, " has ", format_size(used), " memory in use. " per other process and
#   "Including non-PyTorch memory, this process has ", ... for this one (@ 001074d25084)
_THIS_PROCESS = re.compile(rf"this process has (?P<v>{SIZE}) memory in use")
_OTHER_PROCESS = re.compile(rf"Process (?P<pid>\d+) has (?P<v>{SIZE}) memory in use")
#   "Of the allocated memory ", format_size(allocated + private), " is allocated by PyTorch, ",
#   private_pool_msg ("with ", size, " allocated in private pools (e.g., CUDA Graphs), ",
#   @ 001074d25084 only), "and ", format_size(reserved - allocated - private),
#   " is reserved by PyTorch but unallocated."
_NEW_SPLIT = re.compile(
    rf"Of the allocated memory (?P<allocated>{SIZE}) is allocated by PyTorch,"
    rf"(?: with (?P<private>{SIZE}) allocated in private pools(?: \([^)]*\))?,)?\s*and "
    rf"(?P<unallocated>{SIZE}) is reserved by PyTorch but unallocated"
)
# The last figure of each wording: once it is read the message is complete.
_LAST_FIGURE = ("reserved in total by PyTorch", "cached)", "is reserved by PyTorch but unallocated")

# --- the cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, ComfyUI's
# default): c10/cuda/CUDAMallocAsyncAllocator.cpp, mallocAsync (copy), one figure per line:
#   "Allocation on device ", device, " would exceed allowed memory. (out of memory)",
#   "\nCurrently allocated     : ", "\nRequested               : ",
#   "\nDevice limit            : ", "\nFree (according to CUDA): ",
#   "\nPyTorch limit (set by user-supplied memory fraction)" "\n                        : "
_ASYNC_HEAD = re.compile(
    r"Allocation on device (?:(?P<gpu>\d+)|(?P<gpu_chr>[\x00-\x1f]))? ?would exceed allowed "
    r"memory\. \(out of memory\)"
)
_ASYNC_ALLOCATED = re.compile(rf"Currently allocated\s*: (?P<v>{SIZE})")
_ASYNC_REQUESTED = re.compile(rf"Requested\s*: (?P<v>{SIZE})")
_ASYNC_LIMIT = re.compile(rf"Device limit\s*: (?P<v>{SIZE})")
_ASYNC_FREE = re.compile(rf"Free \(according to CUDA\): (?P<v>{SIZE})")
_ASYNC_FRACTION = re.compile(rf"memory fraction\)\s*: (?P<v>{SIZE})")
# Without a memory fraction the limit printed is SIZE_MAX: "17179869184.00 GiB".
_NO_LIMIT = 1 << 60

# A line that carries on a message whose head line ended early: it starts with a figure or with
# the words that come between figures (a wrap falls at a space).
_CONTINUES = re.compile(
    rf"\s*(?:\**{SIZE}|\(?GPU\b|PyTorch\b|reserved\b|already allocated|allocated\b|free\b"
    r"|total capaci|of which|is (?:free|allocated|reserved)|Of the allocated|and [\d.]"
    r"|Including non-PyTorch|Process \d|this process|with [\d.])"
)
_ASYNC_CONTINUES = re.compile(
    r"\s*(?:Currently allocated|Requested|Device limit|Free \(according|PyTorch limit|:)"
)
_MAX_FOLLOW = 8  # lines read on after the head's line

# --- CUDA's own error, from a CUDA call outside the caching allocator:
#   c10/cuda/CUDAException.cpp c10_cuda_check_implementation (@ 0e4c6cd66277):
#   check_message.append("CUDA error: "); append(cudaGetErrorString(err)), and the string of
#   cudaErrorMemoryAllocation is "out of memory"; then get_cuda_error_help (CUDAMiscFunctions.cpp
#   @ 0ac83aeb3549) appends "\nSearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/
#   ..." and the exception is c10::AcceleratorError (torch.AcceleratorError in Python). Older
#   releases raise it as RuntimeError with the same first line (corpus, 2019..2025).
_CUDA_ERROR = re.compile(r"CUDA error:\s*out of memory")
#   0.x .. 1.x, aten/src/THC/THCGeneral.cpp __THCudaCheck (copies):
#   fprintf(stderr, "THCudaCheck FAIL file=%s line=%i error=%i : %s\n", file, line, err, ...)
#   _THError(file, line, "cuda runtime error (%d) : %s", err, cudaGetErrorString(err))
#   (TH appends " at <file>:<line>"); cudaErrorMemoryAllocation is 2.
_THC_ERROR = re.compile(r"(?:cuda runtime error \(2\)|THCudaCheck FAIL .*error=2) : out of memory")
# The exception's first sentence alone (a message cut there): Python prints
# "<class>: <message>", the class torch.cuda.OutOfMemoryError (1.13 .. 2.4) or
# torch.OutOfMemoryError (2.5+) raised from TORCH_CHECK_WITH(OutOfMemoryError, ...) above.
_EXCEPTION_ONLY = re.compile(r"OutOfMemoryError: (?:CUDA|HIP) out of memory\b")

# Share of PyTorch's reserved memory that is cached but unused above which an OOM is blamed
# on fragmentation rather than on the model simply not fitting.
FRAGMENTATION_SHARE = 0.2
_NON_PYTORCH_SIGNIFICANT = 2 << 30

_Key = tuple[str, int | None, str, int]


class _Pending:
    """A message whose head has been read while its figures may still be on following lines."""

    __slots__ = ("follows", "kind", "rank", "source", "text", "where")

    def __init__(self, kind: str, text: str, where: Location, rank: int | None, source: Source):
        self.kind = kind  # "allocator" or "async"
        self.text = text
        self.where = where
        self.rank = rank
        self.source = source
        self.follows = 0

    def complete(self) -> bool:
        if self.kind == "async":
            return _ASYNC_FRACTION.search(self.text) is not None
        return any(last in self.text for last in _LAST_FIGURE)

    def continued_by(self, line: str) -> bool:
        pattern = _ASYNC_CONTINUES if self.kind == "async" else _CONTINUES
        return self.follows < _MAX_FOLLOW and pattern.match(line) is not None

    def append(self, line: str) -> None:
        self.follows += 1
        joint = "" if self.text[-1:].isspace() else " "
        self.text += joint + line.strip()


@register
class CudaOomDetector:
    """CUDA OOM in every wording PyTorch has printed, and bare ``CUDA error: out of memory``."""

    failure: ClassVar[Failure] = Failure.OOM
    keywords: tuple[str, ...] = ("out of memory",)
    needles = keywords

    @classmethod
    def from_thresholds(cls, thresholds: Thresholds) -> CudaOomDetector:
        return cls()

    def __init__(self) -> None:
        self.dropped = 0
        self._groups: dict[_Key, Finding] = {}
        self._pending: _Pending | None = None

    def feed(self, line: str, where: Location, source: Source) -> bool:
        pending = self._pending
        if pending is not None:
            if pending.source.name == source.name and pending.continued_by(line):
                pending.append(line)
                if pending.complete():
                    self._finish()
                    return False
                return True
            self._finish()
        if "out of memory" not in line:
            return False
        return self._start(line, where, source)

    def _start(self, line: str, where: Location, source: Source) -> bool:
        rank = rank_of(line, source)
        head = _HEAD.search(line)
        if head:
            pending = _Pending("allocator", line[head.start() :], where, rank, source)
        else:
            async_head = _ASYNC_HEAD.search(line)
            if async_head is None:
                fields = self._parse_other(line)
                if fields is not None:
                    self._add(fields, where, rank, source)
                return False
            pending = _Pending("async", line[async_head.start() :], where, rank, source)
        if pending.complete():
            self._pending = pending
            self._finish()
            return False
        self._pending = pending
        return True

    def _finish(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.kind == "async":
            fields = self._parse_async(pending.text)
        else:
            fields = self._parse_allocator(pending.text)
        self._add(fields, pending.where, pending.rank, pending.source)

    def _add(
        self, fields: dict[str, Any], where: Location, rank: int | None, source: Source
    ) -> None:
        if rank is not None:
            fields["rank"] = rank
        key = (source.name, rank, str(fields.get("gpu")), int(fields.get("tried_bytes", 0)))
        existing = self._groups.get(key)
        if existing is not None:
            existing.count += 1
        else:
            bounded_get(self._groups, key, lambda: self._finding(fields, where), self)

    @staticmethod
    def _figure(pattern: re.Pattern[str], text: str) -> int | None:
        match = pattern.search(text)
        return parse_size(match["v"]) if match else None

    @classmethod
    def _parse_allocator(cls, text: str) -> dict[str, Any]:
        head = _HEAD.match(text)
        assert head is not None  # a pending allocator message starts at its head
        fields: dict[str, Any] = {"tried_bytes": parse_size(head["tried"])}
        after = _AFTER_HEAD.match(text, head.end())
        gpu: int | None = None
        new = True
        if after is not None:
            new = after["old_gpu"] is None
            if after["old_gpu"] is not None:
                gpu = int(after["old_gpu"])
            elif after["new_gpu"] is not None:
                gpu = int(after["new_gpu"])
            elif after["gpu_chr"] is not None:
                gpu = ord(after["gpu_chr"])
        elif _OLD_TOTAL.search(text) or _OLD_ALLOCATED.search(text):
            new = False
        if gpu is not None:
            fields["gpu"] = gpu
        allowed = cls._figure(_ALLOWED, text)
        if allowed is not None:
            fields["allowed_bytes"] = allowed
        if new:
            fields["format"] = "pytorch>=2.1"
            for name, pattern in (("total_bytes", _NEW_TOTAL), ("free_bytes", _NEW_FREE)):
                value = cls._figure(pattern, text)
                if value is not None:
                    fields[name] = value
            this = cls._figure(_THIS_PROCESS, text)
            if this is not None:
                fields["process_in_use_bytes"] = this
            others = {int(m["pid"]): parse_size(m["v"]) for m in _OTHER_PROCESS.finditer(text)}
            if others:
                fields["processes_in_use_bytes"] = others
            split = _NEW_SPLIT.search(text)
            if split:
                allocated = parse_size(split["allocated"])
                unallocated = parse_size(split["unallocated"])
                fields["allocated_bytes"] = allocated
                fields["reserved_bytes"] = allocated + unallocated
                fields["reserved_unallocated_bytes"] = unallocated
            return fields
        fields["format"] = "pytorch<2.1"
        for name, pattern in (
            ("total_bytes", _OLD_TOTAL),
            ("allocated_bytes", _OLD_ALLOCATED),
            ("free_bytes", _OLD_FREE),
        ):
            value = cls._figure(pattern, text)
            if value is not None:
                fields[name] = value
        allocated_bytes = fields.get("allocated_bytes")
        reserved = cls._figure(_OLD_RESERVED, text)
        if reserved is not None:
            fields["reserved_bytes"] = reserved
            if allocated_bytes is not None:
                fields["reserved_unallocated_bytes"] = max(reserved - allocated_bytes, 0)
        else:
            cached = cls._figure(_OLD_CACHED, text)
            if cached is not None:
                fields["reserved_unallocated_bytes"] = cached
                if allocated_bytes is not None:
                    fields["reserved_bytes"] = allocated_bytes + cached
        return fields

    @classmethod
    def _parse_async(cls, text: str) -> dict[str, Any]:
        head = _ASYNC_HEAD.match(text)
        assert head is not None  # a pending async message starts at its head
        fields: dict[str, Any] = {"format": "cuda_malloc_async"}
        if head["gpu"] is not None:
            fields["gpu"] = int(head["gpu"])
        elif head["gpu_chr"] is not None:
            fields["gpu"] = ord(head["gpu_chr"])
        for name, pattern in (
            ("tried_bytes", _ASYNC_REQUESTED),
            ("allocated_bytes", _ASYNC_ALLOCATED),
            ("total_bytes", _ASYNC_LIMIT),
            ("free_bytes", _ASYNC_FREE),
        ):
            value = cls._figure(pattern, text)
            if value is not None:
                fields[name] = value
        limit = cls._figure(_ASYNC_FRACTION, text)
        if limit is not None and limit < _NO_LIMIT:
            fields["allowed_bytes"] = limit
        return fields

    @staticmethod
    def _parse_other(line: str) -> dict[str, Any] | None:
        if _CUDA_ERROR.search(line) or _THC_ERROR.search(line):
            return {"format": "cuda_error"}
        if _EXCEPTION_ONLY.search(line):
            return {"format": "exception_only"}
        return None

    @staticmethod
    def _finding(fields: dict[str, Any], where: Location) -> Finding:
        where_text = f"GPU {fields['gpu']}" if "gpu" in fields else "a GPU"
        if "rank" in fields:
            where_text += f" (rank {fields['rank']})"
        if fields["format"] == "cuda_error":
            fields["verdict"] = "outside_allocator"
            return Finding(
                Failure.OOM,
                f"CUDA error: out of memory on {where_text}",
                where,
                "A CUDA call outside PyTorch's caching allocator (context creation, NCCL "
                "buffers, cuBLAS workspace, another library) found the GPU full. Check for "
                "other processes on the GPU (nvidia-smi) and leave headroom: lower the "
                "micro-batch or set torch.cuda.set_per_process_memory_fraction.",
                fields,
            )
        tried = fields.get("tried_bytes")
        if tried is None:  # the exception's first sentence only
            fields["verdict"] = Cause.DOES_NOT_FIT.value
            return Finding(
                Failure.OOM,
                f"CUDA out of memory on {where_text} (the message's figures are not in the log)",
                where,
                "The allocator's figures were cut off; the full message says whether the "
                "request did not fit or the cache was fragmented.",
                fields,
            )
        advice: list[str] = []
        unallocated = fields.get("reserved_unallocated_bytes")
        reserved = fields.get("reserved_bytes")
        free = fields.get("free_bytes")
        allowed = fields.get("allowed_bytes")
        if unallocated is not None and reserved:
            share = unallocated / reserved
            fields["fragmentation_ratio"] = round(share, 4)
            fragmented = unallocated >= tried or share >= FRAGMENTATION_SHARE
        elif fields["format"] == "cuda_malloc_async":
            # CUDA still had the request free: the async pool, not the device, ran out.
            fragmented = free is not None and free >= tried and allowed is None
        else:
            fragmented = False
        if fragmented and fields["format"] == "cuda_malloc_async":
            fields["verdict"] = "fragmentation"
            advice.append(
                f"CUDA reported {gib(free or 0)} free but the cudaMallocAsync pool could not "
                f"serve {gib(tried)}: release cached pool memory (torch.cuda.empty_cache()) "
                "or use the native allocator with PYTORCH_CUDA_ALLOC_CONF="
                "expandable_segments:True."
            )
        elif fragmented:
            fields["verdict"] = "fragmentation"
            advice.append(
                f"Fragmentation: {gib(unallocated or 0)} is reserved by PyTorch but unallocated "
                f"({fields['fragmentation_ratio']:.0%} of reserved) while the request was "
                f"{gib(tried)}. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (older "
                "PyTorch: max_split_size_mb) and avoid tensors whose shapes change every step."
            )
        else:
            fields["verdict"] = Cause.DOES_NOT_FIT.value
            advice.append(
                "The step needs more memory than the GPU has: lower the micro-batch and keep the "
                "global batch with gradient accumulation, enable activation checkpointing, use "
                "bf16/fp16, or shard parameters and optimizer state (FSDP/ZeRO)."
            )
        if allowed is not None:
            advice.append(
                f"A memory fraction caps PyTorch at {gib(allowed)} on this GPU "
                "(torch.cuda.set_per_process_memory_fraction)."
            )
        in_use = fields.get("process_in_use_bytes")
        if in_use is not None and reserved is not None:
            non_pytorch = in_use - reserved
            fields["non_pytorch_bytes"] = max(non_pytorch, 0)
            if non_pytorch >= _NON_PYTORCH_SIGNIFICANT:
                advice.append(
                    f"{gib(non_pytorch)} of this process's GPU memory is not PyTorch's "
                    "(CUDA context, NCCL buffers, other libraries)."
                )
        others = fields.get("processes_in_use_bytes")
        if others and len(others) > 1:
            advice.append(
                f"{len(others)} processes share {where_text.split(' (')[0]}: make sure each "
                "rank uses its own device (torch.cuda.set_device(local_rank))."
            )
        summary = f"CUDA out of memory on {where_text}: tried to allocate {gib(tried)}"
        if free is not None:
            summary += f" with {gib(free)} free"
            if "total_bytes" in fields:
                summary += f" of {gib(fields['total_bytes'])}"
        return Finding(Failure.OOM, summary, where, " ".join(advice), fields)

    def findings(self) -> list[Finding]:
        self._finish()
        return list(self._groups.values())
