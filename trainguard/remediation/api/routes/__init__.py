"""The routes of the remediation service, one module per resource."""
