"""A pool's Kueue binding: the admins' form to create, change or switch it off, and taking a drifted ClusterQueue
over. The pool page shows the binding (pools.py); the writes are scheduling.kueue's and worker.kueue's."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods, require_POST

from console.forms import KueueBindingForm
from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.views import form_add_service_errors, redirect_after_change, role_required
from fleet.models import NodePool
from scheduling.kueue import kueue_binding_set, quota_plan
from scheduling.models import KueueBinding
from worker.kueue import drift_text, kueue_take_over
from worker.models import KueueQuotaWrite


def kueue_card(pool: NodePool) -> dict | None:
    """What the pool page's Kueue card shows: the binding, per flavor and resource what the layout gives now and
    what Tessera last wrote in each ClusterQueue, and each drifted queue value by value."""
    binding = KueueBinding.objects.filter(pool=pool).first()
    if binding is None:
        return None
    writes = {(w.flavor, w.resource, w.cluster_queue): w.value for w in KueueQuotaWrite.objects.filter(pool=pool)}
    plan = quota_plan(binding) if pool.cluster.driver == "kubernetes" else None
    rows = plan.rows() if plan else []
    for row in rows:
        row["written"] = [writes.get((row["flavor"], row["resource"], q)) for q in binding.cluster_queues]
    drift = [
        {"cluster_queue": queue, "changes": changes, "text": drift_text(changes)}
        for queue, changes in sorted(binding.drift.items())
    ]
    return {"binding": binding, "plan": plan, "rows": rows, "drift": drift}


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def pool_kueue(request, pk):
    """Create, change or switch off the pool's Kueue binding (admins)."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    binding = KueueBinding.objects.filter(pool=pool).first()
    status, error = 200, ""
    if request.method == "POST":
        form = KueueBindingForm(request.POST)
        if form.is_valid():
            try:
                kueue_binding_set(
                    actor=Actor.for_user(request.user),
                    pool=pool,
                    cluster_queues=form.queue_names(),
                    enabled=form.cleaned_data["enabled"],
                    lead_minutes=form.cleaned_data["lead_minutes"],
                )
            except ApplicationError as exc:
                form_add_service_errors(form, exc, fields={"pool": "cluster_queues"}, default="cluster_queues")
                status, error = exc.status, exc.message
            else:
                messages.success(request, f"Kueue quota of {pool.name} saved.")
                return redirect_after_change(request, pool.get_absolute_url() + "#pool-kueue")
        else:
            status, error = 400, "The Kueue binding was not saved; see the messages below."
    elif binding is not None:
        form = KueueBindingForm(
            initial={
                "cluster_queues": ", ".join(binding.cluster_queues),
                "lead_minutes": binding.lead_minutes,
                "enabled": binding.enabled,
            }
        )
    else:
        form = KueueBindingForm()
    context = {"pool": pool, "binding": binding, "form": form, "error": error}
    return render(request, "console/pool_kueue.html", context, status=status)


@role_required(Role.ADMIN)
@require_POST
def pool_kueue_take_over(request, pk):
    """An admin's decision on a drifted ClusterQueue: Tessera's quota goes back over whatever is there."""
    pool = get_object_or_404(NodePool, pk=pk)
    binding = get_object_or_404(KueueBinding, pool=pool)
    queue = request.POST.get("cluster_queue", "")
    if queue not in binding.cluster_queues:
        messages.error(request, f"{queue!r} is not a ClusterQueue of this binding.")
        return redirect_after_change(request, pool.get_absolute_url() + "#pool-kueue")
    kueue_take_over(actor=Actor.for_user(request.user), binding=binding, cluster_queue=queue)
    messages.success(request, f"ClusterQueue {queue} is Tessera's again: the next sync writes its quota.")
    return redirect_after_change(request, pool.get_absolute_url() + "#pool-kueue")
