"""Simulator at fleet scale: start-up time, memory, one full `list nodes` (raw JSON and paginated), and how fast
the MIG Manager settles when every MIG node of a smaller fleet is relabelled with apply delay 0.

Run: .venv/bin/python bench/sim_scale.py [--nodes 10000] [--apply-nodes 1000]
"""

import argparse
import http.client
import json
import resource
import ssl
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import Simulator  # noqa: E402

_connections: dict[str, http.client.HTTPSConnection] = {}


def get(sim, path: str, body: dict | None = None) -> bytes:
    """One request on a kept-alive connection, as the kubernetes client's urllib3 pool sends them."""
    if sim.url not in _connections:
        context = ssl.create_default_context(cafile=sim.ca_path)
        _connections[sim.url] = http.client.HTTPSConnection("127.0.0.1", sim.port, context=context, timeout=300)
    connection = _connections[sim.url]
    headers = {"Authorization": f"Bearer {sim.token}", "Content-Type": "application/merge-patch+json"}
    connection.request("PATCH" if body else "GET", path, json.dumps(body) if body else None, headers)
    reply = connection.getresponse()
    data = reply.read()
    if reply.status >= 300:
        raise RuntimeError(f"{path}: {reply.status} {data[:200]!r}")
    return data


def relabel_all(nodes: int, seed: int) -> None:
    with Simulator(nodes=nodes, seed=seed, apply_delay=0.0) as sim:
        names = sim.find_nodes(mig_capable=True, idle=True)
        began = time.perf_counter()
        for name in names:
            get(sim, f"/api/v1/nodes/{name}", {"metadata": {"labels": {"nvidia.com/mig.config": "all-enabled"}}})
        patched = time.perf_counter() - began
        settled = sim.settle(120)
        total = time.perf_counter() - began
        states = sim.state()["mig_config_states"]
    print(f"relabel nodes={len(names)} of {nodes}: patches_s={patched:.2f} settled={settled} total_s={total:.2f}")
    print(f"  states after: {states}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--apply-nodes", type=int, default=1_000)
    args = parser.parse_args()

    started = time.perf_counter()
    with Simulator(nodes=args.nodes, seed=args.seed, apply_delay=0.0) as sim:
        startup = time.perf_counter() - started
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        state = sim.state()

        began = time.perf_counter()
        body = get(sim, "/api/v1/nodes")
        first_list = time.perf_counter() - began
        assert len(json.loads(body)["items"]) == args.nodes

        began = time.perf_counter()
        get(sim, "/api/v1/nodes")
        cached_list = time.perf_counter() - began

        began = time.perf_counter()
        pages, token = 0, ""
        while True:
            page = json.loads(get(sim, "/api/v1/nodes?limit=500" + (f"&continue={token}" if token else "")))
            pages += 1
            token = page["metadata"].get("continue")
            if not token:
                break
        paged = time.perf_counter() - began

        began = time.perf_counter()
        get(sim, "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-0042")
        pods_on_node = time.perf_counter() - began

    print(f"nodes={state['nodes']} gpus={state['gpus']} pods={state['pods']}")
    print(f"startup_s={startup:.2f} (populate+tls+listen) max_rss_mib={rss_mib:.0f}")
    print(f"full_list_s={first_list:.2f} (first, encodes JSON) full_list_cached_s={cached_list:.2f} bytes={len(body)}")
    print(f"paginated_list_s={paged:.2f} pages={pages} (limit=500, as kubectl and informers page)")
    print(f"pods_by_node_s={pods_on_node:.4f}")
    relabel_all(args.apply_nodes, args.seed)


if __name__ == "__main__":
    main()
