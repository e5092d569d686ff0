"""Role checks for the API: reads need a viewer, writes the role a view declares (admin unless it says less)."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from core.roles import Role, has_role


class RolePermission(BasePermission):
    """Views declare `write_role` (default ADMIN) and may map actions to roles in `action_roles`."""

    message = "Your role does not allow this."

    def has_permission(self, request, view):
        role = self.required_role(request, view)
        return has_role(request.user, role)

    @staticmethod
    def required_role(request, view) -> Role:
        action_roles = getattr(view, "action_roles", {})
        action = getattr(view, "action", None)
        if action in action_roles:
            return action_roles[action]
        if request.method in SAFE_METHODS:
            return Role.VIEWER
        return getattr(view, "write_role", Role.ADMIN)
