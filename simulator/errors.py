"""API errors rendered as `Status` objects, with the reasons and messages the real API server uses."""

from __future__ import annotations


class ApiError(Exception):
    """An error reply; `status()` is the body every Kubernetes client knows how to read."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    @classmethod
    def bad_request(cls, message: str, kind: str | None = None) -> ApiError:
        return cls(400, "BadRequest", message, {"kind": kind} if kind else None)

    @classmethod
    def unauthorized(cls) -> ApiError:
        return cls(401, "Unauthorized", "Unauthorized")

    @classmethod
    def not_found(cls, plural: str, name: str, group: str = "") -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(404, "NotFound", f'{qualified} "{name}" not found', {"name": name, "group": group, "kind": plural})

    @classmethod
    def path_not_found(cls, path: str) -> ApiError:
        return cls(404, "NotFound", f"the server could not find the requested resource ({path})")

    @classmethod
    def method_not_allowed(cls, method: str, path: str) -> ApiError:
        return cls(
            405, "MethodNotAllowed", f"the server does not allow this method on the requested resource: {method} {path}"
        )

    @classmethod
    def already_exists(cls, plural: str, name: str, group: str = "") -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(
            409, "AlreadyExists", f'{qualified} "{name}" already exists', {"name": name, "group": group, "kind": plural}
        )

    @classmethod
    def conflict(cls, plural: str, name: str, group: str = "") -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, "Expired", message)

    @classmethod
    def unsupported_media_type(cls, content_type: str) -> ApiError:
        return cls(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")

    @classmethod
    def invalid(cls, plural: str, name: str, message: str, group: str = "") -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(422, "Invalid", f'{qualified} "{name}" is invalid: {message}', {"name": name, "kind": plural})

    @classmethod
    def too_many_requests(cls, message: str, causes: list[dict] | None = None) -> ApiError:
        return cls(
            429, "TooManyRequests", message, {"causes": causes} if causes else None, headers={"Retry-After": "1"}
        )

    @classmethod
    def injected(cls, code: int) -> ApiError:
        """A fault drawn by the fault knobs: the shape a real server or its proxy gives for that code."""
        if code == 429:
            return cls.too_many_requests(
                "the server has received too many requests and has asked us to try again later"
            )
        if code == 409:
            return cls(409, "Conflict", "Operation cannot be fulfilled: the object has been modified (injected fault)")
        if code == 503:
            return cls(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        if code == 504:
            return cls(504, "Timeout", "the server was unable to return a response in the time allotted")
        return cls(code, "InternalError", "an error on the server has prevented the request from succeeding")
