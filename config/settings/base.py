"""Settings shared by every environment; everything that differs comes from the environment."""

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import environ
from celery.schedules import crontab
from csp.constants import NONE, SELF, UNSAFE_INLINE

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

# Runtime state of the embedded default (SQLite file, Celery folders) lives here, outside git.
VAR_DIR = Path(env("TESSERA_VAR_DIR", default=str(BASE_DIR / "var")))

SECRET_KEY = env("DJANGO_SECRET_KEY", default=None)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "django_celery_beat",
    "django_celery_results",
    "axes",
    "csp",
    "core",
    "fleet",
    "sharing",
    "scheduling",
    "worker",
    "capacity",
    "agents",
    "manifests",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "core.middleware.LazyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: turns a locked-out sign-in into its page
]

# No inline script anywhere (pages, HTMX fragments, the API docs, Django's admin): script only from our own static
# files, so an injected <script> or onclick= does not run. Inline style stays allowed: bars and meters set their
# width in a style attribute, and style cannot run code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.context_processors.roles",
            ],
        },
    }
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'tessera.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # web, worker, beat and the cluster watcher share one file: WAL lets readers run beside a writer,
    # IMMEDIATE transactions and a long timeout turn lock contention into waiting instead of errors. The WAL is
    # checkpointed every 1000 pages (4 MiB) and cut back to 16 MiB after a checkpoint that outgrew it (readers can
    # hold a checkpoint back); the daily prune truncates it (core.retention).
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=1000; "
            "PRAGMA journal_size_limit=16777216;"
        ),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Statements prepared once per connection after this many runs (psycopg's prepare_threshold): the agent report
    # path's statements (agents/statements.py, server-binding cursors) are then neither parsed nor planned again.
    # Django's own cursors bind on the client and never prepare. Behind PgBouncer in transaction mode before 1.21
    # (no prepared statements), set DJANGO_PG_PREPARE_THRESHOLD=none.
    _threshold = env("DJANGO_PG_PREPARE_THRESHOLD", default="5")
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        None if _threshold.lower() == "none" else int(_threshold)
    )
# Persistent connections, SQLite included: a SQLite connection that closes as the file's last one checkpoints and
# deletes the WAL, several fsyncs that made every write request ~5 ms slower (bench B2).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=60)
# A server can drop a connection; a SQLite file cannot (the check would cost a query per request).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Failed sign-ins (UI and Django admin) are counted per username and per client address (django-axes): after
# AXES_FAILURE_LIMIT in a row, that username and that address are locked out until the cool-off passes or an admin
# deletes the access attempt (Admin → Axes → Access attempts, or `manage.py axes_reset`).
# Passwords (unless TESSERA_PASSWORD_LOGIN=false), then single sign-on; each refuses what is not its own.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "core.backends.PasswordBackend",
    "core.backends.OidcBackend",
]
AXES_FAILURE_LIMIT = env.int("TESSERA_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("TESSERA_LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own: one account from anywhere, or one address
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "core.addresses.client_address"  # X-Forwarded-For only through trusted proxies
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:overview"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on with OpenID Connect (mozilla-django-oidc; docs/security.md#single-sign-on), off unless an issuer
# (whose /.well-known/openid-configuration names the endpoints) or the endpoints themselves are set. An endpoint set
# here wins over discovery. Users are matched by issuer and subject; their role follows the claims on every sign-in.
OIDC_RP_CLIENT_ID = env("TESSERA_OIDC_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env("TESSERA_OIDC_CLIENT_SECRET", default="")
OIDC_RP_SCOPES = env("TESSERA_OIDC_SCOPES", default="openid email profile")
OIDC_RP_SIGN_ALGO = env("TESSERA_OIDC_SIGN_ALGO", default="RS256")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("TESSERA_OIDC_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env("TESSERA_OIDC_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env("TESSERA_OIDC_USERINFO_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env("TESSERA_OIDC_JWKS_ENDPOINT", default="")
OIDC_TOKEN_USE_BASIC_AUTH = env.bool("TESSERA_OIDC_CLIENT_SECRET_BASIC", default=False)
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of RP-initiated logout
OIDC_TIMEOUT = env.float("TESSERA_OIDC_TIMEOUT", default=10.0)
TESSERA_SSO = {
    "ISSUER": env("TESSERA_OIDC_ISSUER", default="").rstrip("/"),
    "END_SESSION_ENDPOINT": env("TESSERA_OIDC_END_SESSION_ENDPOINT", default=""),
    "PROVIDER_NAME": env("TESSERA_OIDC_PROVIDER_NAME", default="SSO"),  # "Sign in with <name>"
    "USERNAME_CLAIM": env("TESSERA_OIDC_USERNAME_CLAIM", default="preferred_username"),
    # The claim holding the user's groups or roles (a dotted path reaches into objects: realm_access.roles), and
    # which of its values gives which role; the highest wins, none of them: signed in without a role.
    "ROLES_CLAIM": env("TESSERA_OIDC_ROLES_CLAIM", default="groups"),
    "ROLE_MAP": env("TESSERA_OIDC_ROLE_MAP", default=""),  # "tessera-admins=admin,tessera-ops=operator,staff=viewer"
}
# false: only single sign-on signs in (UI and Django admin); API tokens still work. Break-glass: set it back to true.
TESSERA_PASSWORD_LOGIN = env.bool("TESSERA_PASSWORD_LOGIN", default=True)
# Tessera's sign-out form is redirected to the provider's end-session endpoint: the policy must let the form go there.
CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"] += sorted(
    {
        f"{url.scheme}://{url.netloc}"
        for url in map(urlsplit, (TESSERA_SSO["ISSUER"], TESSERA_SSO["END_SESSION_ENDPOINT"]))
        if url.scheme and url.netloc
    }
)

LANGUAGE_CODE = "en-gb"
TIME_ZONE = env("TESSERA_DISPLAY_TIME_ZONE", default="UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: an anonymous request then gets 401 with WWW-Authenticate instead of 403.
        "core.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["core.permissions.RolePermission"],
    "DEFAULT_PARSER_CLASSES": [
        "core.api.parsers.JSONParser",  # with a nesting depth limit
        "rest_framework.parsers.FormParser",  # the browsable API's forms; the schema documents JSON only
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.filters.FilterBackend",  # django-filter, strict about booleans
        "core.api.filters.SearchFilter",  # `search`, or `q` as the UI says
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.PageNumberPagination",
    "DEFAULT_SCHEMA_CLASS": "core.api.schema.AutoSchema",  # error responses and shared field rules
    "EXCEPTION_HANDLER": "core.api.exceptions.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_RATES": {"agent": env("TESSERA_AGENT_THROTTLE", default="600/min")},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tessera API",
    "DESCRIPTION": "Control plane for sharing NVIDIA GPUs: fleet inventory, sharing profiles, schedules, rollouts.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["core.permissions.ApiDocsPermission"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # No online validator badge: Swagger UI would fetch it from validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "COMPONENT_SPLIT_REQUEST": True,
    # The API speaks JSON (the form parsers serve the browsable API's forms): the schema and its fuzzing say so.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
    # Tags and operation ids from the resource (`gpus`, `gpus_list`), not from the version prefix.
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    # One component name per fleet choice set, whichever field uses it (observed_mode, a profile's mode...).
    "ENUM_NAME_OVERRIDES": {
        "ClusterDriverEnum": "fleet.choices.ClusterDriver",
        "ConfigStateEnum": "fleet.choices.ConfigState",
        "ConnectionStateEnum": "fleet.choices.ConnectionState",
        "GpuHealthEnum": "fleet.choices.GpuHealth",
        "SharingModeEnum": "fleet.choices.SharingMode",
        "RolloutStatusEnum": "worker.choices.RolloutStatus",
        "ChangeStatusEnum": "worker.choices.ChangeStatus",
        "BusyPolicyEnum": "sharing.choices.BusyPolicy",
        "TimeSliceIntervalEnum": "sharing.choices.TimeSliceInterval",
        "MigStrategyEnum": "sharing.choices.MigStrategy",
        "ClusterMigStrategyEnum": "fleet.choices.ClusterMigStrategy",
        "AssignModeEnum": "scheduling.assign.AssignMode",
        # The agent protocol's Literal types (fleet/api/protocol.py mirrors the protocol's dataclasses).
        "AgentTimeSliceIntervalEnum": "fleet.api.protocol.TIME_SLICE_INTERVALS",
    },
}

# Celery: the embedded default needs no broker server: kombu's filesystem transport with atomic writes and claims
# (core/broker.py, docs/operations.md#the-embedded-broker).
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=env("REDIS_URL", default="tessera-fs://"))
CELERY_FILESYSTEM_DIR = VAR_DIR / "celery"
if CELERY_BROKER_URL.startswith(("filesystem://", "tessera-fs://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_FILESYSTEM_DIR / "queue"),
        "data_folder_out": str(CELERY_FILESYSTEM_DIR / "queue"),
        "processed_folder": str(CELERY_FILESYSTEM_DIR / "processed"),
        "control_folder": str(CELERY_FILESYSTEM_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.05,
    }
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = False
# Nothing reads a task's result (tasks write their outcome to the database; the worker logs failures): storing one
# was a SQLite write per task, ~16,000 rows a day with `make run` idle. Rows from before go in core.retention's prune;
# no expiry here, so Celery's own cleanup (one unbatched DELETE) is not scheduled.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_EXPIRES = None
# django-celery-beat's database scheduler, sending each periodic task once per period however many beats run: a row
# per (entry, period) claimed in the database (core/beat.py, core/periodic.py, docs/operations.md#supported-topology).
CELERY_BEAT_SCHEDULER = "core.beat:Scheduler"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 120
CELERY_TASK_TIME_LIMIT = 180
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Tessera's own knobs.
LOOPBACK = ["127.0.0.1", "localhost", "::1"]  # metrics hosts of the embedded default (local.py, test.py)
TESSERA = {
    # A node whose last observation (agent report or Kubernetes watch) is older than this is stale.
    "STALE_AFTER_SECONDS": env.int("TESSERA_STALE_AFTER_SECONDS", default=180),
    # Seconds between node agent reports, handed out at registration; an agent node missing 3 reports is stale.
    "AGENT_INTERVAL_SECONDS": env.int("TESSERA_AGENT_INTERVAL_SECONDS", default=15),
    # Unchanged agent reports (metrics, last-seen) are written together every this many seconds per web process;
    # 0 writes each at once.
    "AGENT_REPORT_FLUSH_SECONDS": env.float("TESSERA_AGENT_REPORT_FLUSH_SECONDS", default=0.2),
    # On PostgreSQL each web process keeps what a report's credential statement read, dropped when the database
    # notifies a change (agents/report_cache.py), and read again at the latest after this many seconds; 0: off.
    "AGENT_REPORT_CACHE_SECONDS": env.float("TESSERA_AGENT_REPORT_CACHE_SECONDS", default=900),
    "API_MAX_PAGE_SIZE": 1000,
    # Hours an agent's request to register an existing node waits for an admin's approval; then it expires (an agent
    # still asking makes a new request) and the daily prune deletes it.
    "PENDING_AGENT_TTL_HOURS": env.int("TESSERA_PENDING_AGENT_TTL_HOURS", default=24),
    # Reverse proxies in front of Tessera that append the client's address to X-Forwarded-For (0: none; the header
    # is then ignored, since a client can write it): throttles and audit key on the address they vouch for.
    "TRUSTED_PROXY_COUNT": env.int("TESSERA_TRUSTED_PROXY_COUNT", default=0),
    # How often an in-flight node change is polled (waiting for idle GPUs, verifying MIG Manager's result).
    "STEP_POLL_SECONDS": env.float("TESSERA_STEP_POLL_SECONDS", default=2.0),
    # The reconcile tick evaluates only the nodes something could have changed for (worker/reconcile.py); every this
    # many seconds it sends a full pass over every node (its own task), the safety net that counts what it missed.
    "RECONCILE_FULL_SECONDS": env.int("TESSERA_RECONCILE_FULL_SECONDS", default=600),
    # Strategy of the rollouts the reconcile loop starts on its own.
    "ROLLOUT_DEFAULTS": {
        "batch_size": env.int("TESSERA_ROLLOUT_BATCH_SIZE", default=10),
        "canary_count": env.int("TESSERA_ROLLOUT_CANARIES", default=1),
        "max_failures": env.int("TESSERA_ROLLOUT_MAX_FAILURES", default=2),
        # A failed canary (or max_failures failed nodes) fails the rollout, or pauses it for a person: fail | pause.
        "on_failure": env("TESSERA_ROLLOUT_ON_FAILURE", default="fail"),
        "busy_policy": env("TESSERA_ROLLOUT_BUSY_POLICY", default="wait"),
        "wait_minutes": env.int("TESSERA_ROLLOUT_WAIT_MINUTES", default=30),
        "verify_timeout_seconds": env.int("TESSERA_ROLLOUT_VERIFY_TIMEOUT", default=600),
    },
    # A node whose change failed is tried again by the loop after this back-off, doubled after each failure in a
    # row up to the cap ("retry now" on the node or rollout page skips the wait).
    "RETRY_BACKOFF_SECONDS": env.int("TESSERA_RETRY_BACKOFF_SECONDS", default=60),
    "RETRY_BACKOFF_MAX_SECONDS": env.int("TESSERA_RETRY_BACKOFF_MAX_SECONDS", default=3600),
    # How long history is kept, pruned daily in batches (docs/operations.md#bounded-state). The audit log is kept.
    "RETENTION": {
        # XID and ECC events of a GPU: by age, and at most this many per GPU (an XID storm stays bounded; 0: no cap).
        "GPU_EVENTS_DAYS": env.int("TESSERA_RETAIN_GPU_EVENTS_DAYS", default=90),
        "GPU_EVENTS_PER_GPU": env.int("TESSERA_RETAIN_GPU_EVENTS_PER_GPU", default=1000),
        # Nodes and GPUs gone from their cluster (a node still named by a kept rollout stays until that rollout goes).
        "GONE_DAYS": env.int("TESSERA_RETAIN_GONE_DAYS", default=30),
        # Agent credentials replaced by a re-registration, or revoked by an admin.
        "REVOKED_CREDENTIALS_DAYS": env.int("TESSERA_RETAIN_REVOKED_CREDENTIALS_DAYS", default=30),
        # Finished rollouts (succeeded, failed, cancelled) with their node changes; running or paused ones stay.
        "ROLLOUTS_DAYS": env.int("TESSERA_RETAIN_ROLLOUTS_DAYS", default=180),
        # Celery task results (none are stored since CELERY_TASK_IGNORE_RESULT; rows from before go).
        "TASK_RESULTS_DAYS": env.int("TESSERA_RETAIN_TASK_RESULTS_DAYS", default=1),
        # Demand and usage samples per pool (capacity/): what recommendations and GPU-hours per team read.
        "DEMAND_DAYS": env.int("TESSERA_RETAIN_DEMAND_DAYS", default=35),
        # Beat's claims of periodic tasks, a row per task per period (core.periodic): ~11,000 a day.
        "PERIODIC_RUNS_DAYS": env.int("TESSERA_RETAIN_PERIODIC_RUNS_DAYS", default=2),
        # Rows deleted per transaction: a first prune of a large backlog never holds the write lock for long.
        "BATCH_SIZE": env.int("TESSERA_RETAIN_BATCH_SIZE", default=500),
    },
    # Checks of /readyz that answer 503 when they fail (the others are reported only): database, broker, watch,
    # beat (docs/metrics.md).
    "READYZ_REQUIRED": env.list("TESSERA_READYZ_REQUIRED", default=["database"]),
    # A schedule transition whose pool still has nodes waiting for a change this long after it is missed.
    "SCHEDULE_GRACE_SECONDS": env.int("TESSERA_SCHEDULE_GRACE_SECONDS", default=600),
    # Who reads /api/schema/ and /api/docs/ without a role, and /metrics without a sign-in: nobody unless opened here.
    # Prometheus scrapes /metrics with `Authorization: Bearer <METRICS_TOKEN>` (bearer_token_file in its config).
    "API_DOCS_PUBLIC": env.bool("TESSERA_API_DOCS_PUBLIC", default=False),
    "METRICS_PUBLIC": env.bool("TESSERA_METRICS_PUBLIC", default=False),
    "METRICS_TOKEN": env("TESSERA_METRICS_TOKEN", default=""),
    # Days a user's API token works after it was made (0: until rotated).
    "API_TOKEN_DAYS": env.int("TESSERA_API_TOKEN_DAYS", default=90),
    # What cluster settings may make the worker read or fetch (fleet/cluster_access.py): kubeconfigs from this
    # directory only (mount a Secret there), credential plugins that run a command (`exec`) only when allowed, and
    # metrics URLs on these hosts only (patterns such as *.svc, or networks such as 10.0.0.0/8).
    "KUBECONFIG_DIR": env("TESSERA_KUBECONFIG_DIR", default="/etc/tessera/kubeconfigs"),
    "KUBECONFIG_ALLOW_EXEC": env.bool("TESSERA_KUBECONFIG_ALLOW_EXEC", default=False),
    "METRICS_URL_ALLOW": env.list("TESSERA_METRICS_URL_ALLOW", default=["*.svc", "*.svc.cluster.local"]),
    # Demand and usage history (capacity/): sampled every SAMPLE_MINUTES (each sample stands for that long, the
    # sampling error of GPU-hours), GPU-hours per team by the value of this pod label.
    "CAPACITY": {
        "SAMPLE_MINUTES": env.int("TESSERA_CAPACITY_SAMPLE_MINUTES", default=5),
        "TEAM_LABEL": env("TESSERA_CAPACITY_TEAM_LABEL", default="team"),
    },
}
# The daily prunes (UTC, off-peak): each app prunes what it owns. Rollouts first (a gone node stays while a kept
# rollout names it), then the fleet, then core, which also checkpoints and truncates the SQLite WAL.
PRUNE_HOUR = env.int("TESSERA_PRUNE_HOUR", default=3)
# `expire_seconds`, the option django-celery-beat stores (it drops `expires`): a tick not run within it is discarded.
CELERY_BEAT_SCHEDULE = {
    "qos-compliance": {
        "task": "worker.tasks.qos_compliance_refresh",
        "schedule": env.float("TESSERA_COMPLIANCE_SECONDS", default=300.0),
        "options": {"expire_seconds": 240},
    },
    "reconcile-tick": {
        "task": "worker.tasks.reconcile_tick",
        "schedule": env.float("TESSERA_RECONCILE_SECONDS", default=30.0),
        "options": {"expire_seconds": 60},
    },
    # Kubernetes clusters: GPUs and utilisation from dcgm-exporter, GPU pods (nodes come from watch_clusters).
    "clusters-scrape-metrics": {
        "task": "worker.tasks.clusters_scrape_metrics",
        "schedule": env.float("TESSERA_INVENTORY_SECONDS", default=30.0),
        "options": {"expire_seconds": 30},
    },
    "clusters-sync-pods": {
        "task": "worker.tasks.clusters_sync_pods",
        "schedule": env.float("TESSERA_INVENTORY_SECONDS", default=30.0),
        "options": {"expire_seconds": 30},
    },
    # QoS policies enforced at admission: ValidatingAdmissionPolicies per cluster (changes also sync at once).
    "clusters-sync-admission": {
        "task": "worker.tasks.clusters_sync_admission",
        "schedule": env.float("TESSERA_ADMISSION_SECONDS", default=60.0),
        "options": {"expire_seconds": 60},
    },
    "worker-retention-prune": {
        "task": "worker.tasks.retention_prune",
        "schedule": crontab(hour=PRUNE_HOUR, minute=5),
        "options": {"expire_seconds": 3600},
    },
    "fleet-retention-prune": {
        "task": "fleet.tasks.retention_prune",
        "schedule": crontab(hour=PRUNE_HOUR, minute=20),
        "options": {"expire_seconds": 3600},
    },
    "capacity-sample": {
        "task": "capacity.tasks.sample",
        "schedule": 60.0 * env.int("TESSERA_CAPACITY_SAMPLE_MINUTES", default=5),
        "options": {"expire_seconds": 60.0 * env.int("TESSERA_CAPACITY_SAMPLE_MINUTES", default=5)},
    },
    # Kueue Workloads of clusters with a Kueue binding, as demand (worker/kueue.py), into the same buckets.
    "kueue-workloads-sample": {
        "task": "worker.tasks.kueue_workloads_sample",
        "schedule": 60.0 * env.int("TESSERA_CAPACITY_SAMPLE_MINUTES", default=5),
        "options": {"expire_seconds": 60.0 * env.int("TESSERA_CAPACITY_SAMPLE_MINUTES", default=5)},
    },
    "capacity-retention-prune": {
        "task": "capacity.tasks.retention_prune",
        "schedule": crontab(hour=PRUNE_HOUR, minute=30),
        "options": {"expire_seconds": 3600},
    },
    "core-retention-prune": {
        "task": "core.tasks.retention_prune",
        "schedule": crontab(hour=PRUNE_HOUR, minute=40),
        "options": {"expire_seconds": 3600},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The filesystem broker URL has no host by design; kombu warns about it on every connection.
        "kombu.connection": {"level": "ERROR"},
        # A line per rollout that starts or ends, whatever the root level (worker/services.py).
        "tessera.rollouts": {"level": "INFO"},
    },
}
