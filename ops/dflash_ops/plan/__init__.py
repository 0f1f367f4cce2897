"""Block-size and deployment planning for Qwen4Exp hybrid checkpoints on vLLM 0.33.0."""
