from django.urls import path

from controlplane.runs import views

urlpatterns = [
    path("runs/", views.run_list, name="run-list"),
    path("runs/compare/", views.run_compare, name="run-compare"),
    path("runs/compare/episodes/", views.compare_episodes, name="run-compare-episodes"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/logs/", views.run_logs, name="run-logs"),
    path("runs/<int:run_id>/stop/", views.run_stop, name="run-stop"),
    path("runs/<int:run_id>/resume/", views.run_resume, name="run-resume"),
    path("runs/<int:run_id>/evaluate/", views.run_evaluate, name="run-evaluate"),
    path("runs/<int:run_id>/files/<path:path>", views.run_file, name="run-file"),
    path("runs/<int:run_id>/episodes/", views.run_episodes, name="run-episodes"),
    path(
        "runs/<int:run_id>/episodes/<str:name>.mp4",
        views.run_episode_video,
        name="run-episode-video",
    ),  # fmt: skip
    path("runs/<int:run_id>/diff/<int:other_id>/", views.run_diff, name="run-diff"),
]
