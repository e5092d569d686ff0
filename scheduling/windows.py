"""Schedule window math: which value (profile, QoS policy) is active at an instant, and when it changes.

Rules:
- Weekdays run 0 (Monday) to 6 (Sunday). A window belongs to the local date on which it starts; `end <= start`
  crosses midnight into the next day, and `end == start` means a full 24 hours. Times are whole minutes.
- On an exception date no window starts, so the baseline applies; a window that started the evening before still
  runs to its end.
- A local boundary is the first instant at which the zone's wall clock reads that time or later. An existing time
  is that instant; a repeated time (fall back) is its first occurrence, like `fold=0`; a time inside the
  spring-forward gap is the end of the gap (02:30 on 2026-03-29 in Europe/Berlin starts at 03:00 CEST), so a window
  lying wholly inside the gap does not run that day. Boundaries are compared as UTC instants, so a window spanning
  a change lasts an hour less or more, as a clock on the wall would say.
- `week_segments` draws each local day in wall-clock minutes 0..1440, whatever its real length.
"""

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import cache, cached_property, lru_cache
from itertools import chain
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MINUTES_PER_DAY = 1440
NEXT_TRANSITION_HORIZON = timedelta(days=8)

_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
_WEEK_MINUTES = 7 * MINUTES_PER_DAY
_DAY_CACHE_SIZE = 64
_PLAN_CACHE_SIZE = 16384  # calendars a process keeps validated and planned: every schedule of a large fleet


class CalendarError(ValueError):
    """An invalid calendar; `errors` lists every problem found, for the admin to fix at once."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Window:
    """A weekly recurring local time range, on the weekdays it starts, during which `value` applies."""

    weekdays: frozenset[int]
    start: time
    end: time
    value: Hashable
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "weekdays", frozenset(self.weekdays))

    @property
    def minutes(self) -> tuple[int, int]:
        """Start and end as minutes from the start of the starting day; the end may reach into the next day."""
        start = self.start.hour * 60 + self.start.minute
        end = self.end.hour * 60 + self.end.minute
        return start, end if end > start else end + MINUTES_PER_DAY


@dataclass(frozen=True)
class Calendar:
    """A schedule in one IANA zone: windows, the baseline value outside them, and dates without windows."""

    tz: str
    windows: tuple[Window, ...]
    baseline: Hashable
    exceptions: frozenset[date] = field(default_factory=frozenset)

    def __post_init__(self):
        object.__setattr__(self, "windows", tuple(self.windows))
        object.__setattr__(self, "exceptions", frozenset(self.exceptions))

    @cached_property
    def _plan(self) -> "_Plan":
        """Validated once and kept with the calendar, so the reconcile tick pays for a few lookups only."""
        return _plan_of(self)


@dataclass(frozen=True)
class Transition:
    """A change of value at one instant; `window` is the window entered, None when returning to the baseline."""

    at: datetime
    local: datetime
    from_value: Hashable
    to_value: Hashable
    window: Window | None


@dataclass(frozen=True)
class Segment:
    """A run of one value on a local day of the week timeline, in wall-clock minutes."""

    day: date
    start_minute: int
    end_minute: int
    value: Hashable
    window_name: str


@lru_cache(maxsize=_PLAN_CACHE_SIZE)
def _plan_of(calendar: Calendar) -> "_Plan":
    """Equal calendars share one plan across ticks: a schedule read again each tick is not validated again."""
    check(calendar)
    return _Plan(calendar)


class _Plan:
    """Windows grouped by starting weekday, and per-date UTC intervals computed on first use."""

    def __init__(self, calendar: Calendar):
        self.zone = ZoneInfo(calendar.tz)
        self.baseline = calendar.baseline
        self.exceptions = calendar.exceptions
        self.by_weekday = tuple(
            tuple(sorted((w for w in calendar.windows if day in w.weekdays), key=lambda w: w.start)) for day in range(7)
        )
        self._days: dict[date, tuple[tuple[datetime, datetime, Window], ...]] = {}

    def intervals(self, day: date) -> tuple[tuple[datetime, datetime, Window], ...]:
        """The (start, end, window) UTC intervals of the windows starting on a local date, in order."""
        found = self._days.get(day)
        if found is None:
            found = () if day in self.exceptions else tuple(self._compute(day))
            if len(self._days) >= _DAY_CACHE_SIZE:
                self._days.clear()
            self._days[day] = found
        return found

    def _compute(self, day: date) -> Iterator[tuple[datetime, datetime, Window]]:
        for window in self.by_weekday[day.weekday()]:
            start = _resolve(self.zone, day, window.start)
            end = _resolve(self.zone, day if window.end > window.start else day + _DAY, window.end)
            if start < end:
                yield start, end, window


@cache
def time_zones() -> frozenset[str]:
    """Every IANA zone name this machine has: read from disk once (walking the tz database costs ~50 ms a call, a
    config plan of 500 schedules checks 500)."""
    return frozenset(available_timezones())


def _resolve(zone: ZoneInfo, day: date, at: time) -> datetime:
    """The first UTC instant at which the wall clock in `zone` reads `day` `at` or later."""
    wall = datetime.combine(day, at)
    instant = wall.replace(tzinfo=zone).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # Inside a gap: the wall clock jumps past `wall` at the transition, which lies between the two readings.
    low = (wall - wall.replace(tzinfo=zone, fold=1).utcoffset()).replace(tzinfo=UTC)
    high = instant
    while high - low > _SECOND:
        middle = low + (high - low) // _SECOND // 2 * _SECOND
        if middle.astimezone(zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high


def _utc(t: datetime, name: str = "t") -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {t!r}")
    return t.astimezone(UTC)


def validate(calendar: Calendar) -> list[str]:
    """Every problem with the calendar, worded for the schedule editor; an empty list means valid."""
    errors = []
    try:
        ZoneInfo(calendar.tz)
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError):
        errors.append(f"Unknown time zone {calendar.tz!r}.")
    usable = []
    for index, window in enumerate(calendar.windows):
        label = _label(index, window)
        problems = []
        if not window.weekdays:
            problems.append(f"Window {label} has no weekdays.")
        elif not window.weekdays <= set(range(7)):
            problems.append(f"Window {label} has weekdays outside 0 (Monday) to 6 (Sunday): {sorted(window.weekdays)}.")
        for edge in ("start", "end"):
            value = getattr(window, edge)
            if not isinstance(value, time) or value.tzinfo is not None:
                problems.append(f"Window {label} {edge} must be a local time without a time zone.")
            elif value.second or value.microsecond:
                problems.append(f"Window {label} {edge} must be a whole minute.")
        errors.extend(problems)
        if not problems:
            usable.append((index, window))
    errors.extend(_overlaps(usable))
    return errors


def check(calendar: Calendar) -> None:
    """Raise CalendarError listing every problem, for callers that must not store or evaluate an invalid calendar."""
    errors = validate(calendar)
    if errors:
        raise CalendarError(errors)


def _overlaps(windows: list[tuple[int, Window]]) -> list[str]:
    """Overlaps on the weekly circle of minutes, so a Sunday night window meets Monday morning."""
    spans = []
    for index, window in windows:
        start, end = window.minutes
        for day in window.weekdays:
            spans.append((index, window, day * MINUTES_PER_DAY + start, day * MINUTES_PER_DAY + end))
    found: dict[tuple[int, int, int, int], list[int]] = {}
    for i, (index_a, _, start_a, end_a) in enumerate(spans):
        for index_b, _, start_b, end_b in spans[i + 1 :]:
            for shift in (-_WEEK_MINUTES, 0, _WEEK_MINUTES):
                low, high = max(start_a, start_b + shift), min(end_a, end_b + shift)
                if low < high:
                    day, offset = divmod(low % _WEEK_MINUTES, MINUTES_PER_DAY)
                    key = (min(index_a, index_b), max(index_a, index_b), offset, offset + high - low)
                    found.setdefault(key, []).append(day)
    by_index = dict(windows)
    errors = []
    for (index_a, index_b, low, high), days in sorted(found.items()):
        named_days = ", ".join(DAY_NAMES[day] for day in sorted(days))
        errors.append(
            f"Windows {_label(index_a, by_index[index_a])} and {_label(index_b, by_index[index_b])} overlap on "
            f"{named_days} {_clock(low)}–{_clock(high)}{' (next day)' if high > MINUTES_PER_DAY else ''}."
        )
    return errors


def _label(index: int, window: Window) -> str:
    name = repr(window.name) if window.name else f"#{index + 1}"
    if not (isinstance(window.start, time) and isinstance(window.end, time)):
        return name
    when = f"{window.start:%H:%M}–{window.end:%H:%M}"
    days = _day_ranges(window.weekdays)
    return f"{name} ({days} {when})" if days else f"{name} ({when})"


def _day_ranges(weekdays: frozenset[int]) -> str:
    """Mon–Fri, Sun rather than seven names, as the editor shows them."""
    runs: list[list[int]] = []
    for day in sorted(d for d in weekdays if isinstance(d, int) and 0 <= d < 7):
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ", ".join(DAY_NAMES[run[0]][:3] + (f"–{DAY_NAMES[run[-1]][:3]}" if len(run) > 1 else "") for run in runs)


def _clock(minutes: int) -> str:
    hours, minute = divmod(minutes, 60)
    return f"{hours if hours == 24 and minute == 0 else hours % 24:02d}:{minute:02d}"


def active_window(calendar: Calendar, t: datetime) -> Window | None:
    """The window in force at instant t, or None when the baseline applies."""
    plan = calendar._plan
    now = _utc(t)
    day = now.astimezone(plan.zone).date()
    # The day before holds windows crossing midnight; the day after, windows begun before a fall-back carried the
    # wall clock back across midnight (America/Goose_Bay did until 2011).
    for candidate in (day - _DAY, day, day + _DAY):
        for start, end, window in plan.intervals(candidate):
            if start <= now < end:
                return window
    return None


def value_at(calendar: Calendar, t: datetime) -> Hashable:
    """The value in force at instant t: the active window's, else the baseline."""
    window = active_window(calendar, t)
    return calendar.baseline if window is None else window.value


def transitions(calendar: Calendar, start: datetime, end: datetime) -> list[Transition]:
    """Every change of value in (start, end], oldest first."""
    first, last = _utc(start, "start"), _utc(end, "end")
    if last < first:
        raise ValueError(f"end {end} is before start {start}")
    return list(_changes(calendar, first, last))


def next_transition(calendar: Calendar, t: datetime, horizon: timedelta = NEXT_TRANSITION_HORIZON) -> Transition | None:
    """The first change after t within the horizon; 8 days cover a weekly calendar, not a long run of exceptions."""
    now = _utc(t)
    return next(_changes(calendar, now, now + horizon), None)


def _changes(calendar: Calendar, start: datetime, end: datetime) -> Iterator[Transition]:
    """Fold the switching points into changes of value, so same-value neighbours produce none."""
    plan = calendar._plan
    current = calendar.baseline
    for at, window in _switches(plan, start, end):
        if at > end:
            return
        value = calendar.baseline if window is None else window.value
        if at > start and value != current:
            yield Transition(at, at.astimezone(plan.zone), current, value, window)
        current = value


def _switches(plan: _Plan, start: datetime, end: datetime) -> Iterator[tuple[datetime, Window | None]]:
    """Instants where a window begins or the baseline resumes (None), walking days rather than minutes."""
    first_day = start.astimezone(plan.zone).date() - _DAY
    last_day = end.astimezone(plan.zone).date() + _DAY
    days = (first_day + n * _DAY for n in range((last_day - first_day).days + 1))
    open_end = None
    for window_start, window_end, window in chain.from_iterable(map(plan.intervals, days)):
        if open_end is not None and open_end < window_start:
            yield open_end, None
        yield window_start, window
        open_end = window_end
    if open_end is not None:
        yield open_end, None


def week_segments(calendar: Calendar, week_start: date) -> list[Segment]:
    """Seven local days from week_start, each covered by segments from minute 0 to 1440, for the timeline."""
    plan = calendar._plan
    segments = []
    for n in range(7):
        day = week_start + n * _DAY
        eve = day - _DAY
        pieces = []
        if eve not in plan.exceptions:
            for window in plan.by_weekday[eve.weekday()]:
                start, end = window.minutes
                if end > MINUTES_PER_DAY:
                    pieces.append((0, end - MINUTES_PER_DAY, window))
        if day not in plan.exceptions:
            for window in plan.by_weekday[day.weekday()]:
                start, end = window.minutes
                pieces.append((start, min(end, MINUTES_PER_DAY), window))
        pieces.sort(key=lambda piece: piece[0])
        cursor = 0
        runs: list[Segment] = []
        for start, end, window in pieces:
            if cursor < start:
                _append(runs, Segment(day, cursor, start, calendar.baseline, ""))
            _append(runs, Segment(day, start, end, window.value, window.name))
            cursor = end
        if cursor < MINUTES_PER_DAY:
            _append(runs, Segment(day, cursor, MINUTES_PER_DAY, calendar.baseline, ""))
        segments.extend(runs)
    return segments


def _append(runs: list[Segment], segment: Segment) -> None:
    """Join a piece to the previous one when it shows the same thing, e.g. a 24 h window split at midnight."""
    if runs and (runs[-1].value, runs[-1].window_name) == (segment.value, segment.window_name):
        previous = runs.pop()
        segment = Segment(segment.day, previous.start_minute, segment.end_minute, segment.value, segment.window_name)
    runs.append(segment)
