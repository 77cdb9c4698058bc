"""The `specd` command: `up` (the whole stack), `drafter` / `verifier` / `gateway` (one service each,
as Helm runs them) and `generate` (a streaming gRPC client of the gateway)."""
from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import sys

from specd.openmp import apply_wait_policy

apply_wait_policy()  # before anything loads torch's OpenMP runtime, which reads it once

from specd import stop_signals
from specd.options import GATEWAY_PORTS, ServiceOptions, add_service_options, options_from_args


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every subcommand (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="specd", description="LLM inference with lossless speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start drafter, verifier replica(s) and gateway; Ctrl-C stops them")
    up.add_argument("--num-verifiers", type=int, default=1, help="verifier replicas behind the gateway")
    up.add_argument("--port-offset", type=int, default=0,
                    help="add this to every default port, so stacks can run side by side")
    for name, help_text in (("drafter", "the n-gram drafter service"),
                            ("verifier", "the target-model service (owns the GPU)"),
                            ("gateway", "the gRPC + OpenAI-compatible HTTP front door")):
        commands.add_parser(name, help=help_text)
    for sub in commands.choices.values():
        add_service_options(sub)
    generate = commands.add_parser("generate", help="stream a completion from a running gateway")
    generate.add_argument("prompt")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--num-speculative-tokens", type=int, default=None)
    generate.add_argument("--addr", default=f"127.0.0.1:{GATEWAY_PORTS[0]}", help="gateway HOST:PORT")
    generate.add_argument("--api-key", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `specd` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command != "generate":  # before anything slow: a stop asked for during start-up is kept
        stop_signals.install()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s")
    if args.command == "generate":
        from specd.generate_client import generate

        return generate(args)
    try:
        options = options_from_args(args)
    except ValueError as error:
        print(f"specd {args.command}: {error}", file=sys.stderr)
        return 2
    if args.command == "up":
        code = _up(options, args.num_verifiers, args.port_offset)
        stop_signals.ignore()
        return code
    from specd.startup_errors import StartupError

    try:
        _run_service(args.command, options)
    except StartupError as error:  # one line that names the setting, not a traceback
        print(f"specd {args.command}: {error}", file=sys.stderr, flush=True)
        return 2
    stop_signals.ignore()
    return 0


def _up(options: ServiceOptions, num_verifiers: int, port_offset: int) -> int:
    from specd_cli.launcher import StackSupervisor, plan_stack
    from specd.serving import TlsConfig

    try:
        services = plan_stack(options, num_verifiers, port_offset)
    except ValueError as error:
        print(f"specd up: {error}", file=sys.stderr)
        return 2
    tls = TlsConfig(options.tls_cert, options.tls_key, options.tls_ca) if options.tls_cert else None
    return StackSupervisor(services, tls, options.drain_seconds).run()


def _run_service(name: str, options: ServiceOptions) -> None:
    """Builds the service's frozen config and serves until SIGTERM / SIGINT."""
    if name == "verifier":
        from verifier_service.config import verifier_config_from_options
        from verifier_service.server import serve

        config = verifier_config_from_options(options)
    elif name == "drafter":
        from drafter_service.server import serve
        from drafter_service.config import drafter_config_from_options

        config = drafter_config_from_options(options)
    else:
        from gateway.processes import main as serve
        from specd_cli.service_configs import gateway_config_from_options

        config = gateway_config_from_options(options)
    if stop_signals.requested():  # stopped while importing: nothing was started
        return
    result = serve(config)
    if inspect.iscoroutine(result):
        asyncio.run(result)

