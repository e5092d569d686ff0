"""The week timeline as the schedule pages draw it: SVG geometry of a calendar's week in its own zone, with a
legend, and weekdays in words. Pure (no Django): the window math it draws is `windows.week_segments`."""

from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from scheduling import windows

TL_LABEL = 96  # px left of the hours, for the day names
TL_HOUR = 30  # px per hour: 24 h = 720 px
TL_TOP = 24  # px above the first row, for the hour labels
TL_ROW = 30
TL_GAP = 6
TL_COLOURS = 8


def days_text(weekdays) -> str:
    """Mon–Fri, Sun: runs of consecutive weekdays (0 = Monday), as the editor's checkboxes name them."""
    runs: list[list[int]] = []
    for day in sorted(set(weekdays)):
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    short = [name[:3] for name in windows.DAY_NAMES]
    return ", ".join(short[r[0]] + (f"–{short[r[-1]]}" if len(r) > 1 else "") for r in runs)


def value_labeller(profiles: dict, policies: dict, default=None) -> Callable:
    """Name a calendar value (profile id, QoS policy id) as an admin reads it; a None profile is the pool's default.

    `default` is the pool's PoolSharing row (or None when it has none).
    """

    def label(value) -> str:
        profile_id, qos_id = value if isinstance(value, tuple) else (value, None)
        if profile_id is None:
            profile = getattr(default, "profile", None)
            text = f"Pool default ({profile.name})" if profile else "Pool default (none set)"
        else:
            text = profiles.get(profile_id, f"profile #{profile_id}")
        if qos_id is not None:
            text += f" · QoS {policies.get(qos_id, qos_id)}"
        return text

    return label


def _day_x(minute: int) -> float:
    return TL_LABEL + minute * TL_HOUR / 60


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


class _Colours:
    """One colour class per calendar value, in order of first use; the pool's default has its own."""

    def __init__(self, calendar: windows.Calendar):
        self._assigned: dict = {}
        self(calendar.baseline)
        for window in calendar.windows:
            self(window.value)

    def __call__(self, value) -> str:
        if value is None or value == (None, None):
            return "default"
        if value not in self._assigned:
            self._assigned[value] = f"c{len(self._assigned) % TL_COLOURS}"
        return self._assigned[value]


def _rows(calendar: windows.Calendar, monday: date, today: date) -> list[dict]:
    """The seven day rows, Monday first, without their segments."""
    rows = []
    for n in range(7):
        day = monday + timedelta(days=n)
        y = TL_TOP + n * (TL_ROW + TL_GAP)
        rows.append(
            {
                "day": day,
                "y": y,
                "text_y": y + TL_ROW / 2 + 4,
                "today": day == today,
                "exception": day in calendar.exceptions,
                "segments": [],
            }
        )
    return rows


def _add_segments(rows: list[dict], calendar: windows.Calendar, monday: date, label: Callable, colour) -> None:
    for segment in windows.week_segments(calendar, monday):
        rows[(segment.day - monday).days]["segments"].append(
            {
                "x": _day_x(segment.start_minute),
                "width": (segment.end_minute - segment.start_minute) * TL_HOUR / 60,
                "start": _hhmm(segment.start_minute),
                "end": _hhmm(segment.end_minute),
                "colour": colour(segment.value),
                "label": label(segment.value),
                "window": segment.window_name,
                "baseline": segment.window_name == "" and segment.value == calendar.baseline,
            }
        )


def _legend(calendar: windows.Calendar, label: Callable, colour) -> list[dict]:
    """Each value once: the baseline first, then windows' values with the names of the windows that set them."""
    legend: dict = {
        calendar.baseline: {
            "colour": colour(calendar.baseline),
            "label": label(calendar.baseline),
            "notes": ["baseline"],
        }
    }
    for window in calendar.windows:
        entry = legend.setdefault(
            window.value, {"colour": colour(window.value), "label": label(window.value), "notes": []}
        )
        if window.name and window.name not in entry["notes"]:
            entry["notes"].append(window.name)
    return list(legend.values())


def _marks(rows: list[dict], marks: Sequence[tuple[datetime, str]], tz: ZoneInfo) -> list[dict]:
    """Each (instant, text) of the drawn week as a tick on its day's row; instants outside the week are left out."""
    placed = []
    for at, text in marks:
        local = at.astimezone(tz)
        day = (local.date() - rows[0]["day"]).days
        if 0 <= day < 7:
            y = rows[day]["y"]
            x = _day_x(local.hour * 60 + local.minute)
            placed.append({"x": x, "tip": x - 5, "y1": y - 3, "y2": y + TL_ROW + 3, "local": local, "text": text})
    return placed


def week_timeline(
    calendar: windows.Calendar,
    label: Callable,
    *,
    now: datetime | None = None,
    viewer_zone: str | None = None,
    marks: Sequence[tuple[datetime, str]] = (),
) -> dict:
    """The 7 × 24 h drawing of a calendar in its own zone for the week containing `now`, with its legend.

    `label` names a calendar value (see `value_labeller`); `viewer_zone` is the zone the page is read in (a note
    says so when it is not the calendar's); `marks` are instants to tick with a text (the Kueue quota each
    transition sets).
    """
    local_now = (now or datetime.now(UTC)).astimezone(ZoneInfo(calendar.tz))
    monday = local_now.date() - timedelta(days=local_now.weekday())
    colour = _Colours(calendar)
    rows = _rows(calendar, monday, local_now.date())
    _add_segments(rows, calendar, monday, label, colour)
    height = TL_TOP + 7 * (TL_ROW + TL_GAP)
    today = next(r for r in rows if r["today"])
    minute_now = local_now.hour * 60 + local_now.minute
    viewer_zone = viewer_zone or calendar.tz
    return {
        "tz": calendar.tz,
        "rows": rows,
        "legend": _legend(calendar, label, colour),
        "width": TL_LABEL + 24 * TL_HOUR + 24,
        "height": height,
        "plot_width": 24 * TL_HOUR,
        "label_width": TL_LABEL,
        "hours": [{"hour": h, "x": _day_x(h * 60), "label": h % 3 == 0} for h in range(25)],
        "grid_bottom": height - TL_GAP,
        "now": {
            "x": _day_x(minute_now),
            "y1": today["y"] - 4,
            "y2": today["y"] + TL_ROW + 4,
            "local": local_now,
            "label_right": minute_now > 20 * 60,
        },
        "row_height": TL_ROW,
        "zones_differ": viewer_zone != calendar.tz,
        "viewer_zone": viewer_zone,
        "week_of": monday,
        "marks": _marks(rows, marks, ZoneInfo(calendar.tz)),
    }
