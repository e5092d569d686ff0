"""Two stock middlewares made to cost nothing on requests that do not use them: every request passes through both,
and on the agent report path (bench/b2_agent_ingest.py) they were an eighth of the server's CPU."""

import functools

from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject
from csp.middleware import CSPMiddleware as StockCSPMiddleware
from csp.utils import build_policy
from django.conf import settings
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.messages.storage import default_storage
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.functional import SimpleLazyObject, empty

# Attributes django-csp's decorators set on a response to change its policy.
_PER_RESPONSE = ("_csp_config", "_csp_update", "_csp_replace", "_csp_config_ro", "_csp_update_ro", "_csp_replace_ro")


@functools.cache
def _policies() -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """(header, exemption attribute, policy, excluded path prefixes) of the enforced and the report-only policy, from
    settings alone: what django-csp rebuilds for every response."""

    def excluded(name):
        return tuple((getattr(settings, name, None) or {}).get("EXCLUDE_URL_PREFIXES") or ())

    return (
        (HEADER, "_csp_exempt", build_policy(), excluded("CONTENT_SECURITY_POLICY")),
        (
            HEADER_REPORT_ONLY,
            "_csp_exempt_ro",
            build_policy(report_only=True),
            excluded("CONTENT_SECURITY_POLICY_REPORT_ONLY"),
        ),
    )


@receiver(setting_changed)
def _forget_policies(setting, **kwargs):
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _policies.cache_clear()


class CSPMiddleware(StockCSPMiddleware):
    """django-csp's middleware with the policy built once. A response carrying a per-view policy (django-csp's
    decorators) or a request that drew a nonce goes through django-csp's own builder; every other response gets the
    same headers django-csp would have built."""

    def process_response(self, request, response):
        if getattr(request, "_csp_nonce", None) is not None or any(hasattr(response, a) for a in _PER_RESPONSE):
            return super().process_response(request, response)
        if settings.DEBUG and response.status_code in (404, 500):  # Django's debug pages, as django-csp leaves them
            return response
        for header, exempt, policy, excluded in _policies():
            exempted = getattr(response, exempt, False) or request.path_info.startswith(excluded)
            if policy and header not in response and not exempted:
                response[header] = policy
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response


class LazyMessageMiddleware(MessageMiddleware):
    """Django's message middleware, building the message storage (a cookie and a session storage) only when a
    request adds or reads a message: an API request never does. A storage never built has nothing to save."""

    def process_request(self, request):
        request._messages = SimpleLazyObject(lambda: default_storage(request))

    def process_response(self, request, response):
        messages = getattr(request, "_messages", None)
        if isinstance(messages, SimpleLazyObject) and messages._wrapped is empty:
            return response
        return super().process_response(request, response)
