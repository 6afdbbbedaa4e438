# shellcheck shell=bash
# What trainguard's Slurm prolog and epilog share: settings, logging, the node's lock, the
# per-node exporter and the per-job state. Sourced by prolog.sh and epilog.sh; see
# docs/deploy-slurm.md.
#
# Settings, from slurmd's environment or the file $TRAINGUARD_SLURM_CONF
# (default /etc/trainguard/slurm.env, sourced when readable):
#   TRAINGUARD_SLURM_STATE_DIR        this node's state: jobs/<job id> for each job running
#                                     here, the exporter's pid file and log (default
#                                     /run/trainguard, emptied at boot)
#   TRAINGUARD_SLURM_MANAGE_EXPORTER  1 (default): the prolog starts the node's exporter and the
#                                     last epilog stops it; 0: the exporter runs on its own
#                                     (e.g. a systemd unit) and only per-job state is kept
#   TRAINGUARD_EXPORTER_BIN           the exporter command (default trainguard-exporter)
#   TRAINGUARD_EXPORTER_ARGS          more exporter flags, split on blanks
#   TRAINGUARD_EXPORTER_LISTEN_ADDRESS  where the exporter serves /metrics (default :9835)
#   TRAINGUARD_EXPORTER_TARGET        the address Prometheus scrapes (default <node>:<port>)
#   TRAINGUARD_FILE_SD_DIR            Prometheus' file_sd directory, shared with the ranks:
#                                     the exporter is announced in exporters/<node>.json, and
#                                     a finished job's rank files (<job id>-rank*.json) are
#                                     removed; unset, neither
#   TRAINGUARD_SLURM_LOG              a file to log to (default: syslog through logger, else
#                                     stderr, which slurmd discards)
#
# Nothing here may fail a job: every function returns a status for the log and the scripts
# always exit 0 (a prolog that fails drains the node and requeues the job).

tg_conf=${TRAINGUARD_SLURM_CONF:-/etc/trainguard/slurm.env}
if [ -r "$tg_conf" ]; then
	# shellcheck source=/dev/null
	. "$tg_conf"
fi
tg_state=${TRAINGUARD_SLURM_STATE_DIR:-/run/trainguard}
# shellcheck disable=SC2034  # read by prolog.sh and epilog.sh
tg_manage=${TRAINGUARD_SLURM_MANAGE_EXPORTER:-1}
tg_bin=${TRAINGUARD_EXPORTER_BIN:-trainguard-exporter}
tg_listen=${TRAINGUARD_EXPORTER_LISTEN_ADDRESS:-:9835}
tg_node=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null)}
tg_job=${SLURM_JOB_ID:-}
tg_pidfile=$tg_state/exporter.pid

tg_log() {
	local line
	line="$(date -u +%Y-%m-%dT%H:%M:%SZ) trainguard-slurm[${tg_job:-?}]: $*"
	if [ -n "${TRAINGUARD_SLURM_LOG:-}" ]; then
		printf '%s\n' "$line" >>"$TRAINGUARD_SLURM_LOG" 2>/dev/null && return 0
	fi
	logger -t trainguard-slurm -p daemon.notice -- "$*" 2>/dev/null || printf '%s\n' "$line" >&2
}

# The job id, checked: it names files, so anything but digits is refused.
tg_valid_job() {
	if [[ ! $tg_job =~ ^[0-9]+$ ]]; then
		tg_log "SLURM_JOB_ID '${tg_job}' is not a job id: nothing done"
		return 1
	fi
}

# Runs "$@" holding this node's lock, so that the prologs and epilogs of jobs starting and
# ending together agree on which jobs remain and who starts or stops the exporter.
tg_locked() {
	local status
	if ! mkdir -p "$tg_state/jobs" 2>/dev/null || ! exec 9>>"$tg_state/lock"; then
		tg_log "cannot use state directory $tg_state"
		return 1
	fi
	flock -w 30 9 || tg_log "no lock on $tg_state/lock after 30 s: going on without it"
	"$@"
	status=$?
	exec 9>&-
	return "$status"
}

# A process that is running, not a zombie left for its parent to reap.
tg_alive() {
	local stat
	read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ]
}

# Prints the pid of the exporter this node's prolog started, if it still runs: the pid file
# must name a live process whose command line is the exporter (pids are reused).
tg_exporter_pid() {
	local pid cmdline
	read -r pid 2>/dev/null <"$tg_pidfile" || return 1
	[[ $pid =~ ^[0-9]+$ ]] && tg_alive "$pid" || return 1
	cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	[[ $cmdline == *"$(basename -- "$tg_bin")"* ]] || return 1
	printf '%s\n' "$pid"
}

tg_start_exporter() {
	local pid extra=()
	if pid=$(tg_exporter_pid); then
		tg_log "exporter already running (pid $pid)"
		return 0
	fi
	if ! command -v "$tg_bin" >/dev/null 2>&1; then
		tg_log "exporter command '$tg_bin' not found: not started"
		return 1
	fi
	read -r -a extra <<<"${TRAINGUARD_EXPORTER_ARGS:-}"
	# Its own session and a clean environment: it outlives this job and must carry neither
	# the job's variables nor the lock (fd 9).
	setsid env -i PATH="$PATH" LANG=C.UTF-8 \
		TRAINGUARD_EXPORTER_LISTEN_ADDRESS="$tg_listen" \
		"$tg_bin" --collector.slurm_job "${extra[@]}" \
		</dev/null >>"$tg_state/exporter.log" 2>&1 9>&- &
	pid=$!
	printf '%s\n' "$pid" >"$tg_pidfile"
	tg_log "exporter started (pid $pid)"
}

tg_stop_exporter() {
	local pid tries=0
	if ! pid=$(tg_exporter_pid); then
		rm -f -- "$tg_pidfile"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null
	while tg_alive "$pid" && [ "$tries" -lt 100 ]; do
		sleep 0.1
		tries=$((tries + 1))
	done
	if tg_alive "$pid"; then
		tg_log "exporter (pid $pid) still running 10 s after SIGTERM: killing it"
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -f -- "$tg_pidfile"
	tg_log "exporter stopped (pid $pid)"
}

# Announces the exporter to Prometheus (file_sd), labelled with Slurm's name for the node:
# the name the ranks report (SLURMD_NODENAME) and the one scontrol drains.
tg_register_exporter() {
	local dir target
	[ -n "${TRAINGUARD_FILE_SD_DIR:-}" ] || return 0
	if [[ ! $tg_node =~ ^[A-Za-z0-9._-]+$ ]]; then
		tg_log "node name '$tg_node' cannot name a file_sd file: exporter not announced"
		return 1
	fi
	dir=$TRAINGUARD_FILE_SD_DIR/exporters
	target=${TRAINGUARD_EXPORTER_TARGET:-$tg_node:${tg_listen##*:}}
	if ! mkdir -p -- "$dir" ||
		! printf '[{"targets": ["%s"], "labels": {"node": "%s"}}]\n' "$target" "$tg_node" \
			>"$dir/.$tg_node.json.tmp" ||
		! mv -f -- "$dir/.$tg_node.json.tmp" "$dir/$tg_node.json"; then
		tg_log "cannot write $dir/$tg_node.json"
		return 1
	fi
}

tg_deregister_exporter() {
	[ -n "${TRAINGUARD_FILE_SD_DIR:-}" ] || return 0
	rm -f -- "$TRAINGUARD_FILE_SD_DIR/exporters/$tg_node.json"
}

# The job's rank files: the hook removes its own when it stops, but not when it is killed, and
# Prometheus would go on scraping a finished job's ranks (TrainingRankDown). Their names start
# with the hook's job id, which is the Slurm job id unless the job set another one.
tg_forget_rank_targets() {
	[ -n "${TRAINGUARD_FILE_SD_DIR:-}" ] || return 0
	rm -f -- "$TRAINGUARD_FILE_SD_DIR/$tg_job"-rank*.json \
		"$TRAINGUARD_FILE_SD_DIR/.$tg_job"-rank*.json.tmp
}

tg_jobs_left() {
	compgen -G "$tg_state/jobs/*" >/dev/null
}
