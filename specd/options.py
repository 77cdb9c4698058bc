"""The command-line options every service shares, each also read from the environment as SPECD_<NAME>.

A command-line value wins over the environment, which wins over the default. `ServiceOptions` is the
parsed, validated result; each service builds its own frozen config from it (see specd_cli/service_configs.py).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from specd import environment
from specd.drafts import DEFAULT_MAX_SPECULATIVE_TOKENS, MAX_DRAFT_TOKENS

# Default ports of docs/PUBLIC_SURFACE.md: (gRPC, HTTP / metrics).
GATEWAY_PORTS = (50051, 8000)
VERIFIER_PORTS = (50061, 9461)
DRAFTER_PORTS = (50071, 9471)
DEFAULT_VERIFIER_ADDR = f"127.0.0.1:{VERIFIER_PORTS[0]}"
DEFAULT_DRAFTER_ADDR = f"127.0.0.1:{DRAFTER_PORTS[0]}"
IN_PROCESS_DRAFTER = "in-process"  # --drafter-addr: the drafter's rule inside the verifier's engine process

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ASYNC_SCHEDULING = ("auto", "on", "off")
DRAFT_MEMORY_SCOPES = ("global", "per-key", "off")  # drafter_service/config.py's MEMORY_SCOPES
DRAFTING = ("evidence", "ngram")  # drafter_service/config.py's DrafterConfig.drafting
DRAFT_POLICIES = ("goodput", "batch-size")  # verifier_service/engine/draft_policy.py
MAX_GATEWAY_PROCESSES = 64
DEFAULT_MAX_GATEWAY_PROCESSES = 8  # --gateway-processes auto takes no more
VERIFIER_TRANSPORTS = ("socket", "grpc")  # --verifier-transport
MAX_STREAM_INTERVAL = 256  # --stream-interval: tokens a stream may gather into one event
# --num-speculative-tokens left unset, per device (measured: docs/BENCHMARKS_ARCHIVE.md, "CPU default for k").
DEFAULT_NUM_SPECULATIVE_TOKENS = {"cpu": 6, "cuda": 4}
# --max-num-seqs / --max-num-batched-tokens left unset, per device: a GPU serves hundreds of streams at once (CUDA
# graphs are captured for batches up to it); two CPU cores are saturated long before 64.
DEFAULT_MAX_NUM_SEQS = {"cpu": 64, "cuda": 256}
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cpu": 2048, "cuda": 8192}


@dataclass(frozen=True)
class ServiceOptions:
    """The shared options after parsing; ports of None mean the service's default."""

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    num_speculative_tokens: int | None = None  # None: the device's DEFAULT_NUM_SPECULATIVE_TOKENS
    max_speculative_tokens: int | None = None  # verifier: the most a request may ask for (None: specd/drafts.py)
    max_model_len: int = 0  # 0 = the model's own context length
    verifier_addrs: tuple[str, ...] = ()
    drafter_addr: str = DEFAULT_DRAFTER_ADDR
    host: str = "0.0.0.0"
    port: int | None = None
    http_port: int | None = None
    metrics_port: int | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    api_key: str | None = None
    kv_cache_bytes: int | None = None  # verifier: KV budget on the CPU (None = the engine's default)
    kv_cache_memory_fraction: float | None = None  # verifier on CUDA: share of free GPU memory for the KV cache
    max_waiting_requests: int = 256  # verifier: queued requests beyond this get RESOURCE_EXHAUSTED
    log_requests: bool = False  # gateway: log prompts and outputs (off: they never reach the logs)
    inject_delay_ms: int = 0  # drafter: testing aid, sleep this long before answering each batch
    async_scheduling: str = "auto"  # verifier: launch the next step before this one's tokens reach the host
    tensor_parallel_size: int = 1  # verifier: processes (one GPU each) the model is sharded over
    draft_memory_scope: str = "global"  # drafter: what its memory of earlier outputs may be shared across
    draft_memory_tokens: int | None = None  # drafter: tokens that memory holds (None = the drafter's default)
    draft_min_probability: float | None = None  # drafter: stop a draft below this chance (None = its default)
    drafting: str = "evidence"  # drafter: its rule; "ngram" = plain prompt lookup, for comparisons
    draft_policy: str = "batch-size"  # verifier: how many drafts a step gets ("goodput": measured, experimental)
    drain_seconds: float | None = None  # after SIGTERM, how long live calls may finish (None: the service's default)
    gateway_processes: int | None = None  # gateway: processes sharing its ports (None: sized from the CPUs)
    stream_interval: int = 1  # gateway: tokens a stream gathers per event after its first
    serve_port: int = 0  # verifier: the Serve socket's port (0: a free one, named in its load reports)
    verifier_transport: str = "socket"  # gateway: the Serve stream over the verifier's Serve socket, or gRPC
    max_num_seqs: int | None = None  # verifier: requests in the running batch (None: the device's default)
    max_num_batched_tokens: int | None = None  # verifier: tokens one step feeds the model (None: the device's)
    deterministic: bool = False  # verifier: batch-invariant kernels, the same greedy text in any batch

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens: must be >= 0 (0 turns speculation off)")
        if self.max_speculative_tokens is not None and not (
                (self.num_speculative_tokens or 0) <= self.max_speculative_tokens <= MAX_DRAFT_TOKENS):
            raise ValueError(f"max_speculative_tokens: must be in [num_speculative_tokens "
                             f"({self.num_speculative_tokens}), {MAX_DRAFT_TOKENS}]")
        if self.max_model_len < 0:
            raise ValueError("max_model_len: must be >= 0 (0 = the model's own context length)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert: --tls-cert and --tls-key must be given together")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 0:
            raise ValueError("kv_cache_bytes: must be >= 0 (0 = sized by the runner)")
        if self.kv_cache_memory_fraction is not None and not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValueError(f"kv_cache_memory_fraction: must be in (0, 1], got {self.kv_cache_memory_fraction}")
        if self.max_waiting_requests < 1:
            raise ValueError("max_waiting_requests: must be >= 1")
        if self.inject_delay_ms < 0:
            raise ValueError("inject_delay_ms: must be >= 0")
        if self.draft_memory_scope not in DRAFT_MEMORY_SCOPES:
            raise ValueError(f"draft_memory_scope: must be one of {', '.join(DRAFT_MEMORY_SCOPES)}, "
                             f"got {self.draft_memory_scope!r}")
        if self.drafting not in DRAFTING:
            raise ValueError(f"drafting: must be one of {', '.join(DRAFTING)}, got {self.drafting!r}")
        if self.draft_policy not in DRAFT_POLICIES:
            raise ValueError(f"draft_policy: must be one of {', '.join(DRAFT_POLICIES)}, got {self.draft_policy!r}")
        if self.async_scheduling not in ASYNC_SCHEDULING:
            raise ValueError(f"async_scheduling: must be one of {', '.join(ASYNC_SCHEDULING)}, "
                             f"got {self.async_scheduling!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.gateway_processes is not None and not 1 <= self.gateway_processes <= MAX_GATEWAY_PROCESSES:
            raise ValueError(f"gateway_processes: must be in 1..{MAX_GATEWAY_PROCESSES} or auto, "
                             f"got {self.gateway_processes}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(f"stream_interval: must be in 1..{MAX_STREAM_INTERVAL}, got {self.stream_interval}")
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"serve_port: must be in 0..65535, got {self.serve_port}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.drain_seconds is not None and self.drain_seconds < 0:
            raise ValueError(f"drain_seconds: must be >= 0, got {self.drain_seconds}")

    @property
    def verifier_addresses(self) -> tuple[str, ...]:
        return self.verifier_addrs or (DEFAULT_VERIFIER_ADDR,)

    def resolved_device(self) -> str:
        """auto = CUDA when torch can use it, else the CPU."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_num_speculative_tokens(self) -> int:
        """The k given, else the device's default (no more than --max-speculative-tokens)."""
        if self.num_speculative_tokens is not None:
            return self.num_speculative_tokens
        default = DEFAULT_NUM_SPECULATIVE_TOKENS[self.resolved_device()]
        return default if self.max_speculative_tokens is None else min(default, self.max_speculative_tokens)

    def resolved_gateway_processes(self, cpus_per_process: int = 1) -> int:
        """The number given, else one per `cpus_per_process` usable CPUs (at least 1, at most 8): a gateway alone
        in its container takes its CPUs; `specd up` leaves most of the machine to the other services."""
        if self.gateway_processes is not None:
            return self.gateway_processes
        from specd.cpu_budget import usable_cpus

        return max(1, min(DEFAULT_MAX_GATEWAY_PROCESSES, usable_cpus() // cpus_per_process))

    def resolved_dtype(self) -> str:
        """auto = bfloat16 on CUDA, float32 on the CPU (exactness tests rely on the latter)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device() == "cuda" else "float32"


def drain(options: ServiceOptions) -> dict:
    """The config field of --drain-seconds where it was given (else the service keeps its default)."""
    return {} if options.drain_seconds is None else {"grace_seconds": options.drain_seconds}


def add_service_options(parser: argparse.ArgumentParser) -> None:
    """Adds the shared options (defaults taken from SPECD_* env variables when set)."""
    defaults = ServiceOptions()
    group = parser.add_argument_group("shared options (each also as env SPECD_<NAME>)")
    group.add_argument("--model", default=environment.option("model", defaults.model),
                       help="Hugging Face checkpoint folder, or 'default' (SmolLM2-135M-Instruct)")
    group.add_argument("--device", choices=DEVICES, default=environment.option("device", defaults.device))
    group.add_argument("--dtype", choices=DTYPES, default=environment.option("dtype", defaults.dtype))
    group.add_argument("--num-speculative-tokens", type=int,
                       default=_optional_int(environment.option("num_speculative_tokens", None)),
                       help="draft tokens per step for requests that do not ask (0 turns speculation off; "
                            f"default per device: {DEFAULT_NUM_SPECULATIVE_TOKENS})")
    group.add_argument("--max-speculative-tokens", type=int,
                       default=_optional_int(environment.option("max_speculative_tokens", None)),
                       help="verifier: the most draft tokens per step a request may ask for; larger asks are "
                            "clamped (usage reports the k used). "
                            f"Default: max({DEFAULT_MAX_SPECULATIVE_TOKENS}, --num-speculative-tokens)")
    group.add_argument("--max-model-len", type=int,
                       default=int(environment.option("max_model_len", defaults.max_model_len)),
                       help="prompt + output tokens per request (0 = the model's own context length)")
    env_verifiers = environment.option("verifier_addr", "")
    group.add_argument("--verifier-addr", action="append", dest="verifier_addrs",
                       default=[a for a in env_verifiers.split(",") if a],
                       help=f"verifier HOST:PORT, repeatable (default {DEFAULT_VERIFIER_ADDR}; env: comma-separated)")
    group.add_argument("--drafter-addr", default=environment.option("drafter_addr", defaults.drafter_addr))
    group.add_argument("--host", default=environment.option("host", defaults.host))
    group.add_argument("--port", type=int, default=_optional_int(environment.option("port", None)),
                       help="gRPC port (default: the service's port of docs/PUBLIC_SURFACE.md)")
    group.add_argument("--http-port", type=int, default=_optional_int(environment.option("http_port", None)),
                       help=f"gateway HTTP port (default {GATEWAY_PORTS[1]})")
    group.add_argument("--metrics-port", type=int, default=_optional_int(environment.option("metrics_port", None)))
    group.add_argument("--tls-cert", default=environment.option("tls_cert", None))
    group.add_argument("--tls-key", default=environment.option("tls_key", None))
    group.add_argument("--tls-ca", default=environment.option("tls_ca", None))
    group.add_argument("--api-key", default=environment.option("api_key", None))
    group.add_argument("--kv-cache-bytes", type=int, default=_optional_int(environment.option("kv_cache_bytes", None)),
                       help="verifier: KV cache budget in bytes on the CPU (default: the engine's 256 MiB)")
    group.add_argument("--kv-cache-memory-fraction", type=float,
                       default=_optional_float(environment.option("kv_cache_memory_fraction", None)),
                       help="verifier on CUDA: share of free GPU memory (after the model) the KV cache takes "
                            "(default 0.8; --kv-cache-bytes wins)")
    group.add_argument("--max-waiting-requests", type=int,
                       default=int(environment.option("max_waiting_requests", defaults.max_waiting_requests)),
                       help="verifier: queued requests beyond this are refused with RESOURCE_EXHAUSTED")
    group.add_argument("--log-requests", action="store_true",
                       default=environment.option("log_requests", "").lower() in ("1", "true", "yes"),
                       help="gateway: log prompts and outputs (off by default: they never reach the logs)")
    group.add_argument("--inject-delay-ms", type=int, default=int(environment.option("inject_delay_ms", 0)),
                       help="drafter: testing aid, delay every batch of drafts by this many milliseconds")
    group.add_argument("--draft-policy", choices=DRAFT_POLICIES, default=environment.option("draft_policy", defaults.draft_policy),
                       help="verifier: batch-size = k drafts in every step of up to 32 running requests; goodput "
                            "(experimental) = each step gets the drafts that pay in measured tokens a second at its "
                            "batch size")
    group.add_argument("--deterministic", action="store_true",
                       default=environment.option("deterministic", "").lower() in ("1", "true", "yes"),
                       help="verifier: batch-invariant kernels, so greedy text (and seeded sampling) is the same "
                            "with or without speculation, alone or in any batch, run after run, in bfloat16 too "
                            "(tensor parallelism on the CPU only)")
    group.add_argument("--async-scheduling", choices=ASYNC_SCHEDULING,
                       default=environment.option("async_scheduling", defaults.async_scheduling),
                       help="verifier: schedule and launch the next step while the device runs this one, where "
                            "with or without drafts (auto = on CUDA only; output is the same either way)")
    group.add_argument("--tensor-parallel-size", type=int,
                       default=int(environment.option("tensor_parallel_size", defaults.tensor_parallel_size)),
                       help="verifier: shard the model over this many GPUs of the host, one process each "
                            "(on the CPU: processes)")
    group.add_argument("--draft-memory-scope", choices=DRAFT_MEMORY_SCOPES,
                       default=environment.option("draft_memory_scope", defaults.draft_memory_scope),
                       help="drafter: share its memory of earlier outputs across all requests (global), only "
                            "among requests of one tenant key (per-key), or keep none (off); "
                            "see docs/CONFIGURATION.md")
    group.add_argument("--draft-memory-tokens", type=int,
                       default=_optional_int(environment.option("draft_memory_tokens", None)),
                       help="drafter: tokens of earlier outputs it remembers (default 1,000,000)")
    group.add_argument("--draft-min-probability", type=float,
                       default=_optional_float(environment.option("draft_min_probability", None)),
                       help="drafter: a draft stops before the token whose estimated chance of acceptance falls "
                            "below this (default 0.15; 0 = always as many as asked)")
    group.add_argument("--drafting", choices=DRAFTING, default=environment.option("drafting", defaults.drafting),
                       help="drafter: evidence (own context and memory, lengths from the evidence) or ngram "
                            "(plain prompt lookup, k drafts whenever anything matches: the drafter before "
                            "its memory, kept for comparisons)")
    group.add_argument("--drain-seconds", type=float, default=_optional_float(environment.option("drain_seconds", None)),
                       help="after SIGTERM / SIGINT: how long live calls may finish before the rest are cancelled "
                            "(default: 10 for gateway and verifier, 5 for the drafter); keep Kubernetes' "
                            "terminationGracePeriodSeconds above it")
    group.add_argument("--max-num-seqs", type=int, default=_optional_int(environment.option("max_num_seqs", None)),
                       help=f"verifier: requests in the running batch, the rest wait (default per device: "
                            f"{DEFAULT_MAX_NUM_SEQS})")
    group.add_argument("--max-num-batched-tokens", type=int,
                       default=_optional_int(environment.option("max_num_batched_tokens", None)),
                       help=f"verifier: tokens one step feeds the model, prompt chunks included (default per "
                            f"device: {DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    group.add_argument("--gateway-processes", type=_processes, default=_processes(environment.option("gateway_processes", "auto")),
                       help="gateway: processes serving its ports, each a whole gateway on a core of its own "
                            "(auto: one per usable CPU, at most 8; under specd up one per 4 CPUs)")
    group.add_argument("--stream-interval", type=int, default=int(environment.option("stream_interval", "1")),
                       help="gateway: tokens a streamed response gathers into one event after its first token, "
                            "which is sent at once, as is the last (default 1: every step's tokens at once; more "
                            "costs the gateway less CPU a token, for a burstier stream)")
    group.add_argument("--serve-port", type=int, default=int(environment.option("serve_port", "0")),
                       help="verifier: port of its Serve socket, the gateways' request stream as plain frames "
                            "(default 0: a free port, which its load reports name to the gateways)")
    group.add_argument("--verifier-transport", choices=VERIFIER_TRANSPORTS,
                       default=environment.option("verifier_transport", "socket"),
                       help="gateway: socket = stream requests over each verifier's Serve socket (a fifth of "
                            "gRPC's CPU a message), gRPC Serve where a verifier reports none; grpc = always gRPC")


def _processes(value: str) -> int | None:
    """--gateway-processes: a count, or auto (None)."""
    return None if value in ("", "auto") else int(value)


def _optional_int(value: str | None) -> int | None:
    return None if value in (None, "") else int(value)


def _optional_float(value: str | None) -> float | None:
    return None if value in (None, "") else float(value)


def options_from_args(args: argparse.Namespace) -> ServiceOptions:
    """Validated ServiceOptions from parsed arguments; raises ValueError naming the bad option."""
    return ServiceOptions(
        model=args.model, device=args.device, dtype=args.dtype,
        num_speculative_tokens=args.num_speculative_tokens, max_speculative_tokens=args.max_speculative_tokens,
        max_model_len=args.max_model_len,
        verifier_addrs=tuple(args.verifier_addrs), drafter_addr=args.drafter_addr, host=args.host,
        port=args.port, http_port=args.http_port, metrics_port=args.metrics_port,
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca, api_key=args.api_key,
        kv_cache_bytes=args.kv_cache_bytes, kv_cache_memory_fraction=args.kv_cache_memory_fraction,
        max_waiting_requests=args.max_waiting_requests,
        log_requests=args.log_requests, inject_delay_ms=args.inject_delay_ms,
        async_scheduling=args.async_scheduling, tensor_parallel_size=args.tensor_parallel_size,
        draft_memory_scope=args.draft_memory_scope,
        draft_memory_tokens=args.draft_memory_tokens, draft_min_probability=args.draft_min_probability,
        drafting=args.drafting, draft_policy=args.draft_policy,
        drain_seconds=args.drain_seconds, gateway_processes=args.gateway_processes,
        stream_interval=args.stream_interval, serve_port=args.serve_port,
        verifier_transport=args.verifier_transport,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        deterministic=args.deterministic,
    )
