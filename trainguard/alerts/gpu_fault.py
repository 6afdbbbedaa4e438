"""Alert rules of the ``gpu_fault`` failure: Xid errors, NVML that stopped answering. Node
alerts: they name the ranks on the GPU or node."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import EXPORTER_UP, G, N, on_scheduler_of_node
from trainguard.alerts.rule import ALERT_RULES, AlertRule, ranks_on_gpu, ranks_on_node
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _xid(t: Thresholds) -> list[AlertRule]:
    """Critical for the hardware Xids of ``xid_critical``, warning for the others."""
    critical = "|".join(str(x) for x in t.xid_critical)
    xid = f"sum by ({N}, {G}, {c.LABEL_XID}) (increase({c.GPU_XID_ERRORS.name}"
    return [
        AlertRule(
            alert=Alert.GPU_XID_ERROR,
            severity=Severity.CRITICAL,
            expr=on_scheduler_of_node(
                f'{xid}{{{c.LABEL_XID}=~"{critical}"}}[{t.xid_window}])) > 0'
            ),
            summary="Critical Xid {{ $labels.xid }} on GPU {{ $labels.gpu }} of node "
            "{{ $labels.node }}",
            description="GPU {{ $labels.gpu }} on node {{ $labels.node }} reported Xid "
            f"{{{{ $labels.xid }}}} in the last {t.xid_window} (hardware, driver or "
            "interconnect fault). " + ranks_on_gpu(),
        ),
        AlertRule(
            alert=Alert.GPU_XID_ERROR,
            severity=Severity.WARNING,
            expr=on_scheduler_of_node(
                f'{xid}{{{c.LABEL_XID}!~"{critical}"}}[{t.xid_window}])) > 0'
            ),
            summary="Xid {{ $labels.xid }} on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            description="GPU {{ $labels.gpu }} on node {{ $labels.node }} reported Xid "
            f"{{{{ $labels.xid }}}} in the last {t.xid_window} (often an application fault). "
            + ranks_on_gpu(),
        ),
    ]


def _nvml_down(t: Thresholds) -> AlertRule:
    return AlertRule(
        alert=Alert.GPU_NVML_DOWN,
        severity=Severity.WARNING,
        expr=on_scheduler_of_node(
            f"max by ({N}) ({c.NVML_UP.name}) == 0\nor\n"
            # A hung NVML call: the gpu collector times out and its series (nvml_up among
            # them) are dropped, so only the collector's success says so.
            f"max by ({N}) ({c.EXPORTER_COLLECTOR_SUCCESS.name}"
            f'{{{c.LABEL_COLLECTOR}="{c.EXPORTER_COLLECTOR_GPU}"}}) == 0\n'
            f"or\nmax by ({N}) ({EXPORTER_UP}) == 0"
        ),
        for_=t.nvml_down_for,
        summary="No GPU telemetry from node {{ $labels.node }}",
        description="NVML or the trainguard exporter on node {{ $labels.node }} stopped "
        "answering; GPU alerts of this node are silenced until it is back. " + ranks_on_node(),
    )


@ALERT_RULES.register(Failure.GPU_FAULT)
def rules(t: Thresholds) -> list[AlertRule]:
    return [*_xid(t), _nvml_down(t)]
