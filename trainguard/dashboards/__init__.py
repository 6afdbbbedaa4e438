"""trainguard's Grafana dashboards: the generator and the committed dashboard JSON."""
