"""Node and GPU pages: what each reported beside what it should be (pin, schedule window or pool), its QoS
settings beside what it runs, its change history and its agent."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents.claims import uuid_conflict_resolve
from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role, has_role
from core.views import redirect_after_change, role_required
from fleet import selectors
from fleet.choices import ClusterDriver
from fleet.models import AgentCredential, Node, UuidConflict
from fleet.querysets import agent_stale_cutoff
from scheduling.selectors import desired_vs_observed
from sharing import display
from sharing.models import NodePin, QoSComplianceReport, SharingProfile
from sharing.qos import compare_node_settings
from sharing.services import KUBELET_SETTINGS
from worker import rollouts
from worker.models import NodeChange
from worker.selectors import node_retry

NODE_CHANGES = 20
GPU_EVENTS = 50


def _agent_credential(node: Node) -> AgentCredential | None:
    """The node's active agent credential, else its last revoked one; none read for nodes no agent ever ran on."""
    if node.cluster.driver != ClusterDriver.AGENT and not node.agent_version:
        return None
    return selectors.node_agent_credential(node)


def _node_qos(node: Node, gpus: list, policy) -> dict:
    """The node's QoS policy `policy` (from its pool or schedule window: `DesiredVsObserved.qos_policy`) with its node
    settings and kubelet expectations beside what the node runs; agent nodes apply the settings and report them,
    others do not."""
    qos = {"policy": policy, "agent_driven": node.cluster.driver == ClusterDriver.AGENT}
    if policy is None:
        return qos
    kubelet = node.kubelet_config or {}
    desired, comparison = policy.node_settings(), None
    if qos["agent_driven"] and (desired["gpu"] or desired["host"]):
        comparison = qos["comparison"] = compare_node_settings(
            desired, host=node.host_settings, gpus=[g.settings for g in gpus], agent_record=node.agent_node_settings
        )
    qos.update(
        settings=display.node_setting_rows(policy, comparison),
        kubelet=[
            {"setting": key, "expected": getattr(policy, field), "actual": kubelet.get(key)}
            for field, key in KUBELET_SETTINGS
            if getattr(policy, field)
        ],
    )
    # The header badge names what differs ("Differs: Power limit"), not just how many.
    qos["differing"] = [row["label"] for row in qos["settings"] if row.get("status") == "differs"]
    report = QoSComplianceReport.objects.filter(pool_id=node.pool_id).only("checked_at", "violations").first()
    if report is not None:
        qos["report"] = report
        qos["violations"] = [v for v in report.violations if v["node"] == node.name]
    return qos


@role_required(Role.VIEWER)
@require_GET
def node_detail(request, pk):
    """One node as it last reported, beside what it should be (pin, schedule or pool); its change history and GPUs."""
    node = get_object_or_404(selectors.node_detail_queryset(), pk=pk)
    gpus = selectors.node_gpus(node)
    desired = desired_vs_observed([node])[0]
    context = {
        "node": node,
        "gpus": gpus,
        "desired": desired,
        "retry": node_retry(desired),
        "pin": NodePin.objects.filter(node=node).select_related("profile", "pinned_by").first(),
        "changes": list(NodeChange.objects.filter(node=node).select_related("rollout").order_by("-pk")[:NODE_CHANGES]),
        "qos": _node_qos(node, gpus, desired.qos_policy),
        "credential": _agent_credential(node),
        "agent_stale": node.agent_last_seen_at is None or node.agent_last_seen_at < agent_stale_cutoff(),
        "uuid_conflicts": selectors.node_uuid_conflicts(node),
    }
    if has_role(request.user, Role.OPERATOR):
        context["pin_profiles"] = SharingProfile.objects.only("pk", "name", "mode")
    return render(request, "console/node_detail.html", context)


@role_required(Role.ADMIN)
@require_POST
def uuid_conflict_resolve_view(request, pk):
    """Settle a UUID conflict from either node's page: the UUID stays with its holder or goes to the reporter."""
    conflict = get_object_or_404(UuidConflict.objects.select_related("node", "holder"), pk=pk)
    # Back to the page the button was on: the holder's or the reporter's.
    back = conflict.holder if request.POST.get("next_node") == str(conflict.holder_id) else conflict.node
    owner = request.POST.get("owner", "")
    try:
        uuid_conflict_resolve(actor=Actor.for_user(request.user), conflict=conflict, owner=owner)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        kept_by = conflict.holder if owner == "holder" else conflict.node
        messages.success(request, f"{conflict.get_kind_display()} {conflict.uuid} now belongs to node {kept_by.name}.")
    return redirect_after_change(request, back.get_absolute_url())


@role_required(Role.VIEWER)
@require_GET
def node_state(request, pk):
    """The node page's state section alone, polled so a rollout's progress shows without reloading."""
    node = get_object_or_404(selectors.node_detail_queryset(), pk=pk)
    return render(request, "console/node_detail.html#node-state", {"node": node})


@role_required(Role.VIEWER)
@require_GET
def gpu_detail(request, pk):
    """One GPU: every observed field, its MIG layout drawn large, and its MIG devices with who uses them."""
    gpu = get_object_or_404(selectors.gpu_detail_queryset(), pk=pk)
    devices = list(gpu.mig_devices.all())
    context = {
        "gpu": gpu,
        "node": gpu.node,
        "mig_devices": devices,
        "mig_layout": selectors.mig_layout(gpu, devices),
        "events": selectors.gpu_events(gpu, limit=GPU_EVENTS),
    }
    return render(request, "console/gpu_detail.html", context)


@role_required(Role.OPERATOR)
@require_POST
def node_retry_now(request, pk):
    """End the node's back-off after a failed change: the reconcile loop tries its desired config at once."""
    node = get_object_or_404(Node, pk=pk)
    if rollouts.retry_now(actor=Actor.for_user(request.user), nodes=[node]):
        messages.success(request, f"{node.name}: retrying now; the reconcile loop starts its change.")
    else:
        messages.info(request, f"{node.name} waits for no retry.")
    return redirect("console:node_detail", pk=node.pk)
