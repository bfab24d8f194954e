from django.urls import path

from controlplane.experiments import views

urlpatterns = [
    path("experiments/", views.experiment_list, name="experiment-list"),
    path("experiments/validate/", views.experiment_validate, name="experiment-validate"),
    path("experiments/<slug:name>/", views.experiment_detail, name="experiment-detail"),
    path("experiments/<slug:name>/diff/", views.revision_diff, name="experiment-diff"),
    path("experiments/<slug:name>/clone/", views.experiment_clone, name="experiment-clone"),
    path("experiments/<slug:name>/launch/", views.experiment_launch, name="experiment-launch"),
    path("runs/launch/", views.run_launch, name="run-launch"),
    path("runs/launch/preview/", views.launch_preview, name="run-launch-preview"),
    path(
        "experiments/<slug:name>/launch/preview/",
        views.launch_preview,
        name="experiment-launch-preview",
    ),
]
