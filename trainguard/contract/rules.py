"""Prometheus scrape jobs and recording rule names (``level:metric:operation``)."""

from __future__ import annotations

# --- Prometheus scrape jobs, recording rules and alert labels (alerts/, deploy/) -----------
# Scrape job names of deploy/prometheus.yml; rules select on them (``up{job=...}``).
SCRAPE_JOB_RANKS = "trainguard-ranks"
SCRAPE_JOB_EXPORTER = "trainguard-exporter"
SCRAPE_JOB_REMEDIATION = "trainguard-remediation"
# Prometheus' own series of the alerts it evaluates: one per active alert, with the alert's
# labels, its name and its state (a rule may read whether it fired at the last evaluation).
ALERTS_SERIES = "ALERTS"
LABEL_ALERTNAME = "alertname"
LABEL_ALERTSTATE = "alertstate"
ALERTSTATE_FIRING = "firing"

# Recording rules, named level:metric:operation (the level is the set of labels kept).
REC_RANK_STEP_DURATION_MEAN = "rank:trainguard_step_duration_seconds:mean5m"
REC_RANK_COMPUTE_MEAN = "rank:trainguard_step_compute_duration_seconds:mean5m"
REC_RANK_SYNC_WAIT_MEAN = "rank:trainguard_sync_wait_duration_seconds:mean5m"
REC_RANK_PHASE_MEAN = "rank_phase:trainguard_step_phase_duration_seconds:mean5m"
REC_RANK_PHASE_COMPUTE_MEAN = "rank_phase:trainguard_step_compute_duration_seconds:mean5m"
REC_JOB_COMPUTE_MEDIAN = "job:trainguard_step_compute_duration_seconds:median5m"
REC_JOB_PHASE_COMPUTE_MEDIAN = "job_phase:trainguard_step_compute_duration_seconds:median5m"
REC_RANK_COMPUTE_RATIO = "rank:trainguard_step_compute_duration_seconds:ratio_to_job_median5m"
# Per rank, its phase with the most compute time over its job's median (the straggler's label).
REC_RANK_SLOWEST_PHASE = "rank:trainguard_step_compute_duration_seconds:slowest_phase5m"
REC_RANK_PHASE_COMPUTE_EXCESS = (
    "rank_phase:trainguard_step_compute_duration_seconds:excess_over_job_median5m"
)
REC_JOB_RANKS_REPORTING = "job:trainguard_step_compute_duration_seconds:ranks_reporting5m"
REC_JOB_GRAD_SYNC_P50 = "job:trainguard_grad_sync_duration_seconds:p50_5m"
REC_JOB_GRAD_SYNC_P99 = "job:trainguard_grad_sync_duration_seconds:p99_5m"
REC_RANK_GRAD_SYNC_MEAN = "rank:trainguard_grad_sync_duration_seconds:mean5m"
REC_JOB_STEP_DURATION_P99_1H = "job:trainguard_step_duration_seconds:p99_1h"
REC_RANK_DATA_WAIT_RATIO = "rank:trainguard_step_phase_duration_seconds:data_ratio5m"
REC_RANK_MEMORY_HEADROOM = "rank:trainguard_memory_reserved_bytes:headroom_ratio"
REC_RANK_STEPS_RATE = "rank:trainguard_steps:rate5m"
REC_JOB_STEPS_RATE = "job:trainguard_steps:rate5m"
REC_JOB_OLDEST_INFLIGHT = "job:trainguard_collective_oldest_inflight_seconds:max"
REC_JOB_STALL_THRESHOLD = "job:trainguard_collective_oldest_inflight_seconds:stall_threshold"
REC_JOB_COLLECTIVE_LAGGARD = "job:trainguard_collectives_launched:laggard_rank"
# The alerts' per-rank inputs over long windows, read from the ranks' raw series once per
# evaluation and kept only where non-zero (a healthy job records none of them): OOMs and their
# recoveries, collective timeouts and allocator retries in the alerts' windows, and the
# allocation a rank's trend reaches within the risk horizon where that is at its capacity.
REC_RANK_OOM_EVENTS = "rank:trainguard_oom_events:increase10m"
REC_RANK_OOM_RECOVERIES = "rank:trainguard_oom_recoveries:increase10m"
REC_RANK_COLLECTIVE_TIMEOUTS = "rank:trainguard_collective_timeouts:increase10m"
REC_RANK_ALLOC_RETRIES = "rank:trainguard_memory_alloc_retries:increase15m"
REC_RANK_MEMORY_AT_CAPACITY = "rank:trainguard_memory_allocated_bytes:predicted_at_capacity"
# Per-job bucket rates (the job's quantiles read these, never the ranks' raw buckets), and the
# job's newest last step with the rank whose last step is oldest (the stall alert reads these).
REC_JOB_STEP_DURATION_BUCKET_RATE = "job_le:trainguard_step_duration_seconds_bucket:rate5m"
REC_JOB_GRAD_SYNC_BUCKET_RATE = "job_le:trainguard_grad_sync_duration_seconds_bucket:rate5m"
REC_JOB_LAST_STEP = "job:trainguard_last_step_timestamp_seconds:max"
# A job's restart count and world size (the highest its ranks report): the restart alert reads
# their history, whichever of the job's ranks and ports reported them.
REC_JOB_ELASTIC_RESTARTS = "job:trainguard_elastic_restarts:max"
REC_JOB_WORLD_SIZE = "job:trainguard_world_size:max"
REC_JOB_STALEST_RANK = "job:trainguard_last_step_timestamp_seconds:stalest_rank"
# One series per job (per node) carrying the scheduler labels of its ranks' rank_info; both
# read the ranks' rank_info once, folded per job and node (a few series per node, not per rank).
REC_JOB_SCHEDULER = "job:trainguard_rank_info:scheduler_labels"
REC_JOB_NODE_SCHEDULER = "job_node:trainguard_rank_info:scheduler_labels"
# Reliability: success rate and MTTR over each window (the service's incident metrics).
RELIABILITY_WINDOWS: tuple[str, ...] = ("1h", "1d", "7d")
REC_FAILURE_SUCCESS_RATIO = {
    w: f"failure:trainguard_remediation_incidents:success_ratio{w}" for w in RELIABILITY_WINDOWS
}
REC_SUCCESS_RATIO = {
    w: f"remediation:trainguard_remediation_incidents:success_ratio{w}" for w in RELIABILITY_WINDOWS
}
REC_FAILURE_MTTR = {
    w: f"failure:trainguard_remediation_time_to_recover_seconds:mean{w}"
    for w in RELIABILITY_WINDOWS
}
REC_MTTR = {
    w: f"remediation:trainguard_remediation_time_to_recover_seconds:mean{w}"
    for w in RELIABILITY_WINDOWS
}
REC_NODE_SCHEDULER = "node:trainguard_rank_info:scheduler_labels"
