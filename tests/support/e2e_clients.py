"""Small clients the e2e tests share: gRPC Generate through the gateway, verifier load reports, Hugging Face's
greedy reference. A service's metrics are read with bench/local_stack.py's metric_value, beside the stack."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import grpc

from specd.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str
    usage: object
    num_messages: int


def greedy_request(prompt: str, max_tokens: int, **fields) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0, **fields)


def generate(address: str, prompt: str, max_tokens: int, **fields) -> Generation:
    """A greedy gRPC Generate through the gateway, collected."""
    request = greedy_request(prompt, max_tokens, **fields)
    token_ids, texts, last, count = [], [], None, 0
    with grpc.insecure_channel(address) as channel:
        for response in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120):
            token_ids += response.token_ids
            texts.append(response.text)
            last, count = response, count + 1
    return Generation(token_ids, "".join(texts), last.finish_reason, last.usage, count)


def load_report(address: str) -> verifier_pb2.LoadReport:
    with grpc.insecure_channel(address) as channel:
        return verifier_pb2_grpc.VerifierStub(channel).GetLoad(verifier_pb2.GetLoadRequest(), timeout=10)


def wait_for_load(address: str, condition, timeout: float = 30.0) -> verifier_pb2.LoadReport:
    """Polls the verifier's load report until `condition(report)` holds; the report that satisfied it."""
    deadline = time.monotonic() + timeout
    while not condition(report := load_report(address)):
        assert time.monotonic() < deadline, f"{address}: load report never satisfied the condition: {report}"
        time.sleep(0.05)
    return report


def wait_until_idle(address: str, timeout: float = 30.0) -> verifier_pb2.LoadReport:
    """No live request left on the verifier (aborts are applied between engine steps)."""
    return wait_for_load(address, lambda report: report.num_running + report.num_waiting == 0, timeout)


@functools.lru_cache(maxsize=None)
def _hf_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specd.default_model import resolve_model_path

    path = resolve_model_path("default")
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=None)
def hf_greedy(prompt: str, max_tokens: int) -> tuple[int, ...]:
    """transformers' greedy continuation of `prompt` on the default model, float32 CPU (EOS included)."""
    import torch

    tokenizer, model = _hf_model()
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        output = model.generate(input_ids, max_new_tokens=max_tokens, do_sample=False)
    return tuple(output[0, input_ids.shape[1]:].tolist())
