from django.urls import path

from controlplane.sweeps import views

urlpatterns = [
    path("sweeps/", views.sweep_list, name="sweep-list"),
    path("sweeps/<int:sweep_id>/", views.sweep_detail, name="sweep-detail"),
    path("sweeps/<int:sweep_id>/cancel/", views.sweep_cancel, name="sweep-cancel"),
    path(
        "sweeps/<int:sweep_id>/best-revision/",
        views.sweep_best_revision,
        name="sweep-best-revision",
    ),  # fmt: skip
    path("experiments/<slug:name>/sweep/", views.sweep_new, name="sweep-new"),
]
