"""Which Slurm job and step a process belongs to, from its cgroup or else its environment.

slurmd's cgroup plugins put every process of a job step in a cgroup named after the job and
the step, so ``/proc/<pid>/cgroup`` (readable by any user) says where a process belongs:

- cgroup v1, one ``<id>:<controllers>:<path>`` line per hierarchy, the path
  ``/slurm/uid_<uid>/job_<job>/step_<step>/task_<task>`` (the root is ``/slurm_<node>`` where
  one host runs several slurmd);
- cgroup v2, one ``0::<path>`` line, the path
  ``/system.slice/slurmstepd.scope/job_<job>/step_<step>/user/task_<task>``
  (``<node>_slurmstepd.scope`` with several slurmd). Seen from inside a container's cgroup
  namespace the path may begin with ``/..``: the job is read from the components that follow
  Slurm's root, wherever it is in the path, and nothing outside a Slurm root counts.

``<step>`` is the step number, or ``batch`` (the batch script), ``extern`` (processes adopted
into the job, e.g. by ``pam_slurm_adopt``) or ``interactive``. The layouts are those of Slurm's
cgroup/v1 and cgroup/v2 plugins (src/plugins/cgroup/ in Slurm's source, and its cgroup v2 guide).

Where no cgroup names a job (proctrack/linuxproc, or a container runtime that moved the
process), ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` in ``/proc/<pid>/environ`` (what the process
was started with) are used instead; reading another user's environment needs privileges.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from trainguard.exporters.procs import ProcessFiles

# Slurm's root (slurm, slurm_<node>, slurmstepd.scope, <node>_slurmstepd.scope), v1's uid
# level, the job and, when the process is in one, its step.
_JOB_STEP = re.compile(r"slurm[^/]*(?:/uid_\d+)?/job_(\d+)(?:/step_([^/\s]+))?")


@dataclass(frozen=True)
class SlurmStep:
    """A Slurm job and step; ``step_id`` is empty when only the job is known."""

    job_id: str
    step_id: str = ""


def parse_cgroup(text: str) -> SlurmStep | None:
    """The job and step of a ``/proc/<pid>/cgroup``'s content (v1 or v2), ``None`` when no line
    is a Slurm job's cgroup. A line that names the step wins over one that names only the job
    (in v1 some hierarchies stop at the job)."""
    found: SlurmStep | None = None
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        match = _JOB_STEP.search(path)
        if match is None:
            continue
        step = SlurmStep(match.group(1), match.group(2) or "")
        if step.step_id:
            return step
        found = found or step
    return found


def from_environ(environ: Mapping[str, str]) -> SlurmStep | None:
    """The job and step Slurm put in a task's environment, ``None`` outside a job."""
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        return None
    return SlurmStep(job, environ.get("SLURM_STEP_ID", "").strip())


def slurm_step_of(pid: int, files: ProcessFiles) -> SlurmStep | None:
    """A process's job and step: its cgroup first (set by slurmd, whatever the process does to
    its environment), else its environment; ``None`` when neither names a job or the process
    is gone."""
    cgroup = files.cgroup(pid)
    step = parse_cgroup(cgroup) if cgroup is not None else None
    if step is not None:
        return step
    environ = files.environ(pid)
    return from_environ(environ) if environ is not None else None
