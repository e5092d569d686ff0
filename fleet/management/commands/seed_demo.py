"""`manage.py seed_demo`: the demo fleet (idempotent: running it again changes nothing but timestamps)."""

from django.core.management.base import BaseCommand

from fleet.demo import seed_demo


class Command(BaseCommand):
    help = "Create or refresh the demo fleet: 2 clusters, 5 pools, 61 nodes, 400 GPUs of mixed products."

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, seed, **options):
        counts = seed_demo(seed=seed)
        self.stdout.write(self.style.SUCCESS("Demo fleet: " + ", ".join(f"{v} {k}" for k, v in counts.items())))
