"""Command-line options shared by `python -m agent` and `python -m agent.fleet`."""

from __future__ import annotations

import argparse
import os

from agent.client import server_url_problem


def add_insecure_lab_argument(parser: argparse.ArgumentParser) -> None:
    """--insecure-lab: said explicitly, on the command line or in the environment, never assumed from the URL."""
    parser.add_argument(
        "--insecure-lab",
        action="store_true",
        default=os.environ.get("TESSERA_INSECURE_LAB", "").lower() in ("1", "true", "yes"),
        help="accept an http:// server URL: a lab only, secrets cross the network in clear ($TESSERA_INSECURE_LAB=1)",
    )


def check_server_url(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """A usage error (exit 2) before anything starts: no server URL, or one the agent refuses."""
    if not args.server:
        parser.error("--server (or TESSERA_SERVER) is required")
    problem = server_url_problem(args.server, insecure_lab=args.insecure_lab)
    if problem:
        parser.error(problem)
