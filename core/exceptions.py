"""The one domain error type; the API maps it to 400/409 and the UI shows its message."""


class ApplicationError(Exception):
    """A rule of the domain refused the request; `errors` maps fields to messages."""

    def __init__(self, message: str, *, errors: dict[str, list[str]] | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.errors = errors or {}
        self.status = status
