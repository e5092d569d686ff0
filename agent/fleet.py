"""Many simulated agents in one process (threads), for the demo fleet and benchmark B2.

python -m agent.fleet --server URL --join-token TOKEN --count 20 --state-root var/agents [--insecure-lab]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.backends.simulated import DEFAULT_PRODUCT, SimulatedBackend
from agent.options import add_insecure_lab_argument, check_server_url
from agent.runner import Agent, AgentSettings


@dataclass
class Fleet:
    """Running simulated agents; `agents[i].backend.sim` injects XIDs or load into node i."""

    agents: list[Agent]
    threads: list[threading.Thread]
    stop_event: threading.Event
    exit_codes: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout)


def start_fleet(
    server: str,
    join_token: str | None,
    count: int,
    state_root: Path,
    *,
    first_seed: int = 0,
    products: Sequence[str] = (DEFAULT_PRODUCT,),
    gpus: int = 8,
    interval: float | None = None,
    workload: bool = True,
    insecure_lab: bool = False,
) -> Fleet:
    """Start `count` agents, seeds first_seed…, each with its own state dir and a product from `products` in turn."""
    stop_event = threading.Event()
    fleet = Fleet([], [], stop_event)
    for seed in range(first_seed, first_seed + count):
        product = products[(seed - first_seed) % len(products)]
        backend = SimulatedBackend(seed=seed, product=product, gpus=gpus, workload=workload)
        hostname = backend.sim.host.hostname()
        settings = AgentSettings(server, Path(state_root) / hostname, join_token, interval, insecure_lab=insecure_lab)
        agent = Agent(settings, backend, stop=stop_event, log=logging.getLogger(f"agent.{hostname}"))
        thread = threading.Thread(target=_run, args=(fleet, agent, hostname), name=hostname, daemon=True)
        fleet.agents.append(agent)
        fleet.threads.append(thread)
        thread.start()
    return fleet


def _run(fleet: Fleet, agent: Agent, hostname: str) -> None:
    try:
        fleet.exit_codes[hostname] = agent.run()
    finally:
        agent.backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.fleet", description="Run simulated Tessera agents.")
    parser.add_argument("--server", default=os.environ.get("TESSERA_SERVER"))
    parser.add_argument("--join-token", default=os.environ.get("TESSERA_JOIN_TOKEN"))
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--state-root", type=Path, default=Path("var/agents"))
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--product", action="append", dest="products", help="repeat to mix models")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float)
    parser.add_argument("--no-workload", action="store_true", help="no simulated jobs: GPUs stay idle")
    add_insecure_lab_argument(parser)
    args = parser.parse_args(argv)
    check_server_url(args, parser)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fleet = start_fleet(
        args.server,
        args.join_token,
        args.count,
        args.state_root,
        first_seed=args.first_seed,
        products=args.products or (DEFAULT_PRODUCT,),
        gpus=args.gpus,
        interval=args.interval,
        workload=not args.no_workload,
        insecure_lab=args.insecure_lab,
    )
    try:
        while any(thread.is_alive() for thread in fleet.threads):
            fleet.stop_event.wait(1)
    except KeyboardInterrupt:
        pass
    fleet.stop()
    return max(fleet.exit_codes.values(), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
