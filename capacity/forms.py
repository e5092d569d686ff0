"""The capacity pages' forms: the window of the week a recommendation is for, its draft, the GPU-hours range."""

from datetime import timedelta
from zoneinfo import available_timezones

from django import forms
from django.utils import timezone

from capacity.selectors import GROUPS, Window
from fleet.models import NodePool
from scheduling.forms import WeekdaysField

DRAFT_KINDS = (("profile", "Draft profile"), ("schedule", "Draft schedule"))


class WindowForm(forms.Form):
    """The window of the week whose recorded demand the recommendation replays (default: Mon–Fri 08–20)."""

    weekdays = WeekdaysField(required=False)
    start = forms.TimeField(widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"))
    end = forms.TimeField(widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"))
    time_zone = forms.CharField(max_length=64)

    DEFAULT = Window()

    def __init__(self, data=None, *, time_zone="UTC", **kwargs):
        if data is not None and not data.get("start"):
            data = None  # a first visit: the defaults, unbound
        initial = {"weekdays": list(self.DEFAULT.weekdays), "start": self.DEFAULT.start, "end": self.DEFAULT.end}
        super().__init__(data, initial={**initial, "time_zone": time_zone}, **kwargs)

    def clean_time_zone(self):
        zone = self.cleaned_data["time_zone"]
        if zone not in available_timezones():
            raise forms.ValidationError(f"{zone} is no IANA time zone (e.g. Europe/Berlin).")
        return zone

    def clean(self):
        data = super().clean()
        if not self.errors and not data.get("weekdays"):
            self.add_error("weekdays", "Choose at least one day.")
        return data

    def window(self) -> Window:
        """The window asked for, or the default (in the initial zone) while the form is unbound or invalid."""
        if self.is_bound and self.is_valid():
            data = self.cleaned_data
            return Window(tuple(data["weekdays"]), data["start"], data["end"], data["time_zone"])
        return Window(tz=self.initial["time_zone"])


class DraftForm(WindowForm):
    """A recommendation turned into a draft: the layout ('' for whole GPUs) on `nodes` nodes, for the window."""

    kind = forms.ChoiceField(choices=DRAFT_KINDS)
    layout = forms.CharField(max_length=200, required=False)
    nodes = forms.IntegerField(min_value=1)

    def __init__(self, data=None, **kwargs):
        forms.Form.__init__(self, data, **kwargs)


class GpuHoursForm(forms.Form):
    """The GPU-hours page's range (default: the last 7 days), pool (empty: all) and grouping."""

    pool = forms.ModelChoiceField(
        queryset=NodePool.objects.select_related("cluster"), required=False, empty_label="All pools"
    )
    start = forms.DateField(label="From", widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))
    end = forms.DateField(label="To", widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))
    group_by = forms.ChoiceField(choices=[(g, g.capitalize()) for g in sorted(GROUPS)], label="Group by")

    def __init__(self, data=None, **kwargs):
        today = timezone.localdate()
        defaults = {"start": today - timedelta(days=6), "end": today, "group_by": "namespace"}
        if data is not None and not data.get("start"):
            data = None
        super().__init__(data, initial=defaults, **kwargs)

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["end"] < data["start"]:
            self.add_error("end", "Give a day on or after the first.")
        elif data.get("start") and data.get("end") and (data["end"] - data["start"]).days > 92:
            self.add_error("end", "Show at most 93 days at a time (the CSV and API take up to a year).")
        return data

    def values(self) -> dict:
        if self.is_bound and self.is_valid():
            return dict(self.cleaned_data)
        return {"pool": None, **self.initial}
