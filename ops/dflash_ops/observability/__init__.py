"""Grafana dashboards, generated from Python."""
