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
