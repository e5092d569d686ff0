"""A plan as text: object by object and field by field, then what it does to the nodes — as the previews say it."""

import json

SIGNS = {"create": "+", "update": "~", "delete": "-"}
DISRUPTION = {
    "none": "no change",
    "device-plugin": "device plugin reconfigures",
    "mig-geometry": "MIG geometry changes",
    "gpu-reset": "GPU reset",
}


def _value(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _moment(change: dict) -> str:
    when = "now" if change["when"] == "now" else f"at the next switch, {change['at']}"
    profile = (change.get("profile") or {}).get("name") or "no profile"
    policy = (change.get("qos_policy") or {}).get("name")
    return f"{when}: {profile}" + (f" with QoS policy {policy}" if policy else "")


def _summary(summary: dict) -> str:
    text = f"{summary['changing']} of {summary['nodes']} node(s) change"
    if summary["resetting"]:
        text += f", {summary['gpus_resetting']} GPU(s) reset on {summary['resetting']} node(s)"
    text += f", {summary['pods_losing']} pod(s) lose their slice"
    return text + (f", {summary['refused']} node(s) refuse it" if summary["refused"] else "")


def _node(node: dict) -> str:
    before, after = node["allocatable_before"], node["allocatable_after"]
    resources = ", ".join(f"{r} {before.get(r, 0)} → {after.get(r, 0)}" for r in sorted(before.keys() | after.keys()))
    text = f"{node['node']['name']}: {DISRUPTION.get(node['disruption'], node['disruption'])}"
    if node["reset_gpus"]:
        text += f" (GPUs {', '.join(map(str, node['reset_gpus']))})"
    if node["errors"]:
        text += f"; refused: {'; '.join(node['errors'])}"
    if resources:
        text += f"; {resources}"
    pods = [f"{p['namespace']}/{p['name']}" for p in node["pods_losing"]]
    return text + (f"; pods losing their slice: {', '.join(pods)}" if pods else "")


def plan_text(plan: dict, *, applied: bool = False) -> str:
    lines = []
    for change in plan["changes"]:
        lines.append(f"{SIGNS[change['action']]} {change['key']}")
        for field in change["fields"]:
            if change["action"] == "create":
                lines.append(f"    {field['field']}: {_value(field['after'])}")
            else:
                lines.append(f"    {field['field']}: {_value(field['before'])} → {_value(field['after'])}")
    if plan["impact"]:
        lines += ["", "Impact on the nodes:"]
    for pool in plan["impact"]:
        lines.append(f"  pool {pool['pool']['cluster']}/{pool['pool']['name']}")
        for change, quota in zip(pool["changes"], pool["quota"], strict=True):
            lines.append(f"    {_moment(change)}: " + (change["refused"] or _summary(change["summary"])))
            lines += [
                f"      {_node(node)}" for node in change["nodes"] if node["disruption"] != "none" or node["errors"]
            ]
            for row in quota:
                lines.append(f"      Kueue quota {row['flavor']} {row['resource']}: {row['before']} → {row['after']}")
    counts = {a: sum(c["action"] == a for c in plan["changes"]) for a in SIGNS}
    if not plan["changes"]:
        lines.append("No changes: the server matches the files.")
    else:
        verb = "Applied" if applied else "Plan"
        lines += [
            "",
            f"{verb}: {counts['create']} to create, {counts['update']} to update, {counts['delete']} to delete.",
        ]
    return "\n".join(lines)
