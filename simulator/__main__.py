"""`python -m simulator`: serve the emulated API until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from simulator.core import Simulator, SimulatorConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description="Emulated Kubernetes API server (HTTPS) with NVIDIA's GPU Operator behaviour on a seeded GPU "
        "fleet. kubectl and the official Python client work against it with the kubeconfig it writes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=6443, help="TCP port to listen on (0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; also put in the certificate")
    parser.add_argument("--nodes", type=int, default=20, help="number of GPU nodes to generate")
    parser.add_argument("--seed", type=int, default=1, help="seed for the fleet, workload, metrics and faults")
    parser.add_argument("--write-kubeconfig", metavar="PATH", help="where to write the kubeconfig (default: state dir)")
    parser.add_argument("--state-dir", help="directory for the certificate (default: a temporary one, removed on exit)")
    parser.add_argument("--token", help="bearer token clients must send (default: random, in the kubeconfig)")
    parser.add_argument(
        "--apply-delay", type=float, default=1.0, help="seconds per MIG Manager step (pending -> success)"
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added latency per API request")
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of API requests answered 500/503/429")
    parser.add_argument(
        "--write-error-rate", type=float, default=0.0, help="extra fraction of writes answered 409/500/503/429"
    )
    parser.add_argument(
        "--workload-pods", type=int, default=None, help="user pods holding GPUs at start (default: nodes / 2)"
    )
    parser.add_argument(
        "--mig-strategy", choices=("mixed", "single"), default="mixed", help="ClusterPolicy spec.mig.strategy"
    )
    parser.add_argument(
        "--mig-config-source",
        choices=("generated", "static"),
        default="generated",
        help="generated: per-node <node>-mig-config ConfigMaps (GPU Operator >= v26.3); "
        "static: ClusterPolicy names default-mig-parted-config",
    )
    parser.add_argument(
        "--watch-history", type=int, default=10000, help="events kept for watches; older resourceVersions get 410"
    )
    parser.add_argument("--log-requests", action="store_true", help="print one line per HTTP request to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = SimulatorConfig(
        nodes=args.nodes,
        seed=args.seed,
        host=args.host,
        port=args.port,
        kubeconfig_path=args.write_kubeconfig,
        state_dir=args.state_dir,
        token=args.token,
        apply_delay=args.apply_delay,
        latency_ms=args.latency_ms,
        error_rate=args.error_rate,
        write_error_rate=args.write_error_rate,
        workload_pods=args.workload_pods,
        mig_strategy=args.mig_strategy,
        mig_config_source=args.mig_config_source,
        watch_history=args.watch_history,
        log_requests=args.log_requests,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sim = Simulator(config).start()
    state = sim.state()
    print(
        f"tessera simulator serving {sim.url} kubeconfig={sim.kubeconfig_path} "
        f"nodes={state['nodes']} gpus={state['gpus']} pods={state['pods']} started_in={sim.startup_seconds:.2f}s",
        flush=True,
    )
    try:
        stop.wait()
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
