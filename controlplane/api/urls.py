from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from controlplane.access.pages import guarded
from controlplane.api import experiment_views, run_views, sweep_views, views


class OptionalSlashRouter(DefaultRouter):
    """`/api/v1/runs` and `/api/v1/runs/` alike: people and scripts write both."""

    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"


router = OptionalSlashRouter()
router.register("clusters", views.ClusterViewSet, basename="api-cluster")
router.register("robots", views.RobotViewSet, basename="api-robot")
router.register("experiments", experiment_views.ExperimentViewSet, basename="api-experiment")
router.register("runs", run_views.RunViewSet, basename="api-run")
router.register("sweeps", sweep_views.SweepViewSet, basename="api-sweep")

urlpatterns = [
    path("", include(router.urls)),
    path("placement/preview", views.PlacementPreviewView.as_view(), name="placement-preview"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # A page for people: the login page (not a 401) for anonymous visitors.
    # Its start-up script is served from the same URL (?script), not inline: the pages'
    # Content-Security-Policy allows no inline script (controlplane/core/csp.py).
    path(
        "docs/",
        guarded(
            SpectacularSwaggerSplitView.as_view(
                url_name="api-schema", template_name="api/swagger_ui.html"
            )
        ),
        name="api-docs",
    ),
]
