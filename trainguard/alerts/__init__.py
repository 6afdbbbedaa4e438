"""trainguard's Prometheus rules: thresholds, the rules generator and the committed rules file."""
