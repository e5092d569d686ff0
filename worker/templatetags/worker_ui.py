"""A node change's badge and row, and a retry's time, as tags: the rollout page draws a dot and a row for each of its
changes (see core's `ui` tags for why tags, not included templates)."""

from django import template
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from core.templatetags.ui import esc, full_time, instant, local_time
from worker.choices import ChangeStatus

register = template.Library()

_BADGES = {
    ChangeStatus.SUCCEEDED: '<span class="badge badge--success">Succeeded</span>',
    ChangeStatus.FAILED: '<span class="badge badge--failed">Failed</span>',
    ChangeStatus.ROLLED_BACK: '<span class="badge badge--drift">Rolled back</span>',
    ChangeStatus.APPLYING: '<span class="badge badge--pending">Applying</span>',
    ChangeStatus.VERIFYING: '<span class="badge badge--pending">Verifying</span>',
    ChangeStatus.SKIPPED: '<span class="badge badge--stale">Skipped</span>',
    ChangeStatus.CANCELLED: '<span class="badge badge--unknown">Cancelled</span>',
}
_LABELS = dict(ChangeStatus.choices)
_FAILED = (ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK)


def _clock(local) -> str:
    """The time of day, with the date too when it is not today in the viewer's zone."""
    today = local_time(timezone.now()).date() == local.date()
    return f"{local:%H:%M}" if today else f"{local:%Y-%m-%d %H:%M}"


@register.simple_tag
def change_badge(status, deadline=None):
    """A node change's status: one badge style per state, the text says which; waiting for idle says until when."""
    if status != ChangeStatus.WAITING_FOR_IDLE:
        return mark_safe(_BADGES.get(status, '<span class="badge badge--unknown badge--queued">Queued</span>'))
    if not deadline:
        return mark_safe('<span class="badge badge--warning">Waiting for idle</span>')
    local = local_time(deadline)
    return mark_safe(
        f'<span class="badge badge--warning" title="Gives up waiting at {full_time(local)}">Waiting for idle · until '
        f"{_clock(local)}</span>"
    )


@register.simple_tag
def next_try(at):
    """When the loop next tries a backed-off node: the time in the display zone (the date too when not today), in
    full on hover."""
    local = local_time(at)
    return mark_safe(f'<time datetime="{local.isoformat()}" title="{full_time(local)}">{_clock(local)}</time>')


@register.simple_tag
def change_dots(changes, canary_count):
    """One dot per node change in rollout order, each a link to its row; canaries ringed."""
    dots = []
    for number, change in enumerate(changes, 1):
        canary = number <= canary_count
        text = f"{esc(change.node.name)}: {_LABELS.get(change.status, change.status)}"
        dots.append(
            f'<li class="dot dot--{change.status}{" dot--canary" if canary else ""}"><a href="#change-{change.pk}" '
            f'title="{text}{" (canary)" if canary else ""}"><span class="visually-hidden">{text}</span></a></li>'
        )
    return mark_safe("".join(dots))


@register.simple_tag
def change_row(change, number, canary_count, node_url):
    """The rollout table's row of a node change (`number` its place in rollout order, 1 for the first)."""
    failed = change.status in _FAILED
    canary = '<span class="sub">canary</span>' if number <= canary_count else ""
    config = (
        f"<code>{esc(change.applied_mig_config)}</code>"
        if change.applied_mig_config
        else '<span class="faint">no MIG change</span>'
    )
    error = (
        f'<span class="{"text-failed" if failed else "muted"}">{esc(Truncator(change.error).chars(240))}</span>'
        if change.error
        else '<span class="faint">—</span>'
    )
    if change.retry:
        error += f'<span class="sub">next try {next_try(change.retry.next_retry_at)}</span>'
    row_class = ' class="row--failed"' if failed else ""
    return mark_safe(
        f'<tr id="change-{change.pk}"{row_class}>'
        f'<td class="num faint">{change.position + 1}</td>'
        f'<td class="primary"><a href="{node_url}{change.node_id}/">{esc(change.node.name)}</a>{canary}</td>'
        f'<td>{change_badge(change.status, change.deadline)}</td><td class="num">{change.attempts}</td>'
        f'<td>{config}</td><td class="nowrap">{instant(change.updated_at, short=True)}</td>'
        f'<td class="error-cell">{error}</td></tr>'
    )
