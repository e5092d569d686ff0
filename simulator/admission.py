"""ValidatingAdmissionPolicy and its binding as the API server stores them: the defaults it fills in and the
validation errors (422) it gives for objects it would refuse. Nothing is evaluated: the simulator creates no pods.
"""

from __future__ import annotations

import re

from simulator.errors import ApiError
from simulator.resources import ADMISSION_GROUP

_FAILURE_POLICIES = ("Fail", "Ignore")
_OPERATIONS = ("*", "CREATE", "UPDATE", "DELETE", "CONNECT")
_REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")
_ACTIONS = ("Deny", "Warn", "Audit")
_CEL_IDENTIFIER = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")


def _refuse(plural: str, obj: dict, problems: list[str]) -> None:
    """422 as the real server words it: one problem as is, several as a bracketed list."""
    if problems:
        message = problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]"
        raise ApiError.invalid(plural, obj.get("metadata", {}).get("name", ""), message, ADMISSION_GROUP)


def _default_match_resources(match: dict) -> None:
    """SetDefaults_MatchResources and SetDefaults_NamedRuleWithOperations of admissionregistration/v1."""
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for rules in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(rules) or []:
            rule.setdefault("scope", "*")


def _check_rules(match: dict, where: str, problems: list[str]) -> None:
    if match.get("matchPolicy") not in ("Exact", "Equivalent"):
        problems.append(f'{where}.matchPolicy: Unsupported value: "{match.get("matchPolicy")}"')
    for index, rule in enumerate(match.get("resourceRules") or []):
        for operation in rule.get("operations") or []:
            if operation not in _OPERATIONS:
                problems.append(f'{where}.resourceRules[{index}].operations: Unsupported value: "{operation}"')
        if not rule.get("resources"):
            problems.append(f"{where}.resourceRules[{index}].resources: Required value")


def normalize_policy(old: dict | None, new: dict) -> None:
    """Defaults, then the checks of ValidateValidatingAdmissionPolicy this simulator can make without CEL."""
    spec = new.setdefault("spec", {})
    spec.setdefault("failurePolicy", "Fail")
    problems = []
    if spec["failurePolicy"] not in _FAILURE_POLICIES:
        problems.append(f'spec.failurePolicy: Unsupported value: "{spec["failurePolicy"]}"')
    match = spec.get("matchConstraints")
    if not isinstance(match, dict) or not match.get("resourceRules"):
        problems.append("spec.matchConstraints.resourceRules: Required value")
    else:
        _default_match_resources(match)
        _check_rules(match, "spec.matchConstraints", problems)
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        problems.append(
            "spec.validations: Required value: validations or auditAnnotations must contain at least one item"
        )
    names = set()
    for index, variable in enumerate(spec.get("variables") or []):
        name = variable.get("name", "")
        if not _CEL_IDENTIFIER.match(name):
            problems.append(f'spec.variables[{index}].name: Invalid value: "{name}": not a valid CEL identifier')
        elif name in names:
            problems.append(f'spec.variables[{index}].name: Duplicate value: "{name}"')
        names.add(name)
        if not variable.get("expression"):
            problems.append(f"spec.variables[{index}].expression: Required value")
    for index, validation in enumerate(spec.get("validations") or []):
        if not validation.get("expression"):
            problems.append(f"spec.validations[{index}].expression: Required value")
        if "\n" in validation.get("message", ""):
            problems.append(f"spec.validations[{index}].message: Invalid value: message must not contain line breaks")
        if validation.get("reason", "Invalid") not in _REASONS:
            problems.append(f'spec.validations[{index}].reason: Unsupported value: "{validation["reason"]}"')
    _refuse("validatingadmissionpolicies", new, problems)


def normalize_binding(old: dict | None, new: dict) -> None:
    """Defaults and the checks of ValidateValidatingAdmissionPolicyBinding (the policy need not exist yet)."""
    spec = new.setdefault("spec", {})
    problems = []
    if not spec.get("policyName"):
        problems.append("spec.policyName: Required value")
    actions = spec.get("validationActions") or []
    if not actions:
        problems.append("spec.validationActions: Required value: at least one validation action is required")
    for action in actions:
        if action not in _ACTIONS:
            problems.append(f'spec.validationActions: Unsupported value: "{action}"')
    if len(set(actions)) != len(actions):
        problems.append("spec.validationActions: Duplicate value")
    if "Deny" in actions and "Warn" in actions:
        problems.append("spec.validationActions: Invalid value: Deny and Warn may not be used together")
    if isinstance(spec.get("matchResources"), dict):
        _default_match_resources(spec["matchResources"])
        _check_rules(spec["matchResources"], "spec.matchResources", problems)
    _refuse("validatingadmissionpolicybindings", new, problems)
