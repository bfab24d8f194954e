"""`./armature reset-admin-password`: a new generated password for the admin account."""

from django.core.management.base import BaseCommand

from controlplane.core.bootstrap import ADMIN_USERNAME, reset_admin_password


class Command(BaseCommand):
    help = (
        "Give the admin account a new generated password, print it once and keep it in "
        "var/admin_password (readable only by you). Also lifts its login lockouts."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--username", default=ADMIN_USERNAME)

    def handle(self, *args, username: str, **options) -> None:
        admin = reset_admin_password(username)
        if admin.created:
            self.stdout.write(f"There was no {username} account: created it.")
        self.stdout.write(self.style.SUCCESS(f"New password for {username}: {admin.password}"))
        self.stdout.write(
            f"It is also in {admin.password_file} (readable only by you); "
            "it will not be printed again."
        )
