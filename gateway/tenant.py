"""The tenant key: who a request is for, as the drafter's per-key memory scope partitions by it.

The drafter remembers earlier outputs to draft later requests; drafts are only scored, never returned,
but how fast a request is served shows whether they were accepted, so a shared memory would let one
client learn about another's outputs. With `--draft-memory-scope per-key` the drafter keeps one memory
per tenant key. The key is made here, from what the client presents:

- the bearer token (`authorization: Bearer <key>`), whether or not the gateway checks one, and
- the `x-specd-tenant` header (HTTP) or metadata entry (gRPC), for deployments where a trusted proxy in
  front of the gateway authenticates users and names the tenant.

Both go into one digest, so a client can only ever reach tenants under the key it holds, and the key
itself never leaves the gateway. A request with neither gets "" (one shared key of its own).
"""
from __future__ import annotations

import hashlib

TENANT_HEADER = "x-specd-tenant"  # HTTP header and gRPC metadata key (lower case, as gRPC requires)
_DOMAIN = b"specd tenant key v1\x00"


def tenant_key(authorization: str | None, tenant: str | None) -> str:
    """32 hex digits of SHA-256 over the bearer token and the tenant header; "" when both are absent."""
    bearer = authorization[len("Bearer "):] if authorization and authorization.startswith("Bearer ") else ""
    if not bearer and not tenant:
        return ""
    digest = hashlib.sha256(_DOMAIN + bearer.encode() + b"\x00" + (tenant or "").encode())
    return digest.hexdigest()[:32]
