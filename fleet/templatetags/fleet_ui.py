"""A node's and a GPU's badges, and the node table's row, as tags: the node and GPU tables draw them on every row (see
core's `ui` tags for why tags, not included templates)."""

from django import template
from django.utils.safestring import mark_safe

from core.templatetags.ui import esc, full_time, instant, local_time, meter
from fleet.choices import ConfigState, GpuHealth, SharingMode

register = template.Library()

_HEALTH = {
    GpuHealth.HEALTHY: '<span class="badge badge--success">Healthy</span>',
    GpuHealth.DEGRADED: '<span class="badge badge--warning">Degraded</span>',
    GpuHealth.UNHEALTHY: '<span class="badge badge--failed">Unhealthy</span>',
}
_IN_PROGRESS = (ConfigState.PENDING, ConfigState.APPLYING, ConfigState.REBOOTING)
_MODE_LABELS = dict(SharingMode.choices)
_STATE_LABELS = dict(ConfigState.choices)


@register.simple_tag
def ready_badge(node):
    """Ready or not, and whether the node is cordoned, stale (no report for longer than the stale limit) or gone."""
    if node.ready:
        badges = ['<span class="badge badge--success">Ready</span>']
    elif node.ready is False:
        badges = ['<span class="badge badge--failed">Not ready</span>']
    else:
        badges = ['<span class="badge badge--unknown">Readiness unknown</span>']
    if node.unschedulable:
        badges.append(' <span class="badge badge--warning">Cordoned</span>')
    if getattr(node, "is_stale", False):
        badges.append(
            ' <span class="badge badge--stale" title="No report for longer than the stale limit">Stale</span>'
        )
    if node.gone_at:
        badges.append(' <span class="badge badge--unknown">Gone</span>')
    return mark_safe("".join(badges))


@register.simple_tag
def mode_tag(node):
    """The sharing mode the node reports."""
    mode = node.observed_mode
    if not mode:
        return mark_safe('<span class="faint" title="The node has not reported a sharing mode">not reported</span>')
    label = esc(_MODE_LABELS.get(mode, mode))
    if mode == SharingMode.PASSTHROUGH:
        return mark_safe(f'<span class="tag" title="{label}">Passthrough</span>')
    return mark_safe(f'<span class="tag{" tag--mig" if mode == SharingMode.MIG else ""}">{label}</span>')


@register.simple_tag
def config_badge(node):
    """The node's sharing-config state as it reports it; in-progress states say since when, and past the deadline
    they turn into a warning."""
    state = node.config_state
    if state == ConfigState.SUCCESS:
        return mark_safe('<span class="badge badge--success">Success</span>')
    if state == ConfigState.FAILED:
        return mark_safe('<span class="badge badge--failed">Failed</span>')
    if state not in _IN_PROGRESS:
        return mark_safe('<span class="badge badge--unknown">Unknown</span>')
    stuck = getattr(node, "is_stuck", False)
    label = _STATE_LABELS[state]
    since = node.config_state_since and local_time(node.config_state_since)
    title = f'title="{label} since {full_time(since)}"' if since else ""
    return mark_safe(
        f'<span class="badge {"badge--warning" if stuck else "badge--pending"}" {title}>{label}'
        f"{f' since {since:%H:%M}' if since else ''}{' · too long' if stuck else ''}</span>"
    )


@register.simple_tag
def health_badge(gpu):
    """A GPU's health as its node reports it."""
    return mark_safe(_HEALTH.get(gpu.health, '<span class="badge badge--unknown">Health unknown</span>'))


@register.simple_tag
def node_cells(node, node_url, cluster_url, pool_url):
    """The cells of one node table row (the node list's and the overview's), links built from URL prefixes reversed
    once per table (`url_prefix`). Written here rather than in the table's template: 50 rows through the template
    engine cost ~10 ms, more than the page's queries (B5)."""
    name = f'<a href="{node_url}{node.pk}/">{esc(node.name)}</a>'
    if node.driver_version:
        cuda = f" · CUDA {esc(node.cuda_version)}" if node.cuda_version else ""
        name += f'\n            <span class="sub">driver {esc(node.driver_version)}{cuda}</span>'
    pool = (
        f'<a href="{pool_url}{node.pool_id}/">{esc(node.pool.name)}</a>'
        if node.pool_id
        else '<span class="faint">no pool</span>'
    )
    if node.gpu_count:
        unhealthy = node.unhealthy_gpu_count
        flag = (
            f'<span class="sub"><span class="badge badge--failed">{unhealthy} unhealthy</span></span>'
            if unhealthy
            else ""
        )
        gpus = f"{node.gpu_count} × {esc(node.product.replace('NVIDIA-', ''))}{flag}"
    else:
        gpus = '<span class="faint">none</span>'
    sampled = f'<span class="sub">at {local_time(node.metrics_at):%H:%M}</span>' if node.metrics_at else ""
    cluster = f'<a href="{cluster_url}{node.cluster_id}/">{esc(node.cluster.name)}</a>'
    return mark_safe(
        f'<td class="primary">{name}</td><td>{cluster}</td>'
        f"<td>{pool}</td><td>{ready_badge(node)}</td><td>{mode_tag(node)}</td><td>{config_badge(node)}</td>"
        f'<td class="nowrap">{gpus}</td><td>{meter(node.mean_utilization)}{sampled}</td>'
        f'<td class="nowrap">{instant(node.last_seen_at, sub=True)}</td>'
    )
