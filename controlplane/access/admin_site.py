"""Django's admin site behind the access table.

Django lets any active staff user into its admin site and then asks only its model
permissions, so a staff user given `inventory.change_*` or `auth.change_user` could
write a node's env vars (a shell on every node) or make themselves a superuser without
the project's admin role. Here every page of the site first asks the table's rule for
the `admin:*` door (doors.ADMIN_SITE: the admin role and staff status); Django's model
permissions then decide what the user may do there. Refused users go to the site's
login page, which says they may not use it. `AdminSiteConfig` (access/admin_app.py)
makes this site `django.contrib.admin.site`, where every app registers its models.
"""

from django.contrib import admin
from django.http import HttpRequest

from controlplane.access.doors import verdict
from controlplane.access.pages import door_of


class RoleCheckedAdminSite(admin.AdminSite):
    def has_permission(self, request: HttpRequest) -> bool:
        return verdict(request.user, door_of(request), request.method).allowed
