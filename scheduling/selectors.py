"""The one answer to "which profile should this node have": its pin, else its pool's schedule, else the pool default."""

from dataclasses import dataclass

from django.utils import timezone

from sharing.models import NodePin, PoolSharing, SharingProfile
from sharing.spec import NodeConfig, node_config, node_validation_errors


@dataclass(frozen=True)
class DesiredState:
    """A node's desired profile and where it came from ("pin", "schedule", "pool"), or no opinion."""

    profile: SharingProfile | None
    source: str = ""

    @property
    def profile_id(self) -> int | None:
        return self.profile.pk if self.profile else None


NO_OPINION = DesiredState(None)


def desired_states(nodes, *, at=None) -> dict[int, DesiredState]:
    """Desired state of many nodes at instant `at` (default now) in a constant number of queries."""
    at = at or timezone.now()
    nodes = list(nodes)
    node_ids = [n.pk for n in nodes]
    pins = {p.node_id: p.profile for p in NodePin.objects.filter(node_id__in=node_ids).select_related("profile")}
    pool_ids = {n.pool_id for n in nodes if n.pool_id}
    pool_defaults = {
        s.pool_id: s.profile for s in PoolSharing.objects.filter(pool_id__in=pool_ids).select_related("profile")
    }
    result = {}
    for node in nodes:
        if node.pk in pins:
            result[node.pk] = DesiredState(pins[node.pk], "pin")
        elif node.pool_id in pool_defaults:
            result[node.pk] = DesiredState(pool_defaults[node.pool_id], "pool")
        else:
            result[node.pk] = NO_OPINION
    return result


def desired_state(node, *, at=None) -> DesiredState:
    return desired_states([node], at=at)[node.pk]


@dataclass(frozen=True)
class DesiredVsObserved:
    """One node's desired configs beside what it reports; `in_sync` is None when nothing is desired."""

    node: object
    profile: SharingProfile | None
    source: str
    desired_mig_config: str | None
    desired_device_plugin_config: str | None
    observed_mode: str
    observed_mig_config: str
    observed_device_plugin_config: str
    config_state: str
    in_sync: bool | None
    problems: tuple[str, ...] = ()
    config: NodeConfig | None = None


def desired_vs_observed(nodes, *, at=None) -> list[DesiredVsObserved]:
    """Desired against observed for nodes whose `live_gpus` are prefetched; configs rendered once per GPU shape."""
    nodes = list(nodes)
    states = desired_states(nodes, at=at)
    rendered: dict[tuple, tuple[NodeConfig | None, tuple[str, ...]]] = {}
    rows = []
    for node in nodes:
        state = states[node.pk]
        config, problems = None, ()
        if state.profile is not None:
            gpus = tuple((g.index, g.product) for g in node.live_gpus)
            key = (state.profile.pk, state.profile.updated_at, gpus)
            if key not in rendered:
                spec = state.profile.to_spec()
                errors = tuple(node_validation_errors(spec, gpus))
                rendered[key] = (None if errors else node_config(spec, gpus), errors)
            config, problems = rendered[key]
        in_sync = None
        if config is not None:
            in_sync = (
                config.mig_config_name in (None, node.observed_mig_config)
                and config.device_plugin_key == node.observed_device_plugin_config
                and node.config_state == "success"
            )
        elif state.profile is not None:
            in_sync = False
        rows.append(
            DesiredVsObserved(
                node=node,
                profile=state.profile,
                source=state.source,
                desired_mig_config=config.mig_config_name if config else None,
                desired_device_plugin_config=config.device_plugin_key if config else None,
                observed_mode=node.observed_mode,
                observed_mig_config=node.observed_mig_config,
                observed_device_plugin_config=node.observed_device_plugin_config,
                config_state=node.config_state,
                in_sync=in_sync,
                problems=problems,
                config=config,
            )
        )
    return rows
