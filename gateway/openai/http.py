"""The OpenAI-compatible HTTP API: completions and chat completions (gateway/openai/generation.py), and in
FastAPI models, health and metrics.

Bodies are read by gateway/openai/http_body.py and typed by gateway/openai/schema.py; ranges are checked by the
shared validation; the pipeline does the rest. A client that disconnects cancels its request, and with it
the verifier call. Every error is an OpenAI error object, counted in specd_request_errors_total by the
grpc code of the same meaning.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from gateway.auth import ApiKeyMiddleware
from gateway.openai import responses
from gateway.openai.generation import GenerationRoutes
from gateway.openai.http_errors import install_error_handlers
from gateway.pipeline import Pipeline


def create_app(pipeline: Pipeline, api_key: str | None = None, request_timeout_seconds: float | None = None):
    """The HTTP app (ASGI) around `pipeline`; with `api_key`, /v1/* requires `authorization: Bearer <key>`."""
    app = FastAPI(title="specd gateway", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app, pipeline.metrics)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(pipeline)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in pipeline.served_model_names:
            raise HTTPException(404, f"no model {model_id!r}; this server serves {pipeline.model_name!r}")
        return _model_card(pipeline)

    @app.get("/health")
    async def health():
        """200 while any verifier replica is healthy; `verifiers` tells each replica's state."""
        healthy = pipeline.router.any_healthy
        replicas = {r.address: "healthy" if r.healthy else "unhealthy" for r in pipeline.router.replicas}
        return JSONResponse({"status": "ok" if healthy else "no healthy verifier", "verifiers": replicas},
                            200 if healthy else 503)

    @app.get("/metrics")
    async def metrics():
        body, content_type = pipeline.metrics.exposition()
        return Response(body, media_type=content_type)

    front = GenerationRoutes(app, pipeline, request_timeout_seconds)
    if api_key is None:
        return front
    return ApiKeyMiddleware(front, api_key=api_key, on_refused=pipeline.metrics.count_rejected,
                            refusal=JSONResponse(responses.error_body("missing or wrong API key",
                                                                     "authentication_error"), 401))


def _model_card(pipeline: Pipeline) -> dict:
    return {"id": pipeline.model_name, "object": "model", "created": 0, "owned_by": "specd",
            "max_model_len": pipeline.max_model_len()}
