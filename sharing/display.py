"""How sharing's objects read on a page: MIG layouts in the admin's notation and drawn per product, QoS settings
with their units beside what a node runs, workload rules in words. Shared by every page that shows them."""

from django.template.defaultfilters import pluralize

from fleet.selectors import planned_mig_layout
from sharing.forms import QoSPolicyForm, layout_text
from sharing.mig import PRODUCTS, mig_resources, validate_layout
from sharing.models import QoSPolicy
from sharing.qos import DIFFERS, SettingCheck, SettingsComparison
from sharing.spec import ALL_GPUS, ProfileSpec

# --- MIG layouts -----------------------------------------------------------------------------------------------------


def _layout_keys(mig_layouts) -> list[tuple[str, str]]:
    """(key, where) of a profile's MIG layouts, the every-GPU entry first, then by GPU index."""
    keys = sorted(mig_layouts, key=lambda k: (k != ALL_GPUS, k.zfill(3)))
    return [(k, "every GPU" if k == ALL_GPUS else f"GPU {k}") for k in keys]


def layout_lines(mig_layouts) -> list[tuple[str, str]]:
    """(where, layout) rows of a profile's MIG layouts in the admin notation."""
    return [(where, layout_text(mig_layouts[key])) for key, where in _layout_keys(mig_layouts)]


def layout_drawings(spec: ProfileSpec, *, prefix: str = "plan") -> list[dict]:
    """Per target product and layout entry: NVIDIA's verdict and, when it fits, the slices drawn."""
    if spec.mode != "mig":
        return []
    drawings = []
    for p, name in enumerate(spec.target_products):
        product = PRODUCTS.get(name)
        if product is None:
            continue
        entries = []
        for key, where in _layout_keys(spec.mig_layouts):
            layout = spec.mig_layouts[key]
            entry = {"key": key, "where": where, "off": layout is None, "gpu": {"pk": f"{prefix}-{p}-{key}"}}
            if layout is not None and product.mig_capable:
                result = validate_layout(product, layout)
                entry["result"] = result
                if result.valid:
                    entry["drawing"] = planned_mig_layout(name, result.placements)
                    entry["resources"] = mig_resources(product, layout)
            entries.append(entry)
        drawings.append({"product": product, "entries": entries})
    return drawings


# --- QoS settings and rules ------------------------------------------------------------------------------------------

RULE_LABELS = {
    "qos": "Pod QoS class",
    "priority": "Priority class",
    "exclusive": "Exclusive taint",
    "max_pods_per_gpu": "Pods per GPU",
}


def setting_display(policy, name: str) -> str:
    """A policy's setting as an admin reads it, with its unit ("1980 MHz", "On"); "" when not set."""
    return value_display(name, getattr(policy, name))


def value_display(name: str, value) -> str:
    """A value of setting `name` as the editor shows it, wherever it comes from (a policy, a node's report: 250.0
    read reads as "250 W"); the editor's field gives the label, choices and unit."""
    field = QoSPolicyForm.base_fields[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value in (None, ""):
        return ""
    if name == "persistence_mode":
        return "On" if value else "Off"
    if isinstance(value, bool):
        return "Yes" if value else "No"
    if getattr(field, "choices", None):
        value = dict(field.choices).get(value, value)
    unit = getattr(field, "unit", "")
    return f"{value} {unit}" if unit else str(value)


def count_by_rule(violations) -> list[dict]:
    counts: dict[str, int] = {}
    for v in violations:
        rule = v["rule"] if isinstance(v, dict) else v.rule
        counts[rule] = counts.get(rule, 0) + 1
    return [{"rule": r, "label": RULE_LABELS.get(r, r), "count": n} for r, n in sorted(counts.items())]


def qos_setting_rows(policy: QoSPolicy) -> list[dict]:
    """The policy's settings per editor section, each with its label and value in its unit ('' when not set)."""
    fields = QoSPolicyForm.base_fields
    return [
        {
            "title": title,
            "help": help_text,
            "rows": [{"name": n, "label": fields[n].label, "value": setting_display(policy, n)} for n in names],
        }
        for title, help_text, names in QoSPolicyForm.SECTIONS
    ]


def qos_rule_summary(policy: QoSPolicy) -> list[str]:
    """The workload rules in a few words, for tables."""
    parts = []
    if policy.required_qos != "any":
        parts.append(policy.get_required_qos_display())
    if policy.required_priority_class:
        parts.append(f"priority {policy.required_priority_class}")
    if policy.max_pods_per_gpu:
        parts.append(f"≤ {policy.max_pods_per_gpu} pods/GPU")
    if policy.exclusive_taint:
        parts.append(f"taint {policy.exclusive_taint}")
    if policy.requires_memory_isolation:
        parts.append("memory isolation")
    return parts


def node_setting_rows(policy, comparison: SettingsComparison | None = None) -> list[dict]:
    """The policy's GPU settings and host tuning as rows of label, value with its unit, and scope; with a comparison
    (agent nodes), beside each what the node runs and whether that matches."""
    checks = {(c.section, c.name): c for c in comparison.checks} if comparison else {}
    rows = []
    for section, settings in policy.node_settings().items():
        for name in settings:
            row = {
                "label": QoSPolicyForm.base_fields[name].label,
                "value": setting_display(policy, name),
                "scope": "GPU" if section == "gpu" else "host",
            }
            if (section, name) in checks:
                row.update(observed_row(checks[section, name]))
            rows.append(row)
    return rows


def observed_row(check: SettingCheck) -> dict:
    """What the node runs for one setting, in words: its value(s), on how many GPUs, and where it comes from."""
    values = [(value_display(check.name, value), count) for value, count in check.observed]
    if check.section == "host" or check.agent_record:
        observed = values[0][0] if values else ""
        detail = ""
        if check.agent_record and values:
            detail = "as the agent set it: NVML cannot read it back"
        elif check.agent_record:
            detail = (
                "the config the agent applied leaves it as it is"
                if check.status == DIFFERS
                else "NVML cannot read it back, and the agent reported no QoS settings applied"
            )
        return {"status": check.status, "observed": observed, "detail": detail}
    if not check.gpus:
        return {"status": check.status, "observed": "", "detail": "no GPUs reported"}
    # Nothing read on any GPU: empty (the row says not reported); one value on every GPU: that value alone.
    parts = values + ([("not reported", check.gpus_unreported)] if values and check.gpus_unreported else [])
    if len(parts) == 1:
        observed = parts[0][0]
    else:
        observed = ", ".join(f"{value} ({count} GPU{pluralize(count)})" for value, count in parts)
    gpus = f"{check.gpus} GPU{pluralize(check.gpus)}"
    if check.gpus == 1:
        detail = ""  # nothing to count on a node with one GPU
    elif check.gpus_differ == check.gpus:
        detail = f"all {gpus} differ"
    elif check.gpus_differ:
        detail = f"{check.gpus_differ} of {gpus} differ{'s' if check.gpus_differ == 1 else ''}"
    elif check.gpus_unreported:
        detail = f"{check.gpus_unreported} of {gpus} not reported"
    else:
        detail = f"all {gpus}"
    return {"status": check.status, "observed": observed, "detail": detail}
