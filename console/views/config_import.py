"""Import a cluster's own NVIDIA configs as sharing profiles: the preview (read through the worker's driver, judged
by sharing) and the admin's confirmation."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.views import redirect_after_change, role_required
from fleet.models import Cluster
from sharing import display
from worker.config_import import import_confirm, import_preview

MODE_WORDS = {"mig": "MIG", "mps": "MPS", "time_slicing": "Time-slicing", "passthrough": "Whole GPUs"}


def _rows(preview) -> list[dict]:
    """Per proposed profile: what it would be in words, and whether it can be created."""
    rows = []
    for proposed in preview.plan.profiles:
        spec = proposed.spec
        summary = []
        if spec is not None:
            summary.append(MODE_WORDS[spec.mode] + (f" × {spec.replicas}" if spec.replicas > 1 else ""))
            if spec.mode == "mig":
                summary.append(f"strategy {spec.mig_strategy}")
                summary += [f"{where}: {layout}" for where, layout in display.layout_lines(spec.mig_layouts)]
        exists = proposed.name in preview.existing
        rows.append({"p": proposed, "summary": summary, "exists": exists, "creatable": spec is not None and not exists})
    return rows


def _page(request, cluster, *, error: ApplicationError | None = None, status: int = 200):
    context = {"cluster": cluster, "error": error}
    try:
        preview = import_preview(cluster)
    except ApplicationError as exc:
        context["error"], status = exc, exc.status
    else:
        context.update(preview=preview, rows=_rows(preview))
    return render(request, "console/cluster_import.html", context, status=status)


@role_required(Role.VIEWER)
@require_GET
def cluster_import(request, pk):
    """What importing the cluster's mig-parted and device-plugin configs would create; nothing changes yet."""
    return _page(request, get_object_or_404(Cluster, pk=pk))


@role_required(Role.ADMIN)
@require_POST
def cluster_import_confirm(request, pk):
    """Confirmed from the preview: create the checked profiles (from a fresh read of the cluster)."""
    cluster = get_object_or_404(Cluster, pk=pk)
    names = request.POST.getlist("names")
    try:
        created = import_confirm(actor=Actor.for_user(request.user), cluster=cluster, names=names or None)
    except ApplicationError as exc:
        return _page(request, cluster, error=exc, status=exc.status)
    messages.success(request, f"Imported {len(created)} profile{'s' if len(created) != 1 else ''} from {cluster.name}.")
    return redirect_after_change(request, reverse("sharing:profile_list"))
