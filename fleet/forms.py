"""Forms of the fleet pages: agent join tokens. They read input into the shapes fleet/agent_credentials.py takes."""

from django import forms

from fleet.choices import ClusterDriver
from fleet.models import Cluster

JOIN_TOKEN_HOURS = 24
JOIN_TOKEN_MAX_HOURS = 24 * 365


class AgentJoinTokenForm(forms.Form):
    """Create a join token for the agents of one cluster (admins)."""

    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.filter(driver=ClusterDriver.AGENT).order_by("name"),
        label="Cluster",
        empty_label="Choose an agent cluster…",
        help_text="clusters driven by Tessera's node agent",
    )
    name = forms.CharField(
        max_length=100,
        label="Name",
        help_text="what it is for, e.g. the DaemonSet or rack",
        widget=forms.TextInput(attrs={"placeholder": "rack-b12 DaemonSet"}),
    )
    expires_in_hours = forms.IntegerField(
        min_value=1,
        max_value=JOIN_TOKEN_MAX_HOURS,
        initial=JOIN_TOKEN_HOURS,
        label="Expires after",
        help_text="at most a year",
    )
    expires_in_hours.unit = "hours"  # shown after the input (core/_field_unit.html)
    max_uses = forms.IntegerField(
        min_value=1,
        required=False,
        label="Registrations, at most",
        help_text="new nodes; 1: single-use; empty: any number until it expires",
    )
    node_name_pattern = forms.CharField(
        max_length=253,
        required=False,
        label="Node names",
        help_text="pattern with * and ?, e.g. rack-b12-*; empty: any",
        widget=forms.TextInput(attrs={"placeholder": "rack-b12-*", "spellcheck": "false"}),
    )
    service_account = forms.CharField(
        max_length=317,
        required=False,
        label="Kubernetes service account",
        help_text="namespace:name: agents also present its token, reviewed by the cluster, and register as their "
        "pod's node (the DaemonSet in deploy/); empty: no review",
        widget=forms.TextInput(attrs={"placeholder": "tessera-system:tessera-agent", "spellcheck": "false"}),
    )

    # Service error keys that are not form fields of the same name.
    SERVICE_FIELDS = {"expires_at": "expires_in_hours"}
