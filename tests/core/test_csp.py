"""A Content-Security-Policy without inline script, and templates that need none (issue 15, point 10); Chromium runs
the pages under it in tests/browser/test_security_ui.py."""

import re
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline <script>"),
    (re.compile(r"\s(on[a-z]+)\s*=", re.I), "an inline event handler"),
    (re.compile(r"\shx-on[:\w-]*\s*=", re.I), "an hx-on handler (evaluated as script)"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
    (re.compile(r"hx-vals\s*=\s*['\"]js:", re.I), "hx-vals evaluated as script"),
    # Nothing from outside (issue 17, point 10): links to documentation are fine, loading from another host is not.
    (
        re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)\s*=\s*['\"]?(?:https?:)?//", re.I),
        "a resource loaded from another host",
    ),
]


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: str(p.relative_to(TEMPLATES)))
def test_templates_hold_no_inline_script(template):
    text = template.read_text()
    for pattern, what in INLINE:
        match = pattern.search(text)
        assert match is None, f"{template.relative_to(TEMPLATES)} has {what}: {match.group(0)!r}"


@pytest.mark.django_db
def test_every_page_carries_the_policy(client, viewer):
    client.force_login(viewer)
    policy = client.get("/")["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["script-src"] == "'self'" and directives["object-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'" and "unsafe-eval" not in policy


def _directives(policy: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in policy.split(";"))


@pytest.mark.django_db
def test_the_policy_built_once_is_the_one_django_csp_builds(client, viewer, settings):
    """The header comes from a policy built once (core.middleware), and follows the settings when they change."""
    from csp.utils import build_policy

    client.force_login(viewer)
    assert _directives(client.get("/")["Content-Security-Policy"]) == _directives(build_policy())
    assert _directives(client.get("/api/v1/nodes/")["Content-Security-Policy"]) == _directives(build_policy())
    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": ["'none'"]}}
    settings.CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": {"script-src": ["'self'"]}}
    response = client.get("/")
    assert _directives(response["Content-Security-Policy"]) == {"default-src": "'none'"}
    assert _directives(response["Content-Security-Policy-Report-Only"])["script-src"] == "'self'"


def test_a_per_view_policy_and_a_nonce_still_go_through_django_csp(rf, settings):
    """django-csp's decorators and nonces keep working: those responses are built per response."""
    from csp.constants import NONCE, SELF
    from csp.decorators import csp_exempt, csp_update
    from django.http import HttpResponse

    from core.middleware import CSPMiddleware

    def nonce_view(request):
        return HttpResponse(str(request.csp_nonce))

    settings.CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"script-src": [SELF, NONCE]}}
    response = CSPMiddleware(nonce_view)(rf.get("/"))
    assert (
        _directives(response["Content-Security-Policy"])["script-src"] == f"'self' 'nonce-{response.content.decode()}'"
    )
    assert (
        _directives(CSPMiddleware(lambda request: HttpResponse())(rf.get("/"))["Content-Security-Policy"])["script-src"]
        == "'self'"
    )

    updated = CSPMiddleware(csp_update({"img-src": "https://images.example"})(lambda request: HttpResponse()))
    assert "https://images.example" in _directives(updated(rf.get("/"))["Content-Security-Policy"])["img-src"]
    exempt = CSPMiddleware(csp_exempt()(lambda request: HttpResponse()))
    assert "Content-Security-Policy" not in exempt(rf.get("/"))
