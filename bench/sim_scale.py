"""Simulator at fleet scale: start-up time, memory, and one full `list nodes` (raw JSON and paginated).

Run: .venv/bin/python bench/sim_scale.py [--nodes 10000]
"""

import argparse
import json
import resource
import ssl
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import Simulator  # noqa: E402


def get(sim, path: str) -> bytes:
    request = urllib.request.Request(sim.url + path, headers={"Authorization": f"Bearer {sim.token}"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sim.ca_path), timeout=300) as reply:
        return reply.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
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


if __name__ == "__main__":
    main()
