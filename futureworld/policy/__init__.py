"""Generation backends behind one protocol: local transformers, vLLM over HTTP, tiny models."""
