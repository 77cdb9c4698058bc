"""A running gateway (gRPC + HTTP, ports chosen by the OS) in front of one scripted verifier."""
from __future__ import annotations

from dataclasses import dataclass

from gateway.config import GatewayConfig
from gateway.server import RunningGateway, start
from gateway.tokenizer import Tokenizer
from support.scripted_verifier import ScriptedVerifier

# What the scripted verifier generates, followed by the end-of-sequence token.
REPLY = " Hello 世界 🎉 done."
MAX_MODEL_LEN = 256


@dataclass
class GatewayStack:
    gateway: RunningGateway
    verifier: ScriptedVerifier
    reply_ids: list[int]

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}"

    def errors_counted(self, code: str) -> float:
        """The gateway's specd_request_errors_total{code} (0 before the first)."""
        return self.gateway.pipeline.metrics.registry.get_sample_value(
            "specd_request_errors_total", {"code": code}) or 0.0

    async def stop(self) -> None:
        await self.gateway.stop(0)
        await self.verifier.stop()


async def start_gateway_stack(tokenizer: Tokenizer, api_key: str | None = None,
                              max_model_len: int = MAX_MODEL_LEN, tokens_per_step: int = 3,
                              stream_interval: int = 1, step_seconds: float = 0.0) -> GatewayStack:
    reply_ids = tokenizer.encode(REPLY) + [tokenizer.hf.eos_token_id]
    verifier = await ScriptedVerifier(reply_ids, tokens_per_step=tokens_per_step, model="SmolLM2-135M-Instruct",
                                      max_model_len=max_model_len).start()
    verifier.step_seconds = step_seconds
    config = GatewayConfig(model_path=str(tokenizer.model_path), verifier_addrs=(verifier.address,),
                           host="127.0.0.1", grpc_port=0, http_port=0, api_key=api_key,
                           health_poll_seconds=0.05, grace_seconds=0, stream_interval=stream_interval)
    return GatewayStack(await start(config), verifier, reply_ids)
