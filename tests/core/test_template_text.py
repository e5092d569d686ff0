"""Django's `{# … #}` comment is one line: one that runs over several lines is shown on the page as text."""

import re
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
OPEN_COMMENT = re.compile(r"\{#(?![^\n]*#\})")


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: str(p.relative_to(TEMPLATES)))
def test_no_comment_runs_over_its_line(template):
    for number, line in enumerate(template.read_text().splitlines(), 1):
        assert not OPEN_COMMENT.search(line), f"{template.relative_to(TEMPLATES)}:{number}: use {{% comment %}}"
