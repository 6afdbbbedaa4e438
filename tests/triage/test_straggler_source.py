"""The straggler detector on the per-rank timing formats as their programs print them.

Each log here is rendered with the emitting code's own format string (quoted beside it, with
the file and commit it is from; tests/triage/corpus/straggler/SOURCES.md lists them), so the
detector is tested against what the program writes, not against a guess of it. Real excerpts
of these formats are in tests/triage/corpus/.
"""

from __future__ import annotations

import io
import json

import pytest

from trainguard.triage.detectors.straggler import (
    MIN_BENCHMARKS,
    MIN_REPORTS,
    MIN_SAMPLES,
    MIN_SUMMARIES,
    StragglerDetector,
)
from trainguard.triage.findings import Finding
from trainguard.triage.scanner import Scanner


def scan(text: str, name: str = "train.log", factor: float = 1.2) -> list[Finding]:
    scanner = Scanner([StragglerDetector(factor, 2)])
    scanner.scan_stream(io.BytesIO(text.encode()), name)
    return scanner.findings()


def megatron_block(times: dict[str, list[float]]) -> str:
    """megatron/core/timers.py Timers._get_all_ranks_time_string (NVIDIA/Megatron-LM
    d98e8a64dd): 'times across ranks (ms):', then '\\n  {}:'.format(name) and
    '\\n     rank {:2d}: {:.2f}'.format(rank, ms) per rank, logged as one record."""
    out = "times across ranks (ms):"
    for name, per_rank in times.items():
        out += "\n  {}:".format(name)  # noqa: UP032 (the source's own call)
        for rank, ms in enumerate(per_rank):
            out += "\n     rank {:2d}: {:.2f}".format(rank, ms)  # noqa: UP032
    return out


def test_megatron_all_ranks_block_names_the_slow_rank() -> None:
    times = {
        "forward-compute": [1210.5, 1208.9, 1650.2, 1215.0],
        "backward-compute": [2400.1, 2398.7, 3301.4, 2402.2],
        # the ranks that wait for rank 2 spend longer in the collective: never compared
        "all-grads-sync": [950.0, 948.0, 120.0, 951.0],
    }
    block = megatron_block(times)
    log = "\n".join(f"[2024-05-01 10:0{i}:00] [INFO] [timers.py:356:log] {block}" for i in range(3))
    (finding,) = scan(log + "\n")
    fields = finding.fields
    assert fields["rank"] == 2 and fields["scope"] == "rank"
    assert fields["metric"] in ("forward-compute", "backward-compute")
    assert set(fields["slow_metrics"]) == {"forward-compute", "backward-compute"}
    assert fields["samples"] == MIN_REPORTS == 3 and fields["ranks_compared"] == 4
    assert fields["median_seconds"] == pytest.approx(3.3014)


def test_megatron_block_with_torchrun_prefixes_and_a_line_after_it() -> None:
    block = megatron_block({"forward-compute": [100.0, 100.0, 100.0, 180.0]})
    lines = [f"[rank3]:{line}" for line in block.splitlines()]
    after = "[rank3]: [after training is done] datetime: 2024-05-01 10:10:00"
    log = "\n".join(lines * MIN_REPORTS + [after]) + "\n"
    (finding,) = scan(log)
    assert finding.fields["rank"] == 3


def test_a_waiting_timer_alone_accuses_no_one() -> None:
    # rank 0 starts first and waits longest in the all-reduce: it is not the straggler
    block = megatron_block({"layernorm-grads-all-reduce": [23.3, 7.9, 3.4, 2.8]})
    assert scan("\n".join([block] * 5) + "\n") == []


def test_too_few_megatron_reports_are_not_judged() -> None:
    block = megatron_block({"forward-compute": [100.0, 100.0, 300.0]})
    assert scan("\n".join([block] * (MIN_REPORTS - 1)) + "\n") == []


def deepspeed_line(rank: int, fwd: float, bwd: float, allreduce: float) -> str:
    """deepspeed/utils/timer.py SynchronizedWallClockTimer.log, v0.3.0-v0.10.0
    (deepspeedai/DeepSpeed 65c2f974d..b354c28b7^): f"rank={dist.get_rank()} time (ms)" then
    " | {}: {:.2f}".format(name, elapsed_time) per timer, through log_dist."""
    string = f"rank={rank} time (ms)"
    for name, value in (("forward", fwd), ("backward_allreduce", allreduce), ("backward", bwd)):
        string += " | {}: {:.2f}".format(name, value)  # noqa: UP032 (as in timer.py)
    return f"[2021-10-08 20:18:46,393] [INFO] [logging.py:68:log_dist] [Rank {rank}] {string}"


def test_deepspeed_per_rank_timers() -> None:
    lines = []
    for _ in range(MIN_SAMPLES):
        lines += [
            deepspeed_line(0, 316.0, 747.3, 232.3),
            deepspeed_line(1, 318.2, 747.0, 230.1),
            deepspeed_line(2, 512.7, 747.9, 36.0),
            deepspeed_line(3, 315.1, 746.8, 231.9),
        ]
    (finding,) = scan("\n".join(lines) + "\n")
    assert finding.fields["rank"] == 2 and finding.fields["metric"] == "forward"
    assert finding.fields["slow_metrics"] == ["forward"]  # backward is equal, allreduce skipped


def test_deepspeed_rank0_only_compares_nothing() -> None:
    lines = [deepspeed_line(0, 316.0, 747.3, 232.3)] * 20
    assert scan("\n".join(lines) + "\n") == []


def dlrover_line(round_: int, times: dict[int, float]) -> str:
    """dlrover/python/master/elastic_training/rdzv_manager.py (NetworkCheckRendezvousManager):
    f"Round {self._rdzv_round}: The node elapsed time " f"are {self._node_times}"."""
    return f"Round {round_}: The node elapsed time are {times}"


def test_dlrover_network_check_names_the_node() -> None:
    log = "\n".join(
        dlrover_line(r, {0: 20.1, 1: 20.4, 2: 55.0, 3: 19.9}) for r in range(MIN_REPORTS)
    )
    (finding,) = scan(log + "\n")
    assert finding.fields["rank"] == 2 and finding.fields["scope"] == "node"
    assert finding.summary.startswith("node 2 is")


def test_dlrover_timeout_sentinel_is_a_fault_not_a_time() -> None:
    # 3600 s: the check timed out (docs/tutorial/check_node_health.md), not a slow node
    log = "\n".join(dlrover_line(r, {0: 20.1, 1: 3600.0, 2: 20.4}) for r in range(5))
    assert scan(log + "\n") == []


def test_one_bad_round_does_not_make_a_straggler() -> None:
    rounds = [
        {0: 206.9, 1: 20.3, 2: 20.2},
        {0: 23.2, 1: 20.3, 2: 20.2},
        {0: 22.7, 1: 21.5, 2: 20.9},
    ]
    log = "\n".join(dlrover_line(r, t) for r, t in enumerate(rounds))
    assert scan(log + "\n") == []


@pytest.mark.parametrize(
    "template",
    [
        "rank {rank} step time {value:.3f}s",
        "rank={rank} iteration time: {ms:.1f} ms",
        "[rank{rank}]: step {step} | step_time={value:.4f}",
        "Rank {rank}: compute_time {ms:.1f}ms",
    ],
)
def test_plain_prints(template: str) -> None:
    lines = []
    for step in range(MIN_SAMPLES):
        for rank in range(4):
            value = 1.52 if rank == 3 else 1.01
            lines.append(template.format(rank=rank, value=value, ms=value * 1000, step=step))
    (finding,) = scan("\n".join(lines) + "\n")
    assert finding.fields["rank"] == 3


def test_a_key_at_the_end_of_a_longer_name_is_not_read() -> None:
    # optim_step_time is not a step time; the step_time after it on the same line is
    lines = []
    for _step in range(MIN_SAMPLES):
        for rank in range(4):
            optim = 9.0 if rank == 1 else 0.1  # rank 1 would be slow if optim_step_time counted
            step_time = 1.5 if rank == 2 else 1.0
            lines.append(f"[rank{rank}]: optim_step_time={optim} step_time={step_time}")
    (finding,) = scan("\n".join(lines) + "\n")
    assert (finding.fields["rank"], finding.fields["metric"]) == (2, "step_time")
    only_longer = [f"[rank{r}]: optim_step_time={9.0 if r == 1 else 0.1}" for r in range(4)]
    assert scan("\n".join(only_longer * MIN_SAMPLES) + "\n") == []


def test_per_rank_lines_that_are_not_timings() -> None:
    # fairseq's per-rank device table and NCCL's init timings name ranks but time no step
    lines = [
        f"2020-12-08 22:32:43 | INFO | fairseq.utils | rank   {r}: capabilities =  6.1  ; "
        "total memory = 10.917 GB ; name = GeForce GTX 1080 Ti"
        for r in range(4)
    ] + [
        f"host:1:2 [{r}] NCCL INFO Init timings: rank {r} nranks 4 total {1.08 + r:.2f} "
        "(kernels 0.51, bootstrap 0.22)"
        for r in range(4)
    ]
    assert scan("\n".join(lines * 5) + "\n") == []


def traceml_verdict(
    worst_rank: int, phase: str, worst: float, median_rank: int, median: float
) -> str:
    """traceopt-ai/traceml src/traceml_ai/reporting/primary_diagnosis.py:
    f"Rank r{worst_rank} {phase_label} was {worst_value:.1f}ms "
    f"vs median rank r{median_rank} at {median_value:.1f}ms." """
    return (
        f"Rank r{worst_rank} {phase} was {worst:.1f}ms "
        f"vs median rank r{median_rank} at {median:.1f}ms."
    )


def test_traceml_verdict_names_the_worst_rank_not_the_median_one() -> None:
    line = "Why: " + traceml_verdict(2, "input wait", 199.7, 0, 10.4)
    (finding,) = scan(line + "\n")
    fields = finding.fields
    assert (fields["rank"], fields["metric"]) == (2, "traceml_input_wait")
    assert fields["median_seconds"] == pytest.approx(0.1997)
    assert fields["peer_median_seconds"] == pytest.approx(0.0104)
    assert fields["samples"] == 1  # one verdict already sums up the tool's window


def test_traceml_verdict_below_the_factor_accuses_no_one() -> None:
    # the tool named a worst rank, but 11.0 vs 10.0 ms is under the alerts' 1.2x
    assert scan(traceml_verdict(1, "forward", 11.0, 0, 10.0) + "\n") == []


def test_traceml_verdicts_of_two_phases_are_one_finding() -> None:
    lines = [
        traceml_verdict(0, "dataloader", 201.6, 1, 1.4),
        traceml_verdict(0, "optimizer", 33.1, 1, 14.5),
    ]
    (finding,) = scan("\n".join(lines) + "\n")
    assert finding.fields["rank"] == 0
    assert set(finding.fields["slow_metrics"]) == {"traceml_dataloader", "traceml_optimizer"}


def greyhound_perf(min_lat: float, max_lat: float, avg_lat: float, std_lat: float) -> str:
    """wutianyuan1/Greyhound 7485ea8 detector/control_plane/global_analyzer.py
    PerformanceMetric.__str__:
    f"(Perf: min={self.min_lat}, max={self.max_lat}, avg={self.avg_lat}, std={self.std_lat})"."""
    return f"(Perf: min={min_lat}, max={max_lat}, avg={avg_lat}, std={std_lat})"


def greyhound_computation(rank: int, avg_ms: float) -> str:
    """detector/control_plane/global_controller.py validate_computation (same commit):
    logging.info(f"Computation result of rank {r} collected = {results[r]}!!"), results[r]
    being perf_gemm's min, max, mean and deviation over ten timed runs, in ms."""
    perf = greyhound_perf(avg_ms * 0.999, avg_ms * 1.001, avg_ms, 0.03)
    return f"INFO:root:Computation result of rank {rank} collected = {perf}!!"


def greyhound_p2p(rank: int, avg_ms: float) -> str:
    """global_controller.py collect_comm_task_results (same commit):
    logging.info(f"Result of rank {r} collected = {results[r]}!!"), a p2p transfer's times."""
    perf = greyhound_perf(avg_ms * 0.9, avg_ms * 1.1, avg_ms, 0.5)
    return f"INFO:root:Result of rank {rank} collected = {perf}!!"


def test_greyhound_computation_check_names_the_slow_rank() -> None:
    lines = [greyhound_computation(r, ms) for r, ms in enumerate([65.47, 515.49, 65.69, 65.69])]
    (finding,) = scan("\n".join(lines) + "\n", name="global_controller_localhost.log")
    fields = finding.fields
    assert (fields["rank"], fields["metric"], fields["scope"]) == (1, "greyhound_gemm", "rank")
    assert fields["median_seconds"] == pytest.approx(0.51549)
    assert fields["samples"] == MIN_BENCHMARKS == 1  # one round is ten timed runs already


def test_greyhound_p2p_results_and_a_healthy_check_accuse_no_one() -> None:
    # ranks 0 and 1 wait longer in their transfers: communication, never compared
    p2p = [greyhound_p2p(r, ms) for r, ms in enumerate([20.3, 20.3, 12.8, 12.7])]
    healthy = [greyhound_computation(r, ms) for r, ms in enumerate([65.43, 65.59, 65.45, 65.66])]
    assert scan("\n".join(p2p * 3 + healthy) + "\n") == []


def test_greyhound_rank_slow_in_one_of_three_rounds_is_not_a_straggler() -> None:
    rounds = [[65.5, 65.7, 65.7, 65.7], [65.5, 515.5, 65.7, 65.7], [65.5, 65.8, 65.7, 65.7]]
    lines = [greyhound_computation(r, ms) for times in rounds for r, ms in enumerate(times)]
    assert scan("\n".join(lines) + "\n") == []


def relax_result(fwd_ms: list[float], indent: int | None = 2) -> str:
    """hongwei-2026/relax-straggler-rfc-assets 7a6df99 evidence/2026-09-29/
    bench_straggler_4gpu.py: rank 0 prints print(json.dumps(result, indent=2)), result holding
    "fwd_ms_by_rank": [item["fwd"] for item in gathered] among its other keys."""
    result = {
        "world_size": len(fwd_ms),
        "overhead_pct": 0.8764681471488052,
        "fwd_ms_by_rank": fwd_ms,
        "alerts": [],
        "metrics": {"straggler/dp_grad_sync/max_ms": 28.75, "straggler/dp_grad_sync/max_rank": 0.0},
        "note": "synthetic matmul loop, not a Relax recipe",
    }
    return json.dumps(result, indent=indent)


@pytest.mark.parametrize("indent", [2, None])
def test_relax_forward_totals_name_the_slow_rank(indent: int | None) -> None:
    log = relax_result([12.758, 12.962, 12.897, 34.013], indent) + "\n"
    (finding,) = scan(log, name="bench_4gpu.txt")
    fields = finding.fields
    assert (fields["rank"], fields["metric"], fields["scope"]) == (3, "relax_fwd", "rank")
    assert fields["median_seconds"] == pytest.approx(0.034013)
    assert fields["samples"] == MIN_BENCHMARKS and fields["ranks_compared"] == 4


def test_relax_healthy_totals_and_a_cut_list_accuse_no_one() -> None:
    assert scan(relax_result([56.58, 57.77, 56.19, 57.02]) + "\n") == []
    # an excerpt cut inside the list (rank 2's value and what follows it replaced by another
    # line): the list ends there, so rank 3's 34.01 is not taken for a slow rank 2's
    lines = relax_result([12.76, 12.96, 12.90, 34.01]).splitlines()
    at = next(i for i, line in enumerate(lines) if "fwd_ms_by_rank" in line) + 3
    assert lines[at].strip() == "12.9,"
    log = "\n".join([*lines[:at], "rank 1 step_time=0.5", *lines[at + 1 :]]) + "\n"
    assert scan(log) == []


def pytscope_rows(compute_ms: list[float], straggler: int | None, styled: bool = False) -> str:
    """The per-rank block of pytscope's run report. Sumu004/trainscope 58f0938
    trainscope/report/cli_report.py:
    f"    rank {rs.rank}: {rs.mean_compute * 1e3:7.2f} ms · "
    f"{rs.slowest_fraction * 100:4.0f}% (z={rs.straggler_z:+.1f}){flag}"; styled, as
    pytscope/report/cli_report.py c41a92d prints it to a terminal: the straggler's label in
    "\x1b[1;31m...\x1b[0m" and a ten-segment bar of its critical-path share after the dot."""
    lines = [
        "  mean step wall 4.4 ms · comm 42% · imbalance CV 0.37",
        "  per-rank compute (ms/step) · % steps on critical path:",
    ]
    for rank, ms in enumerate(compute_ms):
        slow = rank == straggler
        share, z = (1.0, 14.1) if slow else (0.0, -14.1)
        flag = "  <- straggler" if slow else ""
        label, bar = f"rank {rank}", ""
        if styled:
            label = f"\x1b[1;31m{label}\x1b[0m" if slow else label
            bar = "\x1b[31m" + "█" * round(share * 10) + "\x1b[0m"
            bar += "\x1b[2m" + "░" * (10 - round(share * 10)) + "\x1b[0m "
        lines.append(f"    {label}: {ms:7.2f} ms · {bar}{share * 100:4.0f}% (z={z:+.1f}){flag}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("styled", [False, True])
def test_pytscope_report_names_the_rank_with_the_most_compute(styled: bool) -> None:
    (finding,) = scan(pytscope_rows([1.15, 2.55], straggler=1, styled=styled))
    fields = finding.fields
    assert (fields["rank"], fields["metric"], fields["scope"]) == (1, "pytscope_compute", "rank")
    assert fields["median_seconds"] == pytest.approx(0.00255)
    assert fields["samples"] == MIN_SUMMARIES == 1  # a rank's mean over the whole run


def test_pytscope_healthy_report_accuses_no_one_and_the_block_ends_with_its_rows() -> None:
    assert scan(pytscope_rows([1.15, 1.19, 1.17, 1.16], straggler=None)) == []
    # the line after the rows is read as any other: here a rank's own step times, rank 2 slow
    steps = [f"[rank{r}]: step_time={t}" for r, t in enumerate([0.3, 0.3, 0.9])]
    log = pytscope_rows([1.15, 1.19, 1.17], straggler=None) + "\n".join(steps * MIN_SAMPLES)
    (finding,) = scan(log + "\n")
    assert (finding.fields["rank"], finding.fields["metric"]) == (2, "step_time")


def ddp_lab_rows(step_ms: list[float], data_ms: list[float], compute_ms: list[float]) -> str:
    """duoan/playground-cuda bd8129de84 python/playground_cuda/ddp_lab.py, rank 0 after
    all_gather_object: print(f"Slowest steady-state rank: {slowest_rank}") and, per rank,
    f"rank={rank_id} step_ms={...:.2f} data_ms={...:.2f} compute_ms={...:.2f}"."""
    slowest = max(range(len(step_ms)), key=step_ms.__getitem__)
    lines = [f"Slowest steady-state rank: {slowest}", ""]
    lines += [
        f"rank={r} step_ms={s:.2f} data_ms={d:.2f} compute_ms={c:.2f}"
        for r, (s, d, c) in enumerate(zip(step_ms, data_ms, compute_ms, strict=True))
    ]
    return "\n".join(lines) + "\n"


def test_ddp_lab_names_the_rank_slow_to_fetch_not_the_one_with_the_longest_step() -> None:
    # rank 0 waits 40 ms for each batch; its compute_ms is the lowest (the others wait for it in
    # the all-reduce) and the lab's own slowest rank is rank 1, by 0.35 ms of whole step
    log = ddp_lab_rows(
        [102.19, 102.54, 102.17, 102.31], [44.64, 0.75, 0.78, 0.81], [57.55, 101.79, 101.39, 101.5]
    )
    (finding,) = scan(log)
    fields = finding.fields
    assert (fields["rank"], fields["metric"]) == (0, "ddp_lab_data")
    assert fields["slow_metrics"] == ["ddp_lab_data"]
    assert fields["peer_median_seconds"] == pytest.approx(0.00078)


def test_ddp_lab_healthy_run_accuses_no_one() -> None:
    log = ddp_lab_rows(
        [70.24, 70.15, 70.17, 69.97], [0.78, 0.92, 0.76, 0.87], [69.46, 69.23, 69.41, 69.09]
    )
    assert scan(log) == []
