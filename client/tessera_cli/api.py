"""The REST API over urllib: `Authorization: Token …`, JSON in and out, the server's error shape kept."""

import json
import urllib.error
import urllib.request


class ApiError(Exception):
    """The server refused (its message and errors per field) or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors or {}


class Api:
    def __init__(self, url: str, token: str, *, timeout: float = 300):
        if not url:
            raise ApiError(0, "No server: set TESSERA_URL or pass --url.")
        if not token:
            raise ApiError(0, "No API token: set TESSERA_TOKEN or pass --token (make one on the API token page).")
        self.base = url.rstrip("/") + "/api/v1/"
        self.token, self.timeout = token, timeout

    def get(self, path: str) -> dict:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict | None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Token {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read() or b"{}")
            except ValueError:
                answer = {}
            message = answer.get("message") or answer.get("detail") or f"HTTP {exc.code} {exc.reason}"
            raise ApiError(exc.code, message, answer.get("errors")) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(0, f"Cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None
