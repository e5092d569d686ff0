"""The simulator's own endpoints under /_sim/: fault knobs, node actions, workload, state (token required)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.errors import ApiError

if TYPE_CHECKING:
    from simulator.core import Simulator


def handle(sim: Simulator, method: str, parts: list[str], query: dict[str, str], body: object) -> dict:
    """Route `/_sim/<parts>`; returns the JSON reply (status 200)."""
    body = body if isinstance(body, dict) else {}
    route = (method, *parts[:1])
    if route == ("GET", "state"):
        return sim.state(query.get("node"))
    if route == ("GET", "faults"):
        return sim.faults.as_dict()
    if route == ("POST", "faults"):
        sim.faults.update(body)
        return sim.faults.as_dict()
    if route == ("POST", "settle"):
        return {"settled": sim.settle(float(query.get("timeout", "30")))}
    if route == ("POST", "service-account-tokens"):
        return sim.service_account_tokens.issue(body, sim.nodes)
    if route == ("POST", "workload"):
        return {
            "added": sim.add_workload(int(body.get("add", 0))),
            "removed": sim.remove_workload(int(body.get("remove", 0))),
        }
    if method == "POST" and len(parts) == 3 and parts[0] == "nodes":
        node, action = parts[1], parts[2]
        if action == "kubelet-config":
            return {"node": node, "action": action, "kubelet": sim.set_kubelet_config(node, **body)}
        if action == "restart-mig-manager":
            sim.restart_mig_manager(node)
        elif action == "restart-device-plugin":
            sim.restart_device_plugin(node)
        elif action == "restart-dra-plugin":
            sim.restart_dra_plugin(node)
        elif action == "ready":
            if not isinstance(body.get("ready"), bool):
                raise ApiError.bad_request('body must be {"ready": true|false}')
            sim.set_ready(node, body["ready"])
        else:
            raise ApiError.path_not_found("/_sim/" + "/".join(parts))
        return {"node": node, "action": action}
    raise ApiError.path_not_found("/_sim/" + "/".join(parts))
