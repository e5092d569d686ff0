"""`python -m agent`: the node agent's command line; flags fall back to TESSERA_* environment variables."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import pynvml

from agent import AGENT_VERSION
from agent.backends.nvml import NvmlBackend
from agent.backends.nvml.calls import nvml_error_name
from agent.backends.simulated import DEFAULT_PRODUCT, SimulatedBackend
from agent.options import add_insecure_lab_argument, check_server_url
from agent.runner import EXIT_USAGE, Agent, AgentSettings
from sharing.mig import UnknownProductError, get_product

DEFAULT_STATE_DIR = "/var/lib/tessera-agent"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="Tessera node agent: reports this node's GPUs and applies the sharing config the server sets.",
    )
    parser.add_argument("--server", default=os.environ.get("TESSERA_SERVER"), help="server URL ($TESSERA_SERVER)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--join-token", help="one-time join token ($TESSERA_JOIN_TOKEN); a file or env keeps it off ps")
    token.add_argument("--join-token-file", type=Path, help="file holding the join token")
    parser.add_argument(
        "--service-account-token-file",
        type=Path,
        default=os.environ.get("TESSERA_SERVICE_ACCOUNT_TOKEN_FILE") or None,
        help="projected Kubernetes service-account token (audience tessera) presented at registration, for join "
        "tokens bound to a service account ($TESSERA_SERVICE_ACCOUNT_TOKEN_FILE)",
    )
    parser.add_argument(
        "--rotate-credential",
        action="store_true",
        help="register again presenting the stored credential: a new one replaces it (needs the join token)",
    )
    parser.add_argument("--interval", type=float, help="seconds between reports (default: what the server says)")
    parser.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=f"default {DEFAULT_STATE_DIR}")
    parser.add_argument("--hostname", default=os.environ.get("TESSERA_HOSTNAME"), help="node name ($TESSERA_HOSTNAME)")
    parser.add_argument("--once", action="store_true", help="one report (and apply) cycle, then exit")
    add_insecure_lab_argument(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"tessera-agent {AGENT_VERSION}")
    simulated = parser.add_argument_group("simulated GPUs (no driver needed)")
    simulated.add_argument("--simulate", action="store_true", help="drive simulated GPUs instead of NVML")
    simulated.add_argument("--seed", type=int, default=0, help="makes UUIDs, workload and metrics reproducible")
    simulated.add_argument("--product", default=DEFAULT_PRODUCT, help=f"GPU model (default {DEFAULT_PRODUCT})")
    simulated.add_argument("--gpus", type=int, default=8, help="GPUs on the simulated node (1-16, default 8)")
    simulated.add_argument("--no-workload", action="store_true", help="no simulated jobs: GPUs stay idle")
    return parser


def _join_token(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    if args.join_token_file is not None:
        try:
            return args.join_token_file.read_text().strip() or None
        except OSError as error:
            parser.error(f"cannot read the join token file: {error.strerror}: {args.join_token_file}")
    return args.join_token or os.environ.get("TESSERA_JOIN_TOKEN") or None


def _no_driver_message(error: pynvml.NVMLError) -> str:
    if isinstance(error, pynvml.NVMLError_LibraryNotFound):
        return "no NVIDIA driver (NVML library not found) on this host; use --simulate to run with simulated GPUs"
    if isinstance(error, pynvml.NVMLError_DriverNotLoaded):
        return "no NVIDIA driver (kernel module not loaded) on this host; use --simulate to run with simulated GPUs"
    return f"the NVIDIA driver cannot be used ({nvml_error_name(error)}: {error}); use --simulate for simulated GPUs"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_server_url(args, parser)
    if args.simulate:
        try:
            get_product(args.product)
        except UnknownProductError as error:
            parser.error(str(error))
        if not 1 <= args.gpus <= 16:
            parser.error(f"--gpus must be 1 to 16, not {args.gpus}")
    join_token = _join_token(args, parser)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    try:
        if args.simulate:
            backend = SimulatedBackend(
                seed=args.seed, product=args.product, gpus=args.gpus, workload=not args.no_workload
            )
        else:
            backend = NvmlBackend()
    except pynvml.NVMLError as error:
        print(_no_driver_message(error), file=sys.stderr)
        return EXIT_USAGE

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        settings = AgentSettings(
            args.server,
            args.state_dir,
            join_token,
            args.interval,
            args.hostname,
            args.once,
            args.insecure_lab,
            args.service_account_token_file,
            args.rotate_credential,
        )
        try:
            agent = Agent(settings, backend, stop=stop)
        except (ValueError, OSError) as error:
            print(f"cannot use the state directory: {error}", file=sys.stderr)
            return EXIT_USAGE
        return agent.run()
    finally:
        backend.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
