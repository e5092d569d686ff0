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
