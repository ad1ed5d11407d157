"""Watching a deployment with Prometheus and Grafana: scrape targets with file-based service
discovery, alert rules for the known pitfalls, and dashboards (render --prometheus)."""
