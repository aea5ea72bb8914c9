"""Sample sources: OpenAI-compatible backends (vLLM), their pool, the embedded engine, replay."""
