"""Metric points refer to a per-run key row instead of repeating the key text, indexed
by (key, step) for series reads; runs get tags."""

import django.db.models.deletion
from django.db import migrations, models


def move_keys_to_rows(apps, schema_editor):
    MetricKey = apps.get_model("runs", "MetricKey")
    MetricPoint = apps.get_model("runs", "MetricPoint")
    pairs = MetricPoint.objects.values_list("run_id", "old_key").distinct()
    for run_id, name in pairs.iterator():
        key = MetricKey.objects.create(run_id=run_id, name=name)
        MetricPoint.objects.filter(run_id=run_id, old_key=name).update(key=key)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_attempts_cancel_intent_interrupted"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="tags",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.CreateModel(
            name="MetricKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=200)),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="metric_keys", to="runs.run")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "name"), name="unique_run_key")],
            },
        ),
        migrations.RemoveIndex(model_name="metricpoint", name="runs_metric_run_id_6d4fc2_idx"),
        migrations.RenameField(model_name="metricpoint", old_name="key", new_name="old_key"),
        migrations.AddField(
            model_name="metricpoint",
            name="key",
            field=models.ForeignKey(null=True, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="runs.metrickey"),
        ),
        migrations.RunPython(move_keys_to_rows, migrations.RunPython.noop),
        migrations.RemoveField(model_name="metricpoint", name="old_key"),
        migrations.RemoveField(model_name="metricpoint", name="run"),
        migrations.AlterField(
            model_name="metricpoint",
            name="key",
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, to="runs.metrickey"),
        ),
        migrations.AlterField(
            model_name="metricpoint",
            name="wall_time",
            field=models.FloatField(help_text="Unix seconds when the trainer measured it."),
        ),
        migrations.AddIndex(
            model_name="metricpoint",
            index=models.Index(fields=["key", "step"], name="runs_point_key_step"),
        ),
    ]
