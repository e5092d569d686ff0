"""Expose the user's role to templates so navigation and buttons match what the user may do."""

from core.roles import Role, user_role


def roles(request):
    role = user_role(getattr(request, "user", None))
    return {
        "user_role": role,
        "can_operate": role >= Role.OPERATOR,
        "is_admin_role": role >= Role.ADMIN,
    }
