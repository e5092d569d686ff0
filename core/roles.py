"""Three roles, ordered: a viewer reads, an operator applies profiles and runs rollouts, an admin does everything."""

from enum import IntEnum


class Role(IntEnum):
    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def group_name(self) -> str:
        return self.name.lower()


ROLE_GROUPS = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


def user_role(user) -> Role:
    """The highest role a user holds; superusers are admins. Cached on the user object per request."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Role.NONE
    cached = getattr(user, "_tessera_role", None)
    if cached is not None:
        return cached
    if user.is_superuser:
        role = Role.ADMIN
    else:
        names = set(user.groups.values_list("name", flat=True))
        role = max((r for r in ROLE_GROUPS if r.group_name in names), default=Role.NONE)
    user._tessera_role = role
    return role


def has_role(user, role: Role) -> bool:
    return user_role(user) >= role


def parse_role_map(text: str) -> dict[str, Role]:
    """`value=role,value=role` (TESSERA_OIDC_ROLE_MAP) as {claim value: Role}; ValueError names a bad entry."""
    mapping = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        value, sep, name = (piece.strip() for piece in entry.rpartition("="))
        role = next((r for r in ROLE_GROUPS if r.group_name == name.lower()), None)
        if not sep or not value or role is None:
            raise ValueError(f"{entry!r} is not `claim value=viewer|operator|admin`")
        mapping[value] = role
    return mapping


def role_for_claim_values(values, role_map: dict[str, Role]) -> Role:
    """The highest role any of the values maps to; Role.NONE when none does."""
    return max((role_map[v] for v in values if isinstance(v, str) and v in role_map), default=Role.NONE)
