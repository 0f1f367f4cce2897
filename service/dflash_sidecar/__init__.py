"""dflash-serve sidecar: engine health and speculative-decoding metrics next to vLLM."""
