"""Rollout pages: the filterable list with progress, and each rollout live (progress, node dots, nodes, events)
with pause / resume / cancel for operators."""

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import CharField, Q
from django.db.models.functions import Cast
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role
from core.views import role_required, wants_fragment
from worker import rollouts, selectors
from worker.choices import ChangeStatus, RolloutStatus, RolloutTrigger
from worker.filtersets import RolloutFilterSet
from worker.models import NodeChange, Rollout

PAGE_SIZE = 50
EVENTS_SHOWN = 100
LIVE_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.PAUSED)
IN_FLIGHT = (ChangeStatus.WAITING_FOR_IDLE, ChangeStatus.APPLYING, ChangeStatus.VERIFYING)
# Progress bar segments, in the order drawn: (key, label, statuses). Cancelled nodes are not drawn: a cancelled
# rollout's bar stays as far as it got.
SEGMENTS = (
    ("succeeded", "succeeded", (ChangeStatus.SUCCEEDED,)),
    ("failed", "failed or rolled back", (ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK)),
    ("skipped", "skipped", (ChangeStatus.SKIPPED,)),
    ("active", "in progress", IN_FLIGHT),
)


def _progress(rollout: Rollout) -> dict:
    """rollout_progress plus the bar's segments and a legend entry per status present."""
    progress = selectors.rollout_progress(rollout)
    counts, total = progress["counts"], progress["total"]
    progress["segments"] = [
        {"key": key, "label": label, "count": n, "pct": round(100 * n / total, 2)}
        for key, label, statuses in SEGMENTS
        if (n := sum(counts.get(s, 0) for s in statuses))
    ]
    progress["legend"] = [
        {"status": value, "label": label, "count": counts[value]}
        for value, label in ChangeStatus.choices
        if counts.get(value)
    ]
    return progress


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def rollout_list(request):
    """Every rollout with its status and progress, filtered and paginated on the server; HTMX swaps the table."""
    queryset = (
        Rollout.objects.with_progress()
        .select_related("actor", "pool__cluster", "profile")
        .order_by("-created_at", "-pk")
    )
    filterset = RolloutFilterSet(request.GET, queryset=queryset)
    page = Paginator(filterset.qs, PAGE_SIZE).get_page(request.GET.get("page"))
    page.elided_range = list(page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1))
    for rollout in page.object_list:
        rollout.progress = _progress(rollout)
    context = {
        "filterset": filterset,
        "page_obj": page,
        "table_url": request.path,
        "statuses": RolloutStatus.choices,
        "triggers": RolloutTrigger.choices,
        "selected_statuses": request.GET.getlist("status"),
        "is_filtered": any(v for k, v in request.GET.items() if k != "page"),
    }
    template = "worker/rollout_list.html"
    return render(request, f"{template}#rollout-table" if wants_fragment(request) else template, context)


def _live_context(pk: int) -> dict:
    rollout = get_object_or_404(
        Rollout.objects.with_progress().select_related("actor", "pool__cluster", "profile"), pk=pk
    )
    change_ids = NodeChange.objects.filter(rollout=rollout).annotate(sid=Cast("pk", CharField())).values("sid")
    # A list: the announcer reads the newest, the list shows them all, in one query.
    events = list(
        AuditEvent.objects.filter(
            Q(object_type="nodechange", object_id__in=change_ids) | Q(object_type="rollout", object_id=str(rollout.pk))
        ).order_by("-at", "-pk")[:EVENTS_SHOWN]
    )
    shown = (
        "position",
        "status",
        "attempts",
        "applied_mig_config",
        "updated_at",
        "error",
        "deadline",
        "rollout",
        "node__name",
    )
    changes = list(rollout.changes.select_related("node").only(*shown).order_by("position"))
    retries = {r.node_id: r for r in selectors.rollout_retries(rollout)}
    for change in changes:
        change.retry = retries.get(change.node_id)
    return {
        "rollout": rollout,
        "progress": _progress(rollout),
        "changes": changes,
        "retries": retries,
        "next_try": min((r.next_retry_at for r in retries.values()), default=None),
        "events": events,
        "live": rollout.status in LIVE_STATUSES,
    }


@role_required(Role.VIEWER)
@require_GET
def rollout_detail(request, pk):
    """One rollout: strategy, progress bar and a dot per node, the node table and the event stream, live."""
    return render(request, "worker/rollout_detail.html", _live_context(pk))


@role_required(Role.VIEWER)
@require_GET
def rollout_live(request, pk):
    """The rollout page's live section alone, polled every 2 s while the rollout runs or is paused."""
    return render(request, "worker/rollout_detail.html#rollout-live", _live_context(pk))


def _steer(request, pk, service, done: str):
    rollout = get_object_or_404(Rollout, pk=pk)
    try:
        service(actor=Actor.for_user(request.user), rollout=rollout)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Rollout #{rollout.pk} {done}.")
    if request.htmx:
        # Answer with the refreshed live section (the message shows inside it) rather than reloading the page.
        context = _live_context(pk)
        context["inline_messages"] = True
        return render(request, "worker/rollout_detail.html#rollout-live", context)
    return redirect(rollout.get_absolute_url())


@role_required(Role.OPERATOR)
@require_POST
def rollout_pause(request, pk):
    """Start no new nodes; nodes already changing finish their step."""
    return _steer(request, pk, rollouts.rollout_pause, "paused")


@role_required(Role.OPERATOR)
@require_POST
def rollout_resume(request, pk):
    """Carry on with the next nodes."""
    return _steer(request, pk, rollouts.rollout_resume, "resumed")


@role_required(Role.OPERATOR)
@require_POST
def rollout_cancel(request, pk):
    """Cancel queued and waiting nodes; nodes mid-apply finish and verify."""
    return _steer(request, pk, rollouts.rollout_cancel, "cancelled")


@role_required(Role.OPERATOR)
@require_POST
def rollout_retry_now(request, pk):
    """End the back-off of the nodes this rollout's failure left waiting: the loop tries them again at once."""

    def retry(*, actor, rollout):
        retried = rollouts.rollout_retry_now(actor=actor, rollout=rollout)
        if not retried:
            raise ApplicationError("No node of this rollout waits for a retry any more.")

    return _steer(request, pk, retry, "retried now: the reconcile loop starts its nodes again")
