"""Forms of the sharing pages: the profile editor (admin notation for MIG layouts), preview scope, assign and pin,
the QoS policy editor and attaching a policy to a pool.

They only read input into the shapes the services take; NVIDIA's rules are judged by `validate_spec` and the
services, whose messages the views put back beside the fields.
"""

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.forms import formset_factory

from fleet.choices import SharingMode
from fleet.models import Gpu, Node, NodePool
from sharing.choices import (
    BusyPolicy,
    ComputeMode,
    CpuGovernor,
    CpuManagerPolicy,
    FailurePolicy,
    MigStrategy,
    RequiredQoS,
    TimeSliceInterval,
    TopologyManagerPolicy,
    TransparentHugePages,
)
from sharing.mig import PRODUCTS, format_layout, parse_layout
from sharing.models import QoSPolicy, SharingProfile
from sharing.spec import ALL_GPUS, ProfileSpec, catalog_product

MIG_OFF_WORDS = ("off", "disabled", "all-disabled", "none")
# Which parameters each mode uses; the others are reset to their defaults, so a field hidden in the editor
# (but still submitted) never sneaks into a profile of another mode.
MODE_FIELDS = {
    "passthrough": (),
    "mig": ("mig_strategy", "replicas", "rename_shared", "fail_requests_greater_than_one"),
    "mps": (
        "replicas",
        "mps_active_thread_percentage",
        "mps_pinned_memory_limit_mib",
        "rename_shared",
        "fail_requests_greater_than_one",
    ),
    "time_slicing": ("replicas", "rename_shared", "fail_requests_greater_than_one", "time_slice_interval"),
}
PARAMETER_DEFAULTS = {
    "mig_strategy": MigStrategy.MIXED,
    "replicas": 1,
    "mps_active_thread_percentage": None,
    "mps_pinned_memory_limit_mib": None,
    "rename_shared": False,
    "fail_requests_greater_than_one": False,
    "time_slice_interval": TimeSliceInterval.DEFAULT,
}


def layout_text(layout) -> str:
    """A stored layout in the admin notation: "1g.10gb ×7", "off" for MIG disabled."""
    return "off" if layout is None else format_layout(layout)


def read_layout(text: str):
    """The admin notation into {profile: count}; "off" is None (MIG disabled); "" is no entry (returns ...)."""
    text = (text or "").strip()
    if not text:
        return ...
    if text.lower() in MIG_OFF_WORDS:
        return None
    try:
        return parse_layout(text)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


def product_choices():
    """Every product of the MIG catalog, labelled as an admin knows it (name, memory, MIG or not), then the models
    the fleet reports that the catalog does not list: they can still be passed through, time-sliced or shared
    with MPS."""
    choices = []
    for name, product in PRODUCTS.items():
        memory = f"{round(product.memory_mib / 1024)} GiB"
        choices.append((name, f"{product.display_name} · {memory}{'' if product.mig_capable else ' · no MIG'}"))
    seen = Gpu.objects.live().order_by().values_list("product", flat=True).distinct()
    for name in sorted({name for name in seen if catalog_product(name) is None}):
        choices.append((name, f"{name} · not in the MIG catalog (no MIG)"))
    return choices


class GpuLayoutForm(forms.Form):
    """One per-GPU override row: a GPU index and its layout."""

    index = forms.IntegerField(min_value=0, max_value=63, required=False, label="GPU index")
    layout = forms.CharField(required=False, max_length=200, label="Layout")

    def clean(self):
        data = super().clean()
        if data.get("layout", "").strip() and data.get("index") is None:
            self.add_error("index", "Give the GPU index this layout is for.")
        if data.get("layout") is not None:
            try:
                data["parsed"] = read_layout(data["layout"])
            except ValidationError as exc:
                self.add_error("layout", exc)
        return data


GpuLayoutFormSet = formset_factory(GpuLayoutForm, extra=2, max_num=64)


class ProfileForm(forms.Form):
    """The profile editor; `values()` gives the keyword arguments of profile_create / profile_update."""

    name = forms.CharField(max_length=100)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    mode = forms.ChoiceField(choices=SharingMode.choices, widget=forms.RadioSelect, initial=SharingMode.MIG)
    target_products = forms.MultipleChoiceField(
        choices=product_choices, widget=forms.CheckboxSelectMultiple, required=False, label="Target GPU products"
    )
    mig_layout_all = forms.CharField(
        required=False,
        max_length=200,
        label="Layout of every GPU",
        help_text='e.g. "1g.10gb x7", "3g.40gb x2 + 1g.10gb x1", or "off" for MIG disabled',
    )
    mig_strategy = forms.ChoiceField(
        choices=MigStrategy.choices,
        initial=MigStrategy.MIXED,
        label="MIG strategy",
        help_text="Where a cluster's ClusterPolicy sets spec.mig.strategy, the GPU Operator runs the device plugin "
        "with that strategy instead; this one applies where it sets none.",
    )
    replicas = forms.IntegerField(
        required=False, initial=1, label="Replicas per GPU", help_text="Time-slicing or MPS clients per GPU"
    )
    mps_active_thread_percentage = forms.IntegerField(required=False, label="Active thread percentage (%)")
    mps_pinned_memory_limit_mib = forms.IntegerField(required=False, label="Pinned memory limit (MiB)")
    rename_shared = forms.BooleanField(required=False, label="Rename the resource to …gpu.shared")
    fail_requests_greater_than_one = forms.BooleanField(
        required=False,
        label="Fail requests for more than 1 replica",
        help_text="Under MPS, device plugin v0.20.0 and later honour it either way; older versions refuse requests "
        "for more than one replica whatever it says.",
    )
    time_slice_interval = forms.ChoiceField(
        choices=TimeSliceInterval.choices, initial=TimeSliceInterval.DEFAULT, label="Time-slice length"
    )

    # Service error keys that are not form fields of the same name.
    SERVICE_FIELDS = {
        "mig_layouts.all": "mig_layout_all",
        "mig_layouts": "mig_layout_all",
        "non_field_errors": "__all__",
    }

    def __init__(self, *args, profile: SharingProfile | None = None, **kwargs):
        if profile is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = self.initial_from(profile)
        super().__init__(*args, **kwargs)
        data = args[0] if args else kwargs.get("data")
        initial_rows = []
        if profile is not None:
            initial_rows = [
                {"index": int(key), "layout": layout_text(layout)}
                for key, layout in sorted(profile.mig_layouts.items(), key=lambda kv: kv[0].zfill(3))
                if key != ALL_GPUS
            ]
        self.gpu_rows = GpuLayoutFormSet(data, initial=initial_rows or None, prefix="gpu")

    @staticmethod
    def initial_from(profile: SharingProfile) -> dict:
        initial = {
            field: getattr(profile, field)
            for field in ("name", "description", "mode", "target_products", *PARAMETER_DEFAULTS)
        }
        if ALL_GPUS in profile.mig_layouts:
            initial["mig_layout_all"] = layout_text(profile.mig_layouts[ALL_GPUS])
        return initial

    def clean_mig_layout_all(self):
        return read_layout(self.cleaned_data["mig_layout_all"])

    def is_valid(self):
        rows_valid = self.gpu_rows.is_valid()
        return super().is_valid() and rows_valid

    @property
    def chosen_mode(self) -> str:
        return self.cleaned_data.get("mode") or self.data.get("mode") or SharingMode.MIG

    def mig_layouts(self) -> dict:
        """{"all" or index: layout or None} from the fields that parsed."""
        if self.chosen_mode != SharingMode.MIG:
            return {}
        layouts = {}
        whole = self.cleaned_data.get("mig_layout_all", ...)
        if whole is not ...:
            layouts[ALL_GPUS] = whole
        for row in self.gpu_rows.forms:
            data = getattr(row, "cleaned_data", {})
            if data.get("index") is not None and data.get("parsed", ...) is not ...:
                layouts[str(data["index"])] = data["parsed"]
        return layouts

    def parameters(self) -> dict:
        """The mode's parameters from what parsed, the others at their defaults."""
        used = MODE_FIELDS.get(self.chosen_mode, ())
        values = {}
        for field, default in PARAMETER_DEFAULTS.items():
            value = self.cleaned_data.get(field) if field in used else None
            values[field] = default if value in (None, "") else value
        return values

    def values(self) -> dict:
        """Keyword arguments for profile_create / profile_update (call after is_valid)."""
        return {
            "name": self.cleaned_data["name"],
            "description": self.cleaned_data.get("description", ""),
            "mode": self.chosen_mode,
            "target_products": list(self.cleaned_data.get("target_products") or []),
            "mig_layouts": self.mig_layouts(),
            **self.parameters(),
        }

    def spec(self) -> ProfileSpec:
        """The profile as far as the input parsed, for live validation while the admin types."""
        return ProfileSpec(
            mode=self.chosen_mode,
            target_products=tuple(self.cleaned_data.get("target_products") or ()),
            mig_layouts=self.mig_layouts(),
            **self.parameters(),
        )

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        """Put messages keyed like validate_spec's ("mig_layouts.3") beside the matching field or row."""
        rows = {}
        for row in self.gpu_rows.forms:
            index = getattr(row, "cleaned_data", {}).get("index")
            if index is not None:
                rows[str(index)] = row
        for key, messages in errors.items():
            if key.startswith("mig_layouts.") and key.split(".", 1)[1] in rows:
                for message in messages:
                    rows[key.split(".", 1)[1]].add_error("layout", message)
                continue
            name = self.SERVICE_FIELDS.get(key, key)
            target = name if name in self.fields else None
            for message in messages:
                self.add_error(target, message)

    def field_errors(self, *, live: bool = False) -> dict[str, list[str]]:
        """Messages per slot of the editor ("mig_layout_all", "gpu-0-layout", "__all__"); live leaves out
        "required" complaints about fields the admin has not reached yet."""

        def messages(form, name):
            if name not in form.errors:
                return []
            return [
                message
                for error in form.errors.as_data()[name]
                if not (live and error.code == "required")
                for message in error.messages
            ]

        slots = {name: messages(self, name) for name in [*self.fields, "__all__"]}
        for i, row in enumerate(self.gpu_rows.forms):
            for name in row.fields:
                slots[f"gpu-{i}-{name}"] = messages(row, name)
        return slots


class PreviewScopeForm(forms.Form):
    """Which nodes a preview covers: a pool (`?pool=3`) or nodes (`?nodes=1,2` or repeated `nodes`)."""

    pool = forms.ModelChoiceField(queryset=NodePool.objects.select_related("cluster"), required=False)
    nodes = forms.CharField(required=False)

    def __init__(self, data=None, **kwargs):
        if data is not None:
            data = data.copy()
            data["nodes"] = ",".join(data.getlist("nodes")) if hasattr(data, "getlist") else data.get("nodes", "")
        super().__init__(data, **kwargs)

    def clean_nodes(self):
        text = self.cleaned_data["nodes"]
        parts = [p for p in text.replace(" ", ",").split(",") if p]
        if not all(p.isdigit() for p in parts):
            raise ValidationError("Give node ids separated by commas, e.g. 1,2.")
        ids = sorted({int(p) for p in parts})
        if ids and Node.objects.filter(pk__in=ids).count() != len(ids):
            raise ValidationError("Some of these nodes do not exist.")
        return ids

    def clean(self):
        data = super().clean()
        if bool(data.get("pool")) == bool(data.get("nodes")):
            raise ValidationError("Preview on a pool or on chosen nodes: give one of the two.")
        return data

    def nodes_queryset(self):
        if self.cleaned_data.get("pool"):
            return self.cleaned_data["pool"].nodes.live()
        return Node.objects.filter(pk__in=self.cleaned_data["nodes"])


def _rollout_default(name):
    return settings.TESSERA["ROLLOUT_DEFAULTS"][name]


class RolloutStrategyForm(forms.Form):
    """How an operator's rollout proceeds (rollout_start's strategy arguments)."""

    batch_size = forms.IntegerField(
        min_value=1, initial=lambda: _rollout_default("batch_size"), label="Batch size", help_text="nodes at once"
    )
    canary_count = forms.IntegerField(
        min_value=0, initial=lambda: _rollout_default("canary_count"), label="Canary nodes", help_text="first, alone"
    )
    max_failures = forms.IntegerField(
        min_value=1, initial=lambda: _rollout_default("max_failures"), label="Stop after failures", help_text="nodes"
    )
    on_failure = forms.ChoiceField(
        choices=FailurePolicy.choices,
        initial=lambda: _rollout_default("on_failure"),
        required=False,
        label="On a failed canary",
    )
    busy_policy = forms.ChoiceField(
        choices=BusyPolicy.choices, initial=lambda: _rollout_default("busy_policy"), label="Busy GPUs"
    )
    wait_minutes = forms.IntegerField(
        min_value=0, initial=lambda: _rollout_default("wait_minutes"), label="Wait up to", help_text="minutes"
    )

    def clean_on_failure(self):
        """Left out (a form posted before the field existed): the loop's default."""
        return self.cleaned_data.get("on_failure") or _rollout_default("on_failure")

    def strategy(self) -> dict:
        return {name: self.cleaned_data[name] for name in self.fields if name in self.cleaned_data}


class AssignForm(RolloutStrategyForm):
    """Confirm on the preview page: make the profile the pool's default, and optionally roll it out now."""

    pool = forms.ModelChoiceField(queryset=NodePool.objects.select_related("cluster"), widget=forms.HiddenInput)
    rollout_now = forms.BooleanField(required=False, label="and roll out now")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.data.get("rollout_now"):
            for name in RolloutStrategyForm.base_fields:
                self.fields[name].required = False

    def strategy(self) -> dict:
        return {name: self.cleaned_data[name] for name in RolloutStrategyForm.base_fields}


class PinForm(forms.Form):
    """Confirm on a node preview: pin these nodes to the profile."""

    nodes = forms.ModelMultipleChoiceField(queryset=Node.objects.all(), widget=forms.MultipleHiddenInput)
    reason = forms.CharField(max_length=300, required=False, label="Reason", help_text="shown on the node page")


class NodePinForm(forms.Form):
    """On a node page: pin it to a profile (after a preview, or at once)."""

    profile = forms.ModelChoiceField(queryset=SharingProfile.objects.all(), label="Profile", empty_label="Choose…")
    reason = forms.CharField(max_length=300, required=False, label="Reason")


# --- QoS policies ----------------------------------------------------------------------------------------------------

LEAVE_AS_IS = ("", "Leave as is")


def _choices(enum, blank=LEAVE_AS_IS):
    return [blank, *enum.choices]


def _number(label, *, unit="", help_text="", **kwargs):
    field = forms.IntegerField(required=False, label=label, help_text=help_text, min_value=0, **kwargs)
    field.unit = unit
    return field


class QoSPolicyForm(forms.Form):
    """The QoS policy editor; `values()` gives the keyword arguments of qos_policy_create / qos_policy_update.

    Only parses: the model's rules, the taint syntax and the clock bounds are judged by `qos_policy_check`, whose
    messages the views put beside the fields (`unit` on a field is shown after its input)."""

    name = forms.CharField(max_length=100)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    # Workload rules
    required_qos = forms.ChoiceField(
        choices=RequiredQoS.choices,
        initial=RequiredQoS.ANY,
        label="Pod QoS class",
        help_text="Kubernetes' class from CPU and memory requests/limits",
    )
    required_priority_class = forms.CharField(
        required=False, max_length=253, label="Priority class", help_text="empty: any priority class"
    )
    max_pods_per_gpu = _number(
        "Pods per GPU, at most", unit="pods", help_text="time-slicing or MPS replicas of one physical GPU"
    )
    exclusive_taint = forms.CharField(
        required=False,
        max_length=300,
        label="Exclusive taint",
        help_text="key=value:NoSchedule; every pod must tolerate it",
        widget=forms.TextInput(attrs={"placeholder": "tessera.io/pool=inference:NoSchedule", "spellcheck": "false"}),
    )
    requires_memory_isolation = forms.BooleanField(required=False, label="Require memory isolation (MIG or whole GPUs)")
    enforce_admission = forms.BooleanField(
        required=False, label="Enforce QoS and priority at admission (ValidatingAdmissionPolicy)"
    )
    # GPU settings
    persistence_mode = forms.TypedChoiceField(
        choices=[LEAVE_AS_IS, ("on", "On"), ("off", "Off")],
        coerce=lambda value: value == "on",
        empty_value=None,
        required=False,
        label="Persistence mode",
    )
    compute_mode = forms.ChoiceField(choices=_choices(ComputeMode), required=False, label="Compute mode")
    time_slice_interval = forms.ChoiceField(
        choices=_choices(TimeSliceInterval), required=False, label="Time-slice length", help_text="whole GPUs only"
    )
    mps_active_thread_percentage = _number("MPS active threads", unit="%", help_text="1–100, MPS only", max_value=100)
    mps_pinned_memory_limit_mib = _number("MPS pinned memory limit", unit="MiB", help_text="per GPU, MPS only")
    gpu_clock_min_mhz = _number("Locked GPU clock, min", unit="MHz", help_text="give both bounds, or neither")
    gpu_clock_max_mhz = _number("Locked GPU clock, max", unit="MHz")
    power_limit_w = _number("Power limit", unit="W", help_text="per GPU, within the board's range")
    # Host tuning
    transparent_hugepages = forms.ChoiceField(
        choices=_choices(TransparentHugePages), required=False, label="Transparent huge pages"
    )
    swappiness = _number("vm.swappiness", help_text="0–200", max_value=200)
    cpu_governor = forms.ChoiceField(choices=_choices(CpuGovernor), required=False, label="CPU frequency governor")
    dirty_ratio = _number("vm.dirty_ratio", unit="%", help_text="of memory", max_value=100)
    dirty_background_ratio = _number("vm.dirty_background_ratio", unit="%", help_text="of memory", max_value=100)
    # Kubelet expectations
    topology_manager_policy = forms.ChoiceField(
        choices=_choices(TopologyManagerPolicy, ("", "No expectation")), required=False, label="Topology manager policy"
    )
    cpu_manager_policy = forms.ChoiceField(
        choices=_choices(CpuManagerPolicy, ("", "No expectation")), required=False, label="CPU manager policy"
    )

    SECTIONS = (
        (
            "Workload rules",
            "Checked against the pods Tessera observes on the pool's nodes; the compliance page lists who breaks them.",
            (
                "required_qos",
                "required_priority_class",
                "max_pods_per_gpu",
                "exclusive_taint",
                "requires_memory_isolation",
                "enforce_admission",
            ),
        ),
        (
            "GPU settings",
            "Applied to every GPU of the pool's nodes by the Tessera agent; empty fields are left as they are.",
            (
                "persistence_mode",
                "compute_mode",
                "time_slice_interval",
                "mps_active_thread_percentage",
                "mps_pinned_memory_limit_mib",
                "gpu_clock_min_mhz",
                "gpu_clock_max_mhz",
                "power_limit_w",
            ),
        ),
        (
            "Host tuning",
            "Written to /sys and /proc by the Tessera agent; empty fields are left as they are.",
            ("transparent_hugepages", "swappiness", "cpu_governor", "dirty_ratio", "dirty_background_ratio"),
        ),
        (
            "Kubelet expectations",
            "Compared with what each node's kubelet runs (read from its configz, never changed).",
            ("topology_manager_policy", "cpu_manager_policy"),
        ),
    )
    # Service error keys that are not form fields of the same name.
    SERVICE_FIELDS = {"non_field_errors": "__all__", "qos_policy": "__all__"}

    def __init__(self, *args, policy: QoSPolicy | None = None, **kwargs):
        if policy is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = self.initial_from(policy)
        super().__init__(*args, **kwargs)

    @staticmethod
    def initial_from(policy: QoSPolicy) -> dict:
        initial = {name: getattr(policy, name) for name in QoSPolicyForm.base_fields}
        if policy.persistence_mode is not None:
            initial["persistence_mode"] = "on" if policy.persistence_mode else "off"
        return initial

    WIDE_FIELDS = ("exclusive_taint",)

    def sections(self):
        """(title, help, [(bound field, is a checkbox, spans two columns)]) for the editor's fieldsets."""
        for title, help_text, names in self.SECTIONS:
            fields = [
                (self[name], isinstance(self.fields[name], forms.BooleanField), name in self.WIDE_FIELDS)
                for name in names
            ]
            yield title, help_text, fields

    def values(self) -> dict:
        """Keyword arguments for qos_policy_create / qos_policy_update, from the fields that parsed."""
        data = getattr(self, "cleaned_data", {})
        values = {}
        for name, field in self.fields.items():
            if name not in data:
                continue
            value = data[name]
            if isinstance(field, forms.IntegerField | forms.TypedChoiceField):
                value = None if value in (None, "") else value
            values[name] = value
        return values

    def policy(self, instance: QoSPolicy | None = None) -> QoSPolicy:
        """An unsaved QoSPolicy with what parsed (the edited one's id, so its own name is not a duplicate)."""
        policy = QoSPolicy(**self.values())
        if instance is not None:
            policy.pk, policy._state.adding = instance.pk, False
        return policy

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        """Put the service's messages beside their fields; a field that failed to parse keeps its own message."""
        for key, messages in errors.items():
            name = self.SERVICE_FIELDS.get(key, key)
            target = name if name in self.fields else None
            if target is not None and target in self.errors:
                continue
            for message in messages:
                self.add_error(target, message)

    def field_errors(self, *, live: bool = False) -> dict[str, list[str]]:
        """Messages per field ("__all__" for the policy as a whole); live leaves out "required" complaints."""

        def messages(name):
            if name not in self.errors:
                return []
            return [
                message
                for error in self.errors.as_data()[name]
                if not (live and error.code == "required")
                for message in error.messages
            ]

        return {name: messages(name) for name in [*self.fields, "__all__"]}


class QoSCheckPoolForm(forms.Form):
    """The editor's pool picker: which pool the impact panel measures the policy against."""

    check_pool = forms.ModelChoiceField(
        queryset=NodePool.objects.select_related("cluster").order_by("cluster__name", "name"),
        required=False,
        label="Measure against pool",
        empty_label="Choose a pool…",
        widget=forms.Select(attrs={"form": "qos-form"}),  # the select sits beside the editor, not inside it
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["check_pool"].label_from_instance = lambda pool: f"{pool.cluster.name} / {pool.name}"


class QoSAttachForm(forms.Form):
    """On a policy page: make it a pool's default QoS policy (or take it off the pool)."""

    pool = forms.ModelChoiceField(
        queryset=NodePool.objects.select_related("cluster").order_by("cluster__name", "name"),
        label="Pool",
        empty_label="Choose a pool…",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["pool"].label_from_instance = lambda pool: f"{pool.cluster.name} / {pool.name}"
