"""The error every layer raises for a bad request field: torch-free, so the base, the gateway, the drafter and the
engine share it without importing one another."""
from __future__ import annotations


class InvalidParameter(ValueError):
    """A request field has a bad value; `field` names it (mapped to INVALID_ARGUMENT / HTTP 400)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self):  # crosses the engine process's pipe
        return InvalidParameter, (self.field, self.message)
