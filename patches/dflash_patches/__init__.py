"""The dflash-serve patch series for vLLM 0.33.0: manifest, apply, check and revert."""
