"""`python -m simulator`: serve the emulated API until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from simulator.core import Simulator, SimulatorConfig
from simulator.errors import ApiError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description="Emulated Kubernetes API server (HTTPS) with NVIDIA's GPU Operator behaviour on a seeded GPU "
        "fleet. kubectl and the official Python client work against it with the kubeconfig it writes.",
        epilog="Fault knobs can also be changed while running: POST /_sim/faults (see simulator/README.md).",
    )
    _add_server_arguments(parser)
    _add_fault_arguments(parser)
    _add_cluster_arguments(parser)
    return parser


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it listens, what fleet it generates, and how clients reach it."""
    parser.add_argument(
        "--port", type=int, default=6443, help="TCP port to listen on; 0 picks a free one (default %(default)s)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on, also named in the certificate (default %(default)s)"
    )
    parser.add_argument("--nodes", type=int, default=20, help="number of GPU nodes to generate (default %(default)s)")
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the fleet, workload, metric values and random faults (default %(default)s)",
    )
    parser.add_argument(
        "--write-kubeconfig", metavar="PATH", help="where to write the kubeconfig (default: <state dir>/kubeconfig)"
    )
    parser.add_argument(
        "--state-dir",
        help="directory for the certificate, the token and the cluster's state: a restart with the same directory, "
        "seed and fleet flags brings back what was changed (default: a temporary one, removed on exit)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="start from the seed even if --state-dir holds a saved cluster"
    )
    parser.add_argument(
        "--save-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds from a change to the rewrite of the saved cluster (longer for big fleets: at most a tenth of "
        "the time goes to writing it); 0 keeps nothing, the cluster starts from the seed (default %(default)s)",
    )
    parser.add_argument("--token", help="bearer token clients must send (default: random; it is in the kubeconfig)")


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    """How slow and unreliable the API and the MIG Manager are."""
    parser.add_argument(
        "--apply-delay",
        type=float,
        default=1.0,
        help="seconds per MIG Manager step: pending -> success, or pending -> rebooting -> success "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="latency added to every API request (default %(default)s)"
    )
    parser.add_argument(
        "--error-rate",
        type=float,
        default=0.0,
        help="fraction of API requests answered with an error: 500, 503 or 429 (default %(default)s)",
    )
    parser.add_argument(
        "--write-error-rate",
        type=float,
        default=0.0,
        help="extra fraction of writes answered with an error; add 409 to the codes with "
        "--faults '{\"error_codes\": [409, 500]}' (default %(default)s)",
    )
    parser.add_argument(
        "--watch-drop-after-events", type=int, default=0, help="cut every watch stream after N events (0 = never)"
    )
    parser.add_argument(
        "--watch-drop-after-seconds", type=float, default=0.0, help="cut every watch stream after S seconds (0 = never)"
    )
    parser.add_argument(
        "--faults",
        type=json.loads,
        default={},
        metavar="JSON",
        help='any fault knob, as the body of POST /_sim/faults, e.g. \'{"wedge": {"gpu-node-0001": 1}}\'',
    )


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload, the GPU Operator's configuration, watch history, and request logging."""
    parser.add_argument(
        "--workload-pods", type=int, default=None, help="user pods holding GPUs at start (default: half the node count)"
    )
    parser.add_argument(
        "--mig-strategy",
        choices=("mixed", "single", "none"),
        default="mixed",
        help="ClusterPolicy spec.mig.strategy (default %(default)s; the GPU Operator's Helm default is single)",
    )
    parser.add_argument(
        "--mig-config-source",
        choices=("generated", "static"),
        default="generated",
        help="generated: per-node <node>-mig-config ConfigMaps (GPU Operator >= v26.3); "
        "static: the ClusterPolicy names default-mig-parted-config (default %(default)s)",
    )
    parser.add_argument(
        "--dra-nodes",
        choices=("none", "mixed", "all"),
        default="none",
        help="nodes whose GPUs NVIDIA's DRA driver (gpu.nvidia.com) serves instead of the device plugin: "
        "none, every other node, or all (default %(default)s)",
    )
    parser.add_argument(
        "--watch-history",
        type=int,
        default=10000,
        help="changes kept for watches; a watch from an older resourceVersion gets 410 Gone (default %(default)s)",
    )
    parser.add_argument(
        "--dcgm-host-label",
        choices=("hostname", "Hostname"),
        default="hostname",
        help="dcgm-exporter's host label (Hostname: releases before the rename; default %(default)s)",
    )
    parser.add_argument(
        "--dcgm-counter",
        action="append",
        default=[],
        metavar="FIELD",
        help="a counter the operator's CSV leaves out, enabled as a custom CSV would (repeatable), e.g. "
        "DCGM_FI_DEV_ROW_REMAP_PENDING or DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    )
    parser.add_argument("--log-requests", action="store_true", help="print one line per HTTP request to stderr")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    config = SimulatorConfig(
        nodes=args.nodes,
        seed=args.seed,
        host=args.host,
        port=args.port,
        kubeconfig_path=args.write_kubeconfig,
        state_dir=args.state_dir,
        fresh=args.fresh,
        save_interval=args.save_interval,
        token=args.token,
        apply_delay=args.apply_delay,
        latency_ms=args.latency_ms,
        error_rate=args.error_rate,
        write_error_rate=args.write_error_rate,
        workload_pods=args.workload_pods,
        mig_strategy=args.mig_strategy,
        mig_config_source=args.mig_config_source,
        dra_nodes=args.dra_nodes,
        watch_history=args.watch_history,
        log_requests=args.log_requests,
        dcgm_host_label=args.dcgm_host_label,
        dcgm_counters=args.dcgm_counter,
        faults={
            "watch_drop_after_events": args.watch_drop_after_events,
            "watch_drop_after_seconds": args.watch_drop_after_seconds,
            **args.faults,
        },
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        sim = Simulator(config)
    except (ApiError, ValueError) as error:
        parser.error(str(error))
    sim.start()
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
