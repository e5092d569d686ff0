"""The address of the client behind a request, for throttles and audit: never what the client itself wrote."""

from django.conf import settings


def client_address(request) -> str:
    """REMOTE_ADDR, or with TESSERA["TRUSTED_PROXY_COUNT"] = N > 0 proxies in front (each appends the address it was
    connected from to X-Forwarded-For), the entry the outermost trusted proxy appended: the N-th from the end. Entries
    before it are the client's own words. With 0 (the default) the header is ignored."""
    meta = request.META
    trusted = settings.TESSERA.get("TRUSTED_PROXY_COUNT", 0)
    if trusted > 0:
        forwarded = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            return forwarded[-min(trusted, len(forwarded))]
    return meta.get("REMOTE_ADDR", "")
