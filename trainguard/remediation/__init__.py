"""The remediation service: Alertmanager webhook -> policy -> actions, with an audit trail."""
