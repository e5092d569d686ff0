"""Reads for node agents: the desired config an agent fetches."""

from agent.protocol import DesiredConfig, MigSettings, MpsSettings, NodeSettings, SafetySettings, TimeSliceSettings
from agents.choices import SERVING_STATUSES
from fleet.models import Node
from sharing.choices import BusyPolicy
from worker.models import NodeChange


def _desired(to_config: dict, *, change: NodeChange | None) -> DesiredConfig:
    """A change's to_config as the agent's DesiredConfig (None sections: Tessera leaves that setting alone)."""
    mig = None
    if to_config.get("mig_config") and to_config.get("mig_parted"):
        selected = (change.applied_mig_config if change else "") or to_config["mig_config"]
        text = to_config["mig_parted"]
        if selected != to_config["mig_config"]:
            # A retry under a new name (worker.services): the same single config, renamed as the engine does.
            text = text.replace(f"\n  {to_config['mig_config']}:", f"\n  {selected}:", 1)
        mig = MigSettings(mig_parted_config=text, selected=selected)
    sharing = to_config.get("sharing") or {}
    mps = time_slice = None
    if sharing.get("mode") == "mps":
        mps = MpsSettings(
            replicas=sharing["replicas"],
            default_active_thread_percentage=sharing.get("mps_active_thread_percentage"),
            pinned_device_memory_limit_mib=sharing.get("mps_pinned_memory_limit_mib"),
        )
    elif sharing.get("mode") == "time_slicing":
        time_slice = TimeSliceSettings(interval=sharing.get("time_slice_interval") or "default")
    safety = SafetySettings()
    if change is not None:
        policy = "force" if change.rollout.busy_policy == BusyPolicy.FORCE else "wait"
        safety = SafetySettings(busy_policy=policy, wait_seconds=change.rollout.wait_minutes * 60)
    # A QoS policy's GPU settings and host tuning, when the planner put them in the change (QoSPolicy.node_settings()).
    node_settings = NodeSettings.from_dict(to_config["node_settings"]) if to_config.get("node_settings") else None
    return DesiredConfig(
        config_id=to_config["config_id"],
        change_id=change.pk if change else None,
        mig=mig,
        mps=mps,
        time_slice=time_slice,
        persistence_mode=None,
        safety=safety,
        node_settings=node_settings,
    )


def agent_desired_config(node: Node) -> DesiredConfig | None:
    """What the node's agent should run: the change a rollout is applying to it, else the config it already runs
    (nothing to change); None when the server knows of neither."""
    change = NodeChange.objects.select_related("rollout").filter(node=node, status__in=SERVING_STATUSES).first()
    if change is not None:
        return _desired(change.to_config, change=change)
    if not node.agent_config_id:
        return None
    to_config = (
        NodeChange.objects.filter(node=node, to_config__config_id=node.agent_config_id)
        .order_by("-pk")
        .values_list("to_config", flat=True)
        .first()
    )
    return _desired(to_config, change=None) if to_config else None
