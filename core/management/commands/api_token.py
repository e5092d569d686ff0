"""`manage.py api_token <username>`: make a new API token for a user and print it once (the old one stops working)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.services import api_token_rotate


class Command(BaseCommand):
    help = "Make a new API token for a user and print it on standard output; their previous token stops working."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user {username}.")
        _, plain = api_token_rotate(user=user)
        self.stdout.write(plain)
