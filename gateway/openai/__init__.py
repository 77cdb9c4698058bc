"""The gateway's OpenAI-compatible HTTP front end: the body read and typed, refusals as OpenAI error objects,
n / best_of samples, and the responses and SSE chunks in OpenAI's shapes; it hands typed fields to
gateway/pipeline.py like the gRPC servicer does."""
