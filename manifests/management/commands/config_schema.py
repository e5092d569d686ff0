"""`manage.py config_schema`: the JSON Schema of config documents, written where the client ships it."""

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from manifests.documents import schema

SHIPPED = Path(settings.BASE_DIR) / "client" / "tessera_cli" / "schema.json"


def schema_text() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


class Command(BaseCommand):
    help = f"Write the config documents' JSON Schema to {SHIPPED} (the copy the `tessera` client ships)."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="exit 1 when the shipped copy is out of date")

    def handle(self, *args, check, **options):
        if check:
            if SHIPPED.read_text() != schema_text():
                self.stderr.write(f"{SHIPPED} is out of date: run `manage.py config_schema`.")
                raise SystemExit(1)
            return
        SHIPPED.write_text(schema_text())
        self.stdout.write(f"Wrote {SHIPPED}.")
