"""`make run`: migrate, ensure an admin login and demo data, then supervise web + worker + beat until Ctrl-C."""

import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand

from core.roles import Role
from fleet.models import Node

STOP_TIMEOUT = 15


class Command(BaseCommand):
    help = "Run Tessera's embedded default: web server, Celery worker and beat (and the demo fleet) in one command."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("TESSERA_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("TESSERA_PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true", help="Do not seed the demo fleet into an empty database.")

    def handle(self, *args, host, port, no_demo, **options):
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        login = self._ensure_admin()
        if not no_demo and not Node.objects.exists():
            self.stdout.write("Seeding the demo fleet…")
            call_command("seed_demo")

        python = sys.executable
        bindir = os.path.dirname(python)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.local"),
        }
        commands = {
            "web": [
                os.path.join(bindir, "gunicorn"),
                "config.wsgi",
                "--bind",
                f"{host}:{port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--access-logfile",
                "-",
                "--log-level",
                "warning",
            ],
            "worker": [
                os.path.join(bindir, "celery"),
                "-A",
                "config",
                "worker",
                "-l",
                "INFO",
                "--concurrency",
                "2",
                "-n",
                "tessera-worker@%h",
            ],
            "beat": [os.path.join(bindir, "celery"), "-A", "config", "beat", "-l", "INFO"],
        }
        children = {name: subprocess.Popen(cmd, env=env, start_new_session=True) for name, cmd in commands.items()}
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\nTessera is running at {url}"))
        self.stdout.write(login)
        self.stdout.write("API docs: " + url + "api/docs/   Stop: Ctrl-C\n")

        stopping = []
        signal.signal(signal.SIGINT, lambda *a: stopping.append(True))
        signal.signal(signal.SIGTERM, lambda *a: stopping.append(True))
        while not stopping:
            dead = [name for name, proc in children.items() if proc.poll() is not None]
            if dead:
                self.stderr.write(f"{', '.join(dead)} exited; stopping the others.")
                break
            time.sleep(0.5)
        self._stop(children)

    def _stop(self, children):
        """TERM every child, wait for a warm shutdown, KILL what is left."""
        self.stdout.write("Stopping…")
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.stdout.write("Stopped.")

    def _ensure_admin(self) -> str:
        """Create the admin login once: from TESSERA_ADMIN_USERNAME/PASSWORD, or a generated password shown now."""
        username = os.environ.get("TESSERA_ADMIN_USERNAME", "admin")
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            return f"Login: {username} (password as set before; change it with `make admin-password`)"
        password = os.environ.get("TESSERA_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        user = user_model.objects.create_superuser(username=username, email="", password=password)
        user.groups.add(Group.objects.get(name=Role.ADMIN.group_name))
        shown = password if "TESSERA_ADMIN_PASSWORD" not in os.environ else "(from TESSERA_ADMIN_PASSWORD)"
        return f"Login: {username} / {shown}   (shown once; change it with `make admin-password`)"
