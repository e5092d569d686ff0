"""`tessera`, the command-line client of Tessera's config as code (docs/config-as-code.md). It talks to the server
only through its REST API and imports nothing of the server (an import-linter contract in pyproject.toml)."""
