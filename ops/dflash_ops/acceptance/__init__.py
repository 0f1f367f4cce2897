"""Acceptance checks of a deployment: the checks `helm test` runs against a release, and the GPU
acceptance run of the patched engine on real hardware."""
