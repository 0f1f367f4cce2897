"""The local stack: a tiny target and draft built on the fly, a vLLM CPU engine, the sidecar."""
