"""Forms of the schedule editor: the schedule, its windows and exception dates (formsets), and the day/night preset.

They read input into the rows `schedule_create` / `schedule_update` take; overlaps, zones and profiles fitting the
pool are judged by the services, whose messages the views put back beside the fields.
"""

from datetime import time

from django import forms
from django.forms import formset_factory

from fleet.models import NodePool
from sharing.choices import BusyPolicy
from sharing.models import QoSPolicy, SharingProfile

COMMON_TIME_ZONES = (
    "UTC",
    "Europe/London",
    "Europe/Dublin",
    "Europe/Paris",
    "Europe/Berlin",
    "Europe/Amsterdam",
    "Europe/Zurich",
    "Europe/Stockholm",
    "Europe/Helsinki",
    "America/New_York",
    "America/Chicago",
    "America/Denver",
    "America/Los_Angeles",
    "America/Sao_Paulo",
    "Asia/Kolkata",
    "Asia/Singapore",
    "Asia/Shanghai",
    "Asia/Seoul",
    "Asia/Tokyo",
    "Australia/Sydney",
)
WEEKDAY_CHOICES = [(0, "Mon"), (1, "Tue"), (2, "Wed"), (3, "Thu"), (4, "Fri"), (5, "Sat"), (6, "Sun")]


def _profiles():
    return SharingProfile.objects.order_by("name")


def _policies():
    return QoSPolicy.objects.order_by("name")


class PoolChoiceField(forms.ModelChoiceField):
    """Pools as "cluster / pool", the way every page names them."""

    def __init__(self, **kwargs):
        queryset = NodePool.objects.select_related("cluster").order_by("cluster__name", "name")
        super().__init__(queryset=queryset, empty_label="Choose…", **kwargs)

    def label_from_instance(self, obj):
        return f"{obj.cluster.name} / {obj.name}"


class TimeInput(forms.TimeInput):
    input_type = "time"

    def __init__(self, **kwargs):
        super().__init__(format="%H:%M", **kwargs)


class DateInput(forms.DateInput):
    input_type = "date"

    def __init__(self, **kwargs):
        super().__init__(format="%Y-%m-%d", **kwargs)


class TimeZoneInput(forms.TextInput):
    """A text input offering the common IANA zones (a datalist): pick one, or type any other."""

    def __init__(self, **kwargs):
        super().__init__(attrs={"list": "common-time-zones", "autocomplete": "off", "spellcheck": "false"}, **kwargs)


class WeekdaysField(forms.TypedMultipleChoiceField):
    widget = forms.CheckboxSelectMultiple

    def __init__(self, **kwargs):
        super().__init__(choices=WEEKDAY_CHOICES, coerce=int, **kwargs)


class ScheduleForm(forms.Form):
    """The schedule itself; the pool is fixed once the schedule exists (a pool has at most one)."""

    name = forms.CharField(max_length=100)
    pool = PoolChoiceField()
    time_zone = forms.CharField(max_length=64, initial="UTC", widget=TimeZoneInput, help_text="IANA name")
    baseline_profile = forms.ModelChoiceField(
        queryset=_profiles(),
        required=False,
        empty_label="The pool's default profile",
        label="Outside the windows",
    )
    baseline_qos_policy = forms.ModelChoiceField(
        queryset=_policies(), required=False, empty_label="The pool's default QoS policy", label="QoS outside windows"
    )
    busy_policy = forms.ChoiceField(choices=BusyPolicy.choices, initial=BusyPolicy.WAIT, label="When GPUs are busy")
    wait_minutes = forms.IntegerField(min_value=0, initial=30, label="Wait up to (minutes)")
    enabled = forms.BooleanField(required=False, initial=True, label="Enabled")

    def __init__(self, *args, schedule=None, **kwargs):
        if schedule is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = {
                "name": schedule.name,
                "pool": schedule.pool_id,
                "time_zone": schedule.time_zone,
                "baseline_profile": schedule.baseline_profile_id,
                "baseline_qos_policy": schedule.baseline_qos_policy_id,
                "busy_policy": schedule.busy_policy,
                "wait_minutes": schedule.wait_minutes,
                "enabled": schedule.enabled,
            }
        super().__init__(*args, **kwargs)
        if schedule is not None:
            self.fields["pool"].disabled = True
            self.fields["pool"].initial = schedule.pool_id
            self.fields["pool"].help_text = "A schedule stays with its pool."

    def values(self) -> dict:
        return {
            k: self.cleaned_data[k]
            for k in (
                "name",
                "time_zone",
                "baseline_profile",
                "baseline_qos_policy",
                "busy_policy",
                "wait_minutes",
                "enabled",
            )
        }


class WindowForm(forms.Form):
    """One window: the weekdays it starts on, local start and end (end before start runs past midnight)."""

    name = forms.CharField(max_length=100, required=False)
    weekdays = WeekdaysField(required=False)
    start = forms.TimeField(widget=TimeInput)
    end = forms.TimeField(widget=TimeInput)
    profile = forms.ModelChoiceField(queryset=_profiles(), empty_label="Choose…")
    qos_policy = forms.ModelChoiceField(queryset=_policies(), required=False, empty_label="Pool default", label="QoS")

    def row(self) -> dict:
        data = self.cleaned_data
        return {
            "name": data.get("name") or "",
            "weekdays": list(data.get("weekdays") or []),
            "start": data["start"],
            "end": data["end"],
            "profile": data["profile"],
            "qos_policy": data.get("qos_policy"),
        }


class ExceptionForm(forms.Form):
    """A date on which no window starts (holidays keep the baseline)."""

    date = forms.DateField(widget=DateInput)
    note = forms.CharField(max_length=200, required=False)


WindowFormSet = formset_factory(WindowForm, extra=1, can_delete=True)
ExceptionFormSet = formset_factory(ExceptionForm, extra=1, can_delete=True)


def filled(formset) -> list:
    """The formset's valid forms that hold a row (blank extra rows and rows marked for deletion left out)."""
    return [
        form for form in formset.forms if form.is_valid() and form.cleaned_data and not form.cleaned_data.get("DELETE")
    ]


def prefilled_window(query) -> dict | None:
    """A window to add, from `?window_weekdays=0&window_weekdays=1&window_start=08:00&window_end=20:00&window_profile=3`
    (what a capacity recommendation proposes); None when the query proposes none. The editor checks it on save."""
    if not query.get("window_profile"):
        return None
    return {
        "name": query.get("window_name", ""),
        "weekdays": [int(d) for d in query.getlist("window_weekdays") if d.isdigit() and int(d) < 7],
        "start": query.get("window_start", ""),
        "end": query.get("window_end", ""),
        "profile": query.get("window_profile"),
    }


def window_initial(schedule) -> list[dict]:
    return [
        {
            "name": w.name,
            "weekdays": w.weekdays,
            "start": w.start,
            "end": w.end,
            "profile": w.profile_id,
            "qos_policy": w.qos_policy_id,
        }
        for w in schedule.windows.all()
    ]


def exception_initial(schedule) -> list[dict]:
    return [{"date": e.date, "note": e.note} for e in schedule.exceptions.all()]


class DayNightForm(forms.Form):
    """The day/night preset: one profile in working hours on working days, another the rest of the week."""

    pool = PoolChoiceField()
    day_profile = forms.ModelChoiceField(queryset=_profiles(), empty_label="Choose…", label="Day profile")
    night_profile = forms.ModelChoiceField(queryset=_profiles(), empty_label="Choose…", label="Night profile")
    day_qos_policy = forms.ModelChoiceField(
        queryset=_policies(), required=False, empty_label="The pool's default QoS policy", label="Day QoS policy"
    )
    night_qos_policy = forms.ModelChoiceField(
        queryset=_policies(), required=False, empty_label="The pool's default QoS policy", label="Night QoS policy"
    )
    time_zone = forms.CharField(max_length=64, initial="UTC", widget=TimeZoneInput, help_text="IANA name")
    day_start = forms.TimeField(initial=time(8), widget=TimeInput, label="Day starts")
    day_end = forms.TimeField(initial=time(20), widget=TimeInput, label="Day ends")
    weekdays = WeekdaysField(initial=[0, 1, 2, 3, 4], label="Working days")
    name = forms.CharField(max_length=100, required=False, help_text="default: <pool> day/night")
    busy_policy = forms.ChoiceField(choices=BusyPolicy.choices, initial=BusyPolicy.WAIT, label="When GPUs are busy")
    wait_minutes = forms.IntegerField(min_value=0, initial=30, label="Wait up to (minutes)")

    def values(self) -> dict:
        data = dict(self.cleaned_data)
        if not data.get("name"):
            data.pop("name", None)
        data["weekdays"] = list(data["weekdays"])
        return data
