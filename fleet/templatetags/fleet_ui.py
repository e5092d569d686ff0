"""A node's and a GPU's badges, and the node table's row, as tags: the node and GPU tables draw them on every row (see
core's `ui` tags for why tags, not included templates)."""

from django import template
from django.utils.safestring import mark_safe

from core.templatetags.ui import esc, fixed, full_time, instant, local_time, meter
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


def _block(key, block) -> str:
    """One MIG device of `mig_layout_svg`: its block, label, utilisation bar and in-use marker."""
    colour, x, width, centre = block.colour, block.x, block.width, block.centre
    title = f"{esc(block.profile)} on memory slices {block.start}–{block.end}"
    title += f" · {esc(block.uuid)}" if block.uuid else ""
    title += f" · in use by {esc(block.in_use_by)}" if block.in_use_by else " · not in use"
    if block.utilization_pct is not None:
        title += f" · {fixed(block.utilization_pct, 0)}% busy"
    if block.memory_used_gib is not None:
        total = "" if block.memory_gib is None else fixed(block.memory_gib, 1)
        title += f" · {fixed(block.memory_used_gib, 1)} of {total} GiB used"
    parts = [
        f'<g><rect class="mig-device mig-{colour}" x="{x}" y="6" width="{width}" height="84" rx="7" '
        f'data-profile="{esc(block.profile)}" data-start="{block.start}" data-size="{block.size}"><title>{title}'
        f'</title></rect><rect class="mig-edge mig-ink-{colour}" x="{x + 3}" y="9" width="{width - 6}" height="78" '
        f'rx="5" aria-hidden="true"/>'
    ]
    if len(block.lines) == 2:
        parts.append(
            f'<text class="mig-label mig-ink-{colour}" x="{centre}" y="45">{esc(block.lines[0])}</text>'
            f'<text class="mig-label-sub mig-ink-{colour}" x="{centre}" y="62">{esc(block.lines[1])}</text>'
        )
    else:
        parts.append(f'<text class="mig-label mig-ink-{colour}" x="{centre}" y="53">{esc(block.lines[0])}</text>')
    if block.utilization_pct is not None:
        busy = fixed(block.utilization_pct, 0)
        parts.append(
            f'<text class="mig-util-label mig-ink-{colour}" x="{centre}" y="78">{busy}%</text>'
            f'<rect class="mig-util-track" x="{x + 6}" y="81" width="{width - 12}" height="4" rx="2" '
            'aria-hidden="true"/>'
            f'<rect class="mig-util mig-ink-{colour}" x="{x + 6}" y="81" width="{block.utilization_bar}" height="4" '
            f'rx="2" data-utilization="{block.utilization_pct}"><title>{esc(block.profile)}: graphics engine {busy}% '
            f"active</title></rect>"
        )
    if block.in_use_by:
        parts.append(
            f'<circle class="mig-inuse mig-ink-{colour}" cx="{x + width - 14}" cy="21" r="5"><title>In use by '
            f"{esc(block.in_use_by)}</title></circle>"
        )
    parts.append("</g>")
    return "".join(parts)


@register.simple_tag
def mig_layout_svg(key, layout, large=False):
    """The MIG layout of one GPU (`layout`: `fleet.selectors.mig_layout` or `planned_mig_layout`): a column per memory
    slice (8; A30: 4), each MIG device a block over start..start+size coloured by profile, free slices hatched, and
    the utilisation of each slice dcgm-exporter reported at its foot. `key` makes its element ids unique on the page
    (the GPU's id); large=True on the GPU page. The node page draws one per GPU: ~1 ms each as a template."""
    width = layout.width
    free = "".join(
        f'<rect class="mig-free" x="{slot["x"]}" y="6" width="60" height="84" rx="7" fill="url(#mig-hatch-{key})">'
        f"<title>Memory slice {slot['index']}: free</title></rect>"
        for slot in layout.free
    )
    axis = "".join(f'<text class="mig-axis" x="{t["x"]}" y="106">{t["index"]}</text>' for t in layout.axis)
    legend = "".join(
        f'<li><span class="swatch mig-{e["colour"]}" aria-hidden="true"></span>{esc(e["profile"])} × {e["count"]}</li>'
        for e in layout.legend
    )
    if layout.free:
        legend += f'<li><span class="swatch swatch--free" aria-hidden="true"></span>free × {len(layout.free)}</li>'
    if layout.any_in_use:
        legend += '<li><span class="swatch swatch--inuse" aria-hidden="true"></span>in use</li>'
    if layout.any_metrics:
        legend += '<li class="faint">bar and % at the foot: each slice\'s graphics engine activity</li>'
    return mark_safe(
        f'<figure class="mig{" mig--large" if large else ""}"><svg xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} 112" style="max-width: {round(width / 10 * 16) if large else width}px" role="img" '
        f'aria-labelledby="mig-title-{key}"><title id="mig-title-{key}">{esc(layout.summary)}</title><defs>'
        f'<pattern id="mig-hatch-{key}" width="7" height="7" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="7" height="7" class="mig-hatch-bg"/>'
        f'<line x1="1" y1="0" x2="1" y2="7" class="mig-hatch-line"/></pattern></defs>{free}'
        f"{''.join(_block(key, block) for block in layout.blocks)}{axis}</svg>"
        f'<figcaption><ul class="legend" aria-label="Legend">{legend}<li class="faint">{layout.slices} memory slices '
        f"(numbered below)</li></ul></figcaption></figure>"
    )
