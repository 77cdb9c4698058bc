"""specd: shared pieces of the three services (CLI, options, gRPC plumbing, default model, protos)."""
