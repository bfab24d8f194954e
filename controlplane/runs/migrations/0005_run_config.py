from django.db import migrations, models


def parse_stored_configs(apps, schema_editor):
    from controlplane.runs.models import parsed_config

    Run = apps.get_model("runs", "Run")
    for run in Run.objects.only("pk", "config_yaml").iterator(chunk_size=500):
        Run.objects.filter(pk=run.pk).update(config=parsed_config(run.config_yaml))


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_eval_runs")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="config",
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
        migrations.RunPython(parse_stored_configs, migrations.RunPython.noop),
    ]
