"""What the hook does with each of the remediation service's directives: a table of handlers.

The directive client (:mod:`.directives`) hands every directive to :func:`handle`, on its own
thread. The hook carries out what it can itself (``dump_diagnostics``, ``split_micro_batches``,
``set_collective_timeout``); anything else goes to the training script's ``on_directive``, which
may also take ``set_collective_timeout`` over (it knows its process groups). Raising marks the
directive failed in the service's audit trail, with the reason.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainguard import contract
from trainguard.contract import Action
from trainguard.events import log_event
from trainguard.instrumentation import flight_recorder
from trainguard.instrumentation.directives import Directive, DirectiveCallback

if TYPE_CHECKING:
    from trainguard.instrumentation.hook import Instrumentation

Handler = Callable[["Instrumentation", Directive], None]


def _dump_diagnostics(hook: Instrumentation, directive: Directive) -> None:
    """Every thread's stack and, on a process group, the Flight Recorder's trace."""
    folder = hook.config.resolved_dump_dir() / hook.identity.job_id / f"directive-{directive.id}"
    if hook.backend != "none" and flight_recorder.flight_recorder_available():
        flight_recorder.write_dump(folder, hook.identity.rank)
    flight_recorder.write_stacks(folder, hook.identity.rank)


def _split_micro_batches(hook: Instrumentation, directive: Directive) -> None:
    """Applies to ``guarded_step`` from its next step on."""
    hook.oom_guard.split_more(int(directive.params.get("factor", 2)))


def _set_collective_timeout(hook: Instrumentation, directive: Directive) -> None:
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(datetime.timedelta(seconds=float(directive.params["seconds"])))


HANDLERS: dict[Action, Handler] = {
    Action.DUMP_DIAGNOSTICS: _dump_diagnostics,
    Action.SPLIT_MICRO_BATCHES: _split_micro_batches,
    Action.SET_COLLECTIVE_TIMEOUT: _set_collective_timeout,
}
# Directives the training script's own callback takes over when it has one.
SCRIPT_FIRST = frozenset({Action.SET_COLLECTIVE_TIMEOUT})


def handle(
    hook: Instrumentation, directive: Directive, on_directive: DirectiveCallback | None
) -> None:
    """Log the directive, then carry it out or hand it to ``on_directive``."""
    kind = directive.kind
    log_event(
        f"directive {kind.value} #{directive.id} received",
        contract.EventKind.DIRECTIVE,
        level=logging.INFO,
        **hook.identity.event_fields(),
        step=hook.clock.step,
        details={"directive": kind.value, "params": dict(directive.params)},
    )
    handler = HANDLERS.get(kind)
    if handler is not None and not (kind in SCRIPT_FIRST and on_directive is not None):
        handler(hook, directive)
    elif on_directive is not None:
        on_directive(directive)
    else:
        raise RuntimeError(
            f"no handler for directive {kind.value!r} on this rank: pass "
            "on_directive= to trainguard.instrument() to act on it"
        )
