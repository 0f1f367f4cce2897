"""`dflash-serve bench`: throughput and acceptance of an OpenAI-compatible vLLM endpoint."""
