"""The gateway: the public front door (gRPC Generate + OpenAI-compatible HTTP) in front of verifiers."""
