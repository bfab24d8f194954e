from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from controlplane.access.pages import guarded
from controlplane.api import settings_views
from controlplane.console.views import console_audit, console_index, console_robots
from controlplane.core.views import healthz, home
from controlplane.realtime.publish import RELAY_PATH, relay_is_served
from controlplane.realtime.views import relay

urlpatterns = [
    path("", home, name="home"),
    path("healthz", healthz, name="healthz"),
    path("", include("controlplane.runs.urls")),
    path("", include("controlplane.experiments.urls")),
    path("", include("controlplane.inventory.urls")),
    path("", include("controlplane.sweeps.urls")),
    path("console/", console_index, name="console"),
    path("console/runs/<int:run_id>/", console_robots, name="console-robots"),
    path("console/audit/", console_audit, name="console-audit"),
    path("api/v1/", include("controlplane.api.urls")),
    path("settings/", settings_views.settings_page, name="settings"),
    path("settings/tokens", settings_views.create_token, name="token-create"),
    path(
        "settings/tokens/<int:token_id>/revoke",
        settings_views.revoke_token,
        name="token-revoke",
    ),
    path("login/", guarded(auth_views.LoginView.as_view()), name="login"),
    path("logout/", guarded(auth_views.LogoutView.as_view()), name="logout"),
    path("admin/", admin.site.urls),
]
if relay_is_served():
    # The one-machine mode's in-memory channel layer: other processes publish through
    # the web server. With Redis every process publishes directly; no relay is mounted.
    urlpatterns.append(path(RELAY_PATH.lstrip("/"), relay, name="realtime-relay"))
