"""Generated protobuf and gRPC code for package specd.v1 (see protos/; regenerate with `make protos`)."""
