"""axe-core (bundled by axe-playwright-python) in the browser suite: the WCAG A/AA rules Tessera meets and one check
of a page as it is now. docs/accessibility.md says what is checked and what is not."""

from axe_playwright_python.sync_playwright import Axe

# The WCAG 2.0, 2.1 and 2.2 A and AA rules of axe-core (best practices and AAA are not the target).
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
# Rules switched off, each with its reason. Keep docs/accessibility.md's "Known exceptions" in step.
EXCEPTIONS: dict[str, str] = {}
AXE = Axe()


def axe_violations(page, state: str) -> list[str]:
    """axe's WCAG A/AA violations on the page as it is now, one line per rule: state, rule, impact, the first nodes."""
    options = {
        "runOnly": {"type": "tag", "values": WCAG_TAGS},
        "rules": {rule: {"enabled": False} for rule in EXCEPTIONS},
        "resultTypes": ["violations"],
    }
    results = AXE.run(page, options=options).response
    lines = []
    for violation in results["violations"]:
        targets = "; ".join(
            f"{' '.join(node['target'])} ({node.get('failureSummary', '').splitlines()[-1].strip()})"
            for node in violation["nodes"][:4]
        )
        lines.append(f"{state}: {violation['id']} [{violation['impact']}] ×{len(violation['nodes'])}: {targets}")
    return lines
