"""Django's admin app with the project's admin site (access/admin_site.py) as
`admin.site`: settings.INSTALLED_APPS names this config in place of
"django.contrib.admin". Kept apart from the site, whose module imports models, which an
app config listed in INSTALLED_APPS may not."""

from django.contrib.admin.apps import AdminConfig


class AdminSiteConfig(AdminConfig):
    default_site = "controlplane.access.admin_site.RoleCheckedAdminSite"
