"""The engine's name for the request schema, which lives in specd/sampling.py (torch-free, shared with the gateway
and both converters). Kept only for the importers owned elsewhere for now (engine/engine.py, bench/); new code
imports specd.sampling."""
from specd.sampling import MAX_LOGPROBS, InvalidParameter, SamplingParams  # noqa: F401
