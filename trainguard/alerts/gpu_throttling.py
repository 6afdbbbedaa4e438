"""Alert rules of the ``gpu_throttling`` failure: a GPU's clocks held down for heat or power.
A node alert: it names the ranks on the GPU."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import G, N, on_scheduler_of_node
from trainguard.alerts.rule import ALERT_RULES, AlertRule, ranks_on_gpu
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _thermal_throttling(t: Thresholds) -> AlertRule:
    return AlertRule(
        alert=Alert.GPU_THERMAL_THROTTLING,
        severity=Severity.WARNING,
        expr=on_scheduler_of_node(
            f"max by ({N}, {G}) ({c.GPU_CLOCK_THROTTLED.name}"
            f'{{{c.LABEL_REASON}=~"{t.thermal_throttle_reasons}"}}) == 1'
        ),
        for_=t.thermal_for,
        summary="GPU {{ $labels.gpu }} of node {{ $labels.node }} is throttling",
        description="GPU {{ $labels.gpu }} on node {{ $labels.node }} has held its clocks down "
        f"for heat or power for {t.thermal_for}; its ranks become stragglers. " + ranks_on_gpu(),
    )


@ALERT_RULES.register(Failure.GPU_THROTTLING)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_thermal_throttling(t)]
