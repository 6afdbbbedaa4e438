#!/usr/bin/env bash
# trainguard's Slurm epilog (slurm.conf: Epilog=/etc/trainguard/slurm/epilog.sh).
#
# Forgets the job on this node, removes the job's rank targets from Prometheus' file_sd
# directory, and, when no other job runs here and the prolog manages the exporter, stops the
# node's trainguard-exporter and withdraws its announcement. Idempotent: running it again, or
# for a job whose prolog never ran, changes nothing. It always exits 0.
trap 'exit 0' EXIT

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" || exit 0

tg_epilog() {
	rm -f -- "$tg_state/jobs/$tg_job"
	tg_forget_rank_targets || tg_log "cannot remove job $tg_job's rank targets"
	[ "$tg_manage" = 1 ] || return 0
	if tg_jobs_left; then
		return 0
	fi
	tg_stop_exporter
	tg_deregister_exporter
}

tg_valid_job && tg_locked tg_epilog
