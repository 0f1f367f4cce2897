"""The Helm chart from Python: its merged values, `helm template`, and its generated files."""
