"""Checks of a deployment on what this machine lacks: the checks `helm test` runs against a
release (helm_test), the run of the patched engine on real GPUs (gpu) and the day-2 steps on a
cluster (day2)."""
