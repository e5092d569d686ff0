"""Small fragments every table row draws (an instant, a meter), written as tags: an included template costs ~0.1 ms a
row in the template engine, these a few microseconds (B5). Their output is what the templates they replaced drew;
they build strings with `esc` (the escaping of Django's `escape`, without its lazy-string wrapper, which cost more
than the rest of a fragment)."""

import html
from decimal import ROUND_HALF_UP, Decimal

from django import template
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.urls import reverse
from django.utils import timezone
from django.utils.dateformat import TimeFormat
from django.utils.dates import MONTHS_3, WEEKDAYS_ABBR
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_PLACES = {0: Decimal(1), 1: Decimal("0.1")}


def esc(value) -> str:
    """`value` escaped for HTML, unless it is already safe."""
    return value if isinstance(value, SafeString) else html.escape(str(value))


def fixed(value, places: int) -> str:
    """`value|floatformat:places` (unlocalised, half up) for the 0 or 1 places these tags show, without the filter's
    general parsing."""
    return f"{Decimal(repr(float(value))).quantize(_PLACES[places], ROUND_HALF_UP) + 0:f}"


def local_time(at):
    """`at` in the viewer's zone, as the `date` filter shows it."""
    return at.astimezone(timezone.get_current_timezone())


def day_and_time(local, *, date=True, clock=True) -> str:
    """`local|date:"D j M H:i"` ("D j M" without the `clock`, "D H:i" without the `date`), in English as the
    project's `date` filter writes it (USE_I18N is off), without the filter's format parser: a schedule page formats
    some forty of these (bench B5)."""
    parts = [str(WEEKDAYS_ABBR[local.weekday()])]
    if date:
        parts += [str(local.day), MONTHS_3[local.month].title()]
    if clock:
        parts.append(f"{local:%H:%M}")
    return " ".join(parts)


def full_time(local) -> str:
    """`local|date:"Y-m-d H:i:s T"` of a time already in the viewer's zone."""
    return f"{local:%Y-%m-%d %H:%M:%S} {TimeFormat(local).T()}"


@register.simple_tag
def instant(at, short=False, sub=False, never="never"):
    """A past instant: "12 seconds ago" (tessera.js keeps it true while the page stays open) and the absolute time in
    the viewer's zone (time only when today), in full on hover. short=True leaves the absolute part to the title;
    sub=True puts it on its own line; `never` stands in for no instant."""
    if not at:
        return mark_safe(f'<span class="faint">{esc(never or "never")}</span>')
    local = local_time(at)
    html = (
        f'<time datetime="{local.isoformat()}" title="{full_time(local)}" data-relative>{esc(naturaltime(at))}</time>'
    )
    if short:
        return mark_safe(html)
    today = local_time(timezone.now()).date() == local.date()
    absolute = f"{local:%H:%M:%S}" if today else f"{local:%Y-%m-%d %H:%M}"
    return mark_safe(
        f'{html}<span class="sub">{absolute}</span>' if sub else f'{html} <span class="muted small">({absolute})</span>'
    )


@register.simple_tag
def meter(pct, warn=False, large=False, suffix=""):
    """A bar with its number and unit beside it. pct: 0-100 or None; warn: colour high values (memory, not
    utilisation); large: the detail pages' bigger bar; suffix: a word after the unit."""
    if pct is None:
        return mark_safe('<span class="faint" title="Not reported">—</span>')
    if isinstance(pct, str):  # `{% widthratio … as share %}` gives a string
        pct = float(pct)
    level = (" meter--crit" if pct >= 95 else " meter--high" if pct >= 85 else "") if warn else ""
    size = " meter--lg" if large else ""
    unit = f' <span class="unit">{esc(suffix)}</span>' if suffix else ""
    return mark_safe(
        f'<span class="metric"><span class="meter{level}{size}" aria-hidden="true"><span class="meter__fill" '
        f'style="width: {fixed(pct, 1)}%"></span></span><span class="metric__value">{fixed(pct, 0)}'
        f'<span class="unit">&nbsp;%</span>{unit}</span></span>'
    )


@register.simple_tag
def url_prefix(view_name):
    """The URL of `view_name` for an object without its id (`/nodes/` of `/nodes/<pk>/`), reversed once per table
    instead of once a row: `{% url_prefix "console:node_detail" as node_url %}…{{ node_url }}{{ node.pk }}/`."""
    return reverse(view_name, args=[0]).removesuffix("0/")


@register.simple_tag
def relative(at):
    """An instant as "in 2 hours" / "5 minutes ago" alone (tessera.js keeps it true while the page stays open)."""
    return mark_safe(f'<time datetime="{local_time(at).isoformat()}" data-relative>{esc(naturaltime(at))}</time>')


@register.simple_tag
def timestamp(at, clock=False, css=""):
    """An instant as the time of day (`clock`) or date and time to the second in the viewer's zone, in full on hover:
    the audit log's and the rollout page's event times."""
    local = local_time(at)
    shown = f"{local:%H:%M:%S}" if clock else f"{local:%Y-%m-%d %H:%M:%S}"
    attrs = f' class="{esc(css)}"' if css else ""
    return mark_safe(f'<time{attrs} datetime="{local.isoformat()}" title="{full_time(local)}">{shown}</time>')
