"""Alert rules of the ``nccl_error`` failure: NCCL fell back to TCP sockets on a node."""

from __future__ import annotations

from trainguard import contract as c
from trainguard.alerts.promql import N, on_scheduler_of_node
from trainguard.alerts.rule import ALERT_RULES, AlertRule, ranks_on_node
from trainguard.contract import Alert, Failure, Severity
from trainguard.thresholds import Thresholds


def _socket_transport_fallback(t: Thresholds) -> AlertRule:
    return AlertRule(
        alert=Alert.NCCL_SOCKET_TRANSPORT_FALLBACK,
        severity=Severity.WARNING,
        expr=on_scheduler_of_node(
            f"max by ({N}) ({c.NCCL_INFO.name}"
            f'{{{c.LABEL_TRANSPORT}=~"{t.nccl_socket_transport}"}}) == 1'
        ),
        for_=t.nccl_socket_for,
        summary="NCCL on node {{ $labels.node }} uses the Socket transport",
        description="NCCL on node {{ $labels.node }} fell back to TCP sockets instead of "
        "InfiniBand / RoCE; collectives are an order of magnitude slower. " + ranks_on_node(),
    )


@ALERT_RULES.register(Failure.NCCL_ERROR)
def rules(t: Thresholds) -> list[AlertRule]:
    return [_socket_transport_fallback(t)]
