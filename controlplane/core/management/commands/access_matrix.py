"""`./manage.py access_matrix [--write]`: the access table as docs/permissions.md shows it."""

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.core import access_matrix as matrix

DOC = settings.BASE_DIR / "docs" / "permissions.md"


class Command(BaseCommand):
    help = "Print the permission matrix, or --write it into docs/permissions.md."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--write", action="store_true", help=f"update {DOC}")

    def handle(self, *args, write: bool, **options) -> None:
        if not write:
            self.stdout.write(matrix.render())
            return
        DOC.write_text(matrix.with_matrix(DOC.read_text()))
        self.stdout.write(f"Wrote the matrix into {DOC}")
