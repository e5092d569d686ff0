"""The week timeline's grid and day rows, and the upcoming changes' rows, as tags: ~25 hour lines and a rect, label
and title per segment were most of the schedule page through the template engine, its changes' rows a tenth (see
core's `ui` tags, bench B5)."""

from django import template
from django.template.loader import render_to_string
from django.templatetags.tz import do_timezone
from django.utils.safestring import mark_safe
from django.utils.timezone import template_localtime

from core.templatetags.ui import day_and_time, esc, relative

register = template.Library()


def _segment(row: dict, s: dict, row_height) -> str:
    label = esc(s["label"])
    hatch = 'fill="url(#tl-default-hatch)" ' if s["colour"] == "default" else ""
    why = " (outside the windows)" if s["baseline"] else ""
    if s["window"]:
        why = f" (window “{esc(s['window'])}”)"
    text = (
        f'<text class="tl-seg-label tl-ink-{s["colour"]}" x="{int(s["x"]) + 8}" y="{row["text_y"]}">'
        f"{esc(s['short_label'])}</text>"
        if s["width"] >= 90
        else ""
    )
    return (
        f'<rect class="tl-seg tl-{s["colour"]}" x="{s["x"]}" y="{row["y"]}" width="{s["width"]}" '
        f'height="{row_height}" rx="4" {hatch}data-start="{s["start"]}" data-end="{s["end"]}" data-profile="{label}">'
        f"<title>{esc(row['day_label'])} {s['start']}–{s['end']} · {label}{why}</title></rect>{text}"
    )


@register.simple_tag
def timeline_grid(timeline: dict):
    """Today's band, the hour grid and one row per day with its segments, of `scheduling.views._timeline`."""
    width, row_height = timeline["width"], timeline["row_height"]
    parts = [
        f'<rect class="tl-today" x="0" y="{int(row["y"]) - 3}" width="{width}" height="{int(row_height) + 6}" rx="6"/>'
        for row in timeline["rows"]
        if row["today"]
    ]
    for hour in timeline["hours"]:
        major = " tl-grid--major" if hour["label"] else ""
        parts.append(
            f'<line class="tl-grid{major}" x1="{hour["x"]}" x2="{hour["x"]}" y1="18" y2="{timeline["grid_bottom"]}"/>'
        )
        if hour["label"]:
            parts.append(f'<text class="tl-hour" x="{hour["x"]}" y="12">{hour["hour"]:02d}:00</text>')
    for row in timeline["rows"]:
        mark = " ✱" if row["exception"] else ""
        parts.append(
            f'<g class="tl-row{" tl-row--today" if row["today"] else ""}" data-day="{row["day"].isoformat()}">'
            f'<text class="tl-day" x="8" y="{row["text_y"]}">{esc(row["day_label"])}{mark}</text>'
            f"{''.join(_segment(row, s, row_height) for s in row['segments'])}</g>"
        )
    return mark_safe("".join(parts))


def _profile_cell(profile, urls: dict) -> str:
    if profile is None:
        return '<span class="faint">no profile</span>'
    if profile.pk not in urls:
        urls[profile.pk] = esc(profile.get_absolute_url())
    return f'<a href="{urls[profile.pk]}"><strong>{esc(profile.name)}</strong></a>'


@register.simple_tag
def transition_rows(rows, schedule_zone: str, viewer_zone: str, following, kueue):
    """The schedule page's changes of the next days as table rows, from (transition, Kueue quota) pairs: the time in
    the viewer's zone and, when it differs, in the schedule's, from → to profile, nodes and (with a Kueue binding)
    the quota change."""
    urls: dict = {}
    parts = []
    for t, quota in rows:
        local_cell = ""
        if schedule_zone != viewer_zone:
            local_cell = f'<td class="nowrap">{day_and_time(do_timezone(t.local, schedule_zone), date=False)}</td>'
        source = esc(t.from_profile.name) if t.from_profile else '<span class="faint">no profile</span>'
        quota_cell = (
            f'<td class="small">{render_to_string("scheduling/_kueue_quota.html", {"quota": quota})}</td>'
            if kueue
            else ""
        )
        parts.append(
            f'<tr><td class="nowrap">{day_and_time(template_localtime(t.at))}'
            f'<span class="sub">{relative(t.at)}</span></td>{local_cell}'
            f"<td>{source} → {_profile_cell(t.to_profile, urls)}</td>"
            f'<td class="num">{esc(following)}</td>{quota_cell}</tr>'
        )
    return mark_safe("".join(parts))
