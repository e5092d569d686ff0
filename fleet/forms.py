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
        min_value=1, required=False, label="Registrations, at most", help_text="empty: any number until it expires"
    )

    # Service error keys that are not form fields of the same name.
    SERVICE_FIELDS = {"expires_at": "expires_in_hours"}
