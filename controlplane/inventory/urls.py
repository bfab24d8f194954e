from django.urls import path

from controlplane.inventory import views

urlpatterns = [
    path("cluster/", views.cluster_list, name="cluster-list"),
    path("cluster/validate/", views.cluster_validate, name="cluster-validate"),
    path("cluster/<slug:name>/", views.cluster_detail, name="cluster-detail"),
    path("cluster/<slug:name>/live/", views.cluster_live, name="cluster-live"),
    path("cluster/<slug:name>/edit/", views.cluster_edit, name="cluster-edit"),
    path("cluster/<slug:name>/export.yaml", views.cluster_export, name="cluster-export"),
    path("cluster/<slug:name>/placement/", views.placement_page, name="cluster-placement"),
    path(
        "cluster/<slug:name>/placement/preview/",
        views.placement_preview_fragment,
        name="cluster-placement-preview",
    ),
    path("robots/", views.robot_list, name="robot-list"),
]
