"""API errors rendered as Kubernetes `Status` objects."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error the API server answers with a `kind: Status` body and an HTTP code."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def not_found(cls, qualified: str, name: str) -> ApiError:
        group, _, kind = qualified.partition(".")
        details = {"name": name, "group": kind, "kind": group}
        return cls(404, "NotFound", f'{qualified} "{name}" not found', details)

    @classmethod
    def already_exists(cls, qualified: str, name: str) -> ApiError:
        group, _, kind = qualified.partition(".")
        details = {"name": name, "group": kind, "kind": group}
        return cls(409, "AlreadyExists", f'{qualified} "{name}" already exists', details)

    @classmethod
    def conflict(cls, qualified: str, name: str, why: str) -> ApiError:
        group, _, kind = qualified.partition(".")
        details = {"name": name, "group": kind, "kind": group}
        return cls(409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}', details)

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, "Expired", message)

    @classmethod
    def invalid(cls, kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
        qualified = f"{kind}.{group}" if group else kind
        texts = [f"{cause['field']}: {cause['message']}" for cause in causes]
        summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        details = {"name": name, "group": group, "kind": kind, "causes": causes}
        return cls(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details)
