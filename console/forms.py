"""Forms of the pages that compose apps: the pool editor, and assigning a profile to a pool under its schedule.
They only parse; scheduling.pools and scheduling.assign judge."""

import re

from django import forms
from django.core.exceptions import ValidationError

from fleet.models import Cluster, Node, NodePool
from scheduling.assign import AssignMode
from scheduling.kueue import MAX_LEAD_MINUTES
from scheduling.models import Schedule
from scheduling.pools import KEEP, NO_SCHEDULE, PoolSettings
from sharing.forms import AssignForm
from sharing.models import QoSPolicy, SharingProfile

COPY = "copy:"
MEMBERS_MAX = 10_000


class PoolForm(forms.Form):
    """Create or edit a pool; `settings()` gives scheduling.pools.PoolSettings."""

    name = forms.CharField(max_length=100, widget=forms.TextInput(attrs={"spellcheck": "false"}))
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.order_by("name"), empty_label="Choose a cluster…", help_text="fixed once created"
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    node_selector = forms.CharField(
        max_length=500,
        required=False,
        label="Label selector",
        help_text="e.g. tessera.io/pool=inference, or nvidia.com/gpu.product in (A100, H100); empty: members below",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off", "class": "mono"}),
    )
    members = forms.CharField(
        required=False,
        label="Explicit members",
        help_text="node names, separated by commas or new lines; only without a selector",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono"}),
    )
    profile = forms.ModelChoiceField(
        queryset=SharingProfile.objects.order_by("name"),
        required=False,
        label="Default profile",
        empty_label="No default profile",
        help_text="what the nodes run when no pin or schedule window says otherwise",
    )
    qos_policy = forms.ModelChoiceField(
        queryset=QoSPolicy.objects.order_by("name"), required=False, label="QoS policy", empty_label="No QoS policy"
    )
    schedule = forms.ChoiceField(label="Schedule", required=False)

    def __init__(self, *args, pool: NodePool | None = None, **kwargs):
        self.pool = pool
        if pool is not None:
            sharing = getattr(pool, "sharing", None)
            kwargs.setdefault(
                "initial",
                {
                    "name": pool.name,
                    "cluster": pool.cluster_id,
                    "description": pool.description,
                    "node_selector": pool.node_selector,
                    "members": ""
                    if pool.node_selector
                    else "\n".join(pool.nodes.live().values_list("name", flat=True)),
                    "profile": sharing.profile_id if sharing else None,
                    "qos_policy": sharing.qos_policy_id if sharing else None,
                    "schedule": KEEP,
                },
            )
        super().__init__(*args, **kwargs)
        if pool is not None:
            self.fields["cluster"].disabled = True
        current = Schedule.objects.filter(pool=pool).first() if pool is not None else None
        choices = [(KEEP, f"Keep {current.name}")] if current else [(KEEP, "No schedule")]
        if current:
            choices.append((NO_SCHEDULE, f"Remove {current.name} (the pool follows its default)"))
        others = Schedule.objects.select_related("pool").order_by("name")
        if pool is not None:
            others = others.exclude(pool=pool)
        choices += [(f"{COPY}{s.pk}", f"A copy of {s.name} (of pool {s.pool.name})") for s in others]
        self.fields["schedule"].choices = choices
        self.fields["schedule"].help_text = (
            "a copy is this pool's own, edited on the schedules page" if len(choices) > 1 else "none to copy yet"
        )

    def clean_members(self):
        names = [n for n in re.split(r"[\s,]+", self.cleaned_data["members"]) if n]
        if len(names) > MEMBERS_MAX:
            raise ValidationError(f"At most {MEMBERS_MAX} nodes.")
        return list(dict.fromkeys(names))

    def clean_schedule(self):
        value = self.cleaned_data["schedule"] or KEEP
        if value.startswith(COPY):
            return Schedule.objects.filter(pk=value[len(COPY) :]).prefetch_related("exceptions").first() or KEEP
        return value

    def clean(self):
        data = super().clean()
        names, cluster = data.get("members") or [], data.get("cluster")
        if names and data.get("node_selector"):
            self.add_error("members", "A pool selects its members by label or lists them, not both: empty one.")
        elif names and cluster is not None:
            nodes = list(Node.objects.live().filter(cluster=cluster, name__in=names))
            unknown = sorted(set(names) - {n.name for n in nodes})
            if unknown:
                more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
                self.add_error("members", f"No live node of {cluster.name} named {', '.join(unknown[:5])}{more}.")
            data["member_nodes"] = tuple(nodes)
        return data

    def settings(self) -> PoolSettings:
        data = self.cleaned_data
        explicit = not data["node_selector"]
        return PoolSettings(
            name=data["name"],
            description=data["description"],
            node_selector=data["node_selector"].strip(),
            members=data.get("member_nodes", ()) if explicit else None,
            profile=data["profile"],
            qos_policy=data["qos_policy"],
            schedule=data["schedule"],
        )


class ScheduledAssignForm(AssignForm):
    """The preview's confirm form, with what to do when the pool's schedule sets its profile now (AssignMode)."""

    mode = forms.ChoiceField(
        choices=AssignMode.choices, initial=AssignMode.DEFAULT, widget=forms.RadioSelect, required=False
    )

    def clean_mode(self):
        return self.cleaned_data["mode"] or AssignMode.DEFAULT


class KueueBindingForm(forms.Form):
    """A pool's Kueue binding; scheduling.kueue.kueue_binding_set judges the names."""

    cluster_queues = forms.CharField(
        label="ClusterQueues",
        max_length=4000,
        help_text="names, separated by commas or spaces; Tessera sets the quota of its flavors there, nothing else",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off", "class": "mono"}),
    )
    lead_minutes = forms.IntegerField(
        label="Lead time (minutes)",
        min_value=0,
        max_value=MAX_LEAD_MINUTES,
        initial=15,
        help_text="how long before a scheduled change the quota of resources that vanish is lowered to what is in use",
    )
    enabled = forms.BooleanField(
        label="Keep the quota in step", required=False, initial=True, help_text="off: what was written stays"
    )

    def queue_names(self) -> list[str]:
        return [name for name in re.split(r"[\s,]+", self.cleaned_data["cluster_queues"]) if name]
