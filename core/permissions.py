"""Role checks for the API: reads need a viewer, writes the role a view declares (admin unless it says less)."""

from django.conf import settings
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


class ApiDocsPermission(BasePermission):
    """The OpenAPI schema and its docs: a viewer's, like every read, unless TESSERA["API_DOCS_PUBLIC"] opens them."""

    message = "The API docs need a signed-in user with a role (or TESSERA_API_DOCS_PUBLIC)."

    def has_permission(self, request, view):
        return settings.TESSERA["API_DOCS_PUBLIC"] or has_role(request.user, Role.VIEWER)
