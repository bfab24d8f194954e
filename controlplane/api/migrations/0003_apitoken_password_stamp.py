"""Tokens carry a stamp of the password they were made under (api.tokens.password_stamp).
Tokens made before it are stamped with their user's password as it is now: they keep
working until that password changes."""

import hashlib

from django.db import migrations, models


def stamp_existing(apps, schema_editor):
    token_model = apps.get_model("api", "ApiToken")
    for token in token_model.objects.select_related("user"):
        # The same stamp as api.tokens.password_stamp (kept here as it is today).
        token.password_stamp = hashlib.sha256(
            f"api-token:{token.user.password}".encode()
        ).hexdigest()
        token.save(update_fields=["password_stamp"])


class Migration(migrations.Migration):
    dependencies = [
        ("api", "0002_apitoken_expires_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="password_stamp",
            field=models.CharField(default="", editable=False, max_length=64),
        ),
        migrations.AlterField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(
                blank=True,
                help_text="After this the token stops working; empty: at the longest "
                "lifetime (ARMATURE_TOKEN_MAX_DAYS from its creation).",
                null=True,
            ),
        ),
        migrations.RunPython(stamp_existing, migrations.RunPython.noop),
    ]
