"""Schedule pages: the list with what is active now, the editor with a live week timeline, the day/night preset,
and each schedule's page with its timeline, upcoming transitions and the impact of the next one."""

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from django.contrib import messages
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import Truncator
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.templatetags.ui import day_and_time
from core.views import redirect_after_change, role_required
from scheduling import selectors, services, windows
from scheduling.forms import (
    COMMON_TIME_ZONES,
    DayNightForm,
    ExceptionFormSet,
    ScheduleForm,
    WindowFormSet,
    exception_initial,
    filled,
    prefilled_window,
    window_initial,
)
from scheduling.kueue import quota_text, transition_quota
from scheduling.models import KueueBinding, Schedule, ScheduleWindow
from scheduling.timeline import days_text, value_labeller, week_timeline
from sharing import selectors as sharing_selectors
from sharing.models import PoolSharing

TRANSITION_DAYS = 7

# --- list and detail -------------------------------------------------------------------------------------------


def _timeline(calendar: windows.Calendar, label: Callable, *, now=None, marks=()) -> dict:
    """The week timeline read in the viewer's zone (a note says when it is not the schedule's), with the texts the
    drawing repeats per segment formatted once here (a date filter per segment was most of the page, bench B5)."""
    timeline = week_timeline(
        calendar, label, now=now or timezone.now(), viewer_zone=timezone.get_current_timezone_name(), marks=marks
    )
    for row in timeline["rows"]:
        row["day_label"], row["weekday"] = (
            day_and_time(row["day"], clock=False),
            day_and_time(row["day"], date=False, clock=False),
        )
        for segment in row["segments"]:
            segment["short_label"] = Truncator(segment["label"]).chars(24)
    return timeline


def _schedules():
    return Schedule.objects.select_related("pool__cluster", "baseline_profile", "baseline_qos_policy").prefetch_related(
        Prefetch("windows", queryset=ScheduleWindow.objects.select_related("profile", "qos_policy")), "exceptions"
    )


def _pool_defaults(schedules) -> dict:
    """Each schedule pool's PoolSharing row (its default profile and QoS policy)."""
    pool_ids = [s.pool_id for s in schedules]
    return {
        s.pool_id: s for s in PoolSharing.objects.filter(pool_id__in=pool_ids).select_related("profile", "qos_policy")
    }


def _labeller(schedules, default=None) -> Callable:
    profiles = {w.profile_id: w.profile.name for s in schedules for w in s.windows.all()}
    profiles.update({s.baseline_profile_id: s.baseline_profile.name for s in schedules if s.baseline_profile_id})
    policies = {w.qos_policy_id: w.qos_policy.name for s in schedules for w in s.windows.all() if w.qos_policy_id}
    policies.update(
        {s.baseline_qos_policy_id: s.baseline_qos_policy.name for s in schedules if s.baseline_qos_policy_id}
    )
    return value_labeller(profiles, policies, default)


def _now_and_next(schedule, calendar, label, now) -> None:
    """Attach what the schedule says now and its next change (pure window math on the stored calendar)."""
    schedule.active_window = windows.active_window(calendar, now)
    schedule.current = label(windows.value_at(calendar, now))
    upcoming = windows.next_transition(calendar, now)
    schedule.next_change = (
        {"at": upcoming.at, "to": label(upcoming.to_value), "window": upcoming.window} if upcoming else None
    )


@role_required(Role.VIEWER)
@require_GET
def schedule_list(request):
    """Every schedule: its pool and zone, the window and profile in force now, and the next change."""
    schedules = list(_schedules())
    defaults, now = _pool_defaults(schedules), timezone.now()
    for schedule in schedules:
        label = _labeller([schedule], defaults.get(schedule.pool_id))
        _now_and_next(schedule, schedule.to_calendar(), label, now)
    context = {"schedules": schedules, "viewer_zone": timezone.get_current_timezone_name()}
    return render(request, "scheduling/schedule_list.html", context)


@role_required(Role.VIEWER)
@require_GET
def schedule_detail(request, pk):
    """One schedule: the week drawn, the changes of the next 7 days, and what the next one does to the pool."""
    schedule = get_object_or_404(_schedules(), pk=pk)
    now = timezone.now()
    defaults = _pool_defaults([schedule])
    default = defaults.get(schedule.pool_id)
    label = _labeller([schedule], default)
    calendar = schedule.to_calendar()
    _now_and_next(schedule, calendar, label, now)
    for window in schedule.windows.all():
        window.days_text = days_text(window.weekdays)
    following = selectors.unpinned_node_count(schedule.pool_id)
    end = now + timedelta(days=TRANSITION_DAYS)
    transitions = selectors.schedule_transitions(schedule, now, end, following=following, defaults=defaults)
    kueue = KueueBinding.objects.filter(pool_id=schedule.pool_id, enabled=True).first()
    quotas = [transition_quota(schedule.pool, t) if kueue else None for t in transitions]
    marks = [(t.at, f"Kueue quota: {quota_text(q)}") for t, q in zip(transitions, quotas, strict=True) if kueue]
    context = {
        "schedule": schedule,
        "pool_default": default.profile if default else None,
        "timeline": _timeline(calendar, label, now=now, marks=marks),
        "transitions": transitions,
        "transition_rows": list(zip(transitions, quotas, strict=True)),
        "kueue": kueue,
        "following": following,
        "days": TRANSITION_DAYS,
    }
    upcoming = transitions[0] if transitions and schedule.enabled else None
    if upcoming is not None and upcoming.to_profile is not None:
        try:
            summary = sharing_selectors.preview_totals(upcoming.to_profile, schedule.pool.nodes.live())
        except ApplicationError as exc:  # e.g. the cluster's MIG strategy changed since the schedule was saved
            context["next_impact"] = {"transition": upcoming, "refused": exc.message}
        else:
            context["next_impact"] = {"transition": upcoming, "summary": summary}
    return render(request, "scheduling/schedule_detail.html", context)


# --- editor ----------------------------------------------------------------------------------------------------


def _editor_forms(request, schedule=None):
    if request.method == "POST":
        return (
            ScheduleForm(request.POST, schedule=schedule),
            WindowFormSet(request.POST, prefix="windows"),
            ExceptionFormSet(request.POST, prefix="exceptions"),
        )
    # A window proposed elsewhere (a capacity recommendation's "draft schedule") comes in the query string.
    proposed = prefilled_window(request.GET)
    windows_initial = (window_initial(schedule) if schedule else []) + ([proposed] if proposed else [])
    initial = None if schedule else {k: request.GET[k] for k in ("pool", "name", "time_zone") if request.GET.get(k)}
    return (
        ScheduleForm(schedule=schedule, **({"initial": initial} if initial else {})),
        WindowFormSet(prefix="windows", initial=windows_initial or None),
        ExceptionFormSet(prefix="exceptions", initial=exception_initial(schedule) if schedule else None),
    )


def _preview_timeline(form, window_forms, exception_forms, *, now=None) -> dict:
    """The editor's timeline from what parsed so far, or the reasons the calendar is not valid yet."""
    data = form.cleaned_data
    zone = data.get("time_zone") or "UTC"
    baseline, baseline_qos = data.get("baseline_profile"), data.get("baseline_qos_policy")
    rows = [f.row() for f in filled(window_forms) if f.cleaned_data.get("weekdays")]

    def pk(obj):
        return obj.pk if obj else None

    calendar = windows.Calendar(
        tz=zone,
        windows=tuple(
            windows.Window(
                frozenset(r["weekdays"]), r["start"], r["end"], (r["profile"].pk, pk(r["qos_policy"])), r["name"]
            )
            for r in rows
        ),
        baseline=(pk(baseline), pk(baseline_qos)),
        exceptions=frozenset(f.cleaned_data["date"] for f in filled(exception_forms)),
    )
    problems = windows.validate(calendar)
    if problems:
        return {"problems": problems}
    profiles = {r["profile"].pk: r["profile"].name for r in rows}
    policies = {r["qos_policy"].pk: r["qos_policy"].name for r in rows if r["qos_policy"]}
    if baseline:
        profiles[baseline.pk] = baseline.name
    if baseline_qos:
        policies[baseline_qos.pk] = baseline_qos.name
    pool = data.get("pool")
    default = PoolSharing.objects.filter(pool=pool).select_related("profile").first() if pool else None
    return _timeline(calendar, value_labeller(profiles, policies, default), now=now)


def _editor(request, schedule, forms, *, error="", window_errors=(), status=200, impact=None):
    form, window_forms, exception_forms = forms
    if form.is_bound:
        form.is_valid()
        window_forms.is_valid()
        exception_forms.is_valid()
        timeline = _preview_timeline(form, window_forms, exception_forms)
    elif schedule is not None:
        label = _labeller([schedule], _pool_defaults([schedule]).get(schedule.pool_id))
        timeline = _timeline(schedule.to_calendar(), label)
    else:
        timeline = None
    context = {
        "schedule": schedule,
        "form": form,
        "window_forms": window_forms,
        "exception_forms": exception_forms,
        "timeline": timeline,
        "error": error,
        "window_errors": window_errors,
        "time_zones": COMMON_TIME_ZONES,
        **_impact_context(
            request, impact, schedule.pool if schedule else getattr(form, "cleaned_data", {}).get("pool")
        ),
    }
    return render(request, "scheduling/schedule_form.html", context, status=status)


def _place_errors(form, window_forms, errors: dict) -> list[str]:
    """Messages beside their field or window row; the ones about the windows together (overlaps name both)."""
    rows = filled(window_forms)
    general = []
    for key, messages_ in errors.items():
        if key.startswith("windows[") and "]." in key:
            index, field = key[len("windows[") :].split("].", 1)
            if index.isdigit() and int(index) < len(rows) and field in rows[int(index)].fields:
                for message in messages_:
                    rows[int(index)].add_error(field, message)
                continue
        if key in form.fields:
            for message in messages_:
                form.add_error(key, message)
        elif key == "windows":
            general.extend(messages_)
        else:  # about the schedule as a whole: beside its pool
            for message in messages_:
                form.add_error("pool", message)
    return general


# --- saving: the impact first, then confirm ---------------------------------------------------------------------

PREVIEW_IGNORED = ("csrfmiddlewaretoken", "action", "previewed")


def previewed_digest(data) -> str:
    """A digest of what was previewed: "Confirm and save" saves only that, and previews again what changed since."""
    items = sorted((key, data.getlist(key)) for key in data if key not in PREVIEW_IGNORED)
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _confirmed(request) -> bool:
    return request.POST.get("action") == "save" and request.POST.get("previewed") == previewed_digest(request.POST)


def _impact_context(request, changes, pool) -> dict:
    """The impact panel of a save not confirmed yet: per moment the preview summary and the nodes that change."""
    if changes is None:
        return {}
    for change in changes:
        for impact in change.impacts:
            impact.disruption_text = sharing_selectors.DISRUPTION_TEXT[impact.disruption]
    return {"impact": changes, "impact_pool": pool, "previewed": previewed_digest(request.POST)}


def _save(request, schedule=None):
    forms = _editor_forms(request, schedule)
    form, window_forms, exception_forms = forms
    if not (form.is_valid() and window_forms.is_valid() and exception_forms.is_valid()):
        return _editor(
            request, schedule, forms, error="The schedule was not saved; see the messages below.", status=400
        )
    actor = Actor.for_user(request.user)
    rows = {
        "windows": [f.row() for f in filled(window_forms)],
        "exceptions": [
            {"date": f.cleaned_data["date"], "note": f.cleaned_data["note"]} for f in filled(exception_forms)
        ],
        **form.values(),
    }
    try:
        if not _confirmed(request):
            if schedule is None:
                changes = services.schedule_create_preview(pool=form.cleaned_data["pool"], **rows)
            else:
                changes = services.schedule_update_preview(schedule=schedule, **rows)
            return _editor(request, schedule, forms, impact=changes)
        if schedule is None:
            saved = services.schedule_create(actor=actor, pool=form.cleaned_data["pool"], **rows)
        else:
            saved = services.schedule_update(actor=actor, schedule=schedule, **rows)
    except ApplicationError as exc:
        errors = dict(exc.errors) if exc.errors else {"pool": [exc.message]}
        general = _place_errors(form, window_forms, errors)
        return _editor(request, schedule, forms, error=exc.message, window_errors=general, status=exc.status)
    messages.success(request, f"Schedule {saved.name} saved; its pool follows it from the next reconcile pass.")
    return redirect_after_change(request, saved.get_absolute_url())


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def schedule_create(request):
    """The editor for a new schedule (admins)."""
    if request.method == "POST":
        return _save(request)
    return _editor(request, None, _editor_forms(request))


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def schedule_update(request, pk):
    """The editor for a schedule (admins); windows and exceptions are replaced as a whole."""
    schedule = get_object_or_404(_schedules(), pk=pk)
    if request.method == "POST":
        return _save(request, schedule)
    return _editor(request, schedule, _editor_forms(request, schedule))


@role_required(Role.ADMIN)
@require_POST
def schedule_timeline(request):
    """The editor's week timeline for the form as typed so far (HTMX), without saving anything."""
    forms = (
        ScheduleForm(request.POST),
        WindowFormSet(request.POST, prefix="windows"),
        ExceptionFormSet(request.POST, prefix="exceptions"),
    )
    for form in forms:
        form.is_valid()
    timeline = _preview_timeline(*forms)
    return render(request, "scheduling/schedule_form.html#timeline-preview", {"timeline": timeline})


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def schedule_daynight(request):
    """The day/night preset: a plain schedule with one working-hours window, editable afterwards. Saving shows what
    it would do first (nodes, GPU resets, pods losing their slice, when) and creates it once confirmed."""
    form = DayNightForm(request.POST or None)
    error, status, changes = "", 200, None
    if request.method == "POST":
        if form.is_valid():
            try:
                if _confirmed(request):
                    saved = services.schedule_create_day_night(actor=Actor.for_user(request.user), **form.values())
                    messages.success(request, f"Schedule {saved.name} created.")
                    return redirect_after_change(request, saved.get_absolute_url())
                changes = services.schedule_create_day_night_preview(**form.values())
            except ApplicationError as exc:
                errors = dict(exc.errors) if exc.errors else {"pool": [exc.message]}
                for key, messages_ in errors.items():
                    field = key if key in form.fields else "pool"
                    for message in messages_:
                        form.add_error(field, message)
                error, status = exc.message, exc.status
        else:
            error, status = "The schedule was not created; see the messages below.", 400
    context = {"form": form, "error": error, "time_zones": COMMON_TIME_ZONES}
    context.update(_impact_context(request, changes, form.cleaned_data.get("pool") if changes is not None else None))
    return render(request, "scheduling/schedule_daynight.html", context, status=status)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def schedule_delete(request, pk):
    """Ask, then delete: the pool goes back to its default profile."""
    schedule = get_object_or_404(Schedule.objects.select_related("pool"), pk=pk)
    if request.method == "POST":
        services.schedule_delete(actor=Actor.for_user(request.user), schedule=schedule)
        messages.success(request, f"Schedule {schedule.name} deleted; pool {schedule.pool.name} follows its default.")
        return redirect_after_change(request, reverse("scheduling:schedule_list"))
    return render(request, "scheduling/schedule_confirm_delete.html", {"schedule": schedule})
