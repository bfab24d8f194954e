"""Django settings for the Armature control plane.

Everything comes from environment variables (see deploy/ENVIRONMENT.md). With
none set, the one-machine mode applies: SQLite under var/, kombu's file-system
broker, the in-memory channel layer and a local Ray head started by `./armature up`.
"""

from datetime import timedelta
from pathlib import Path

import dj_database_url

from controlplane.env import (
    artifacts_dir,
    env_bool,
    env_int,
    env_list,
    env_str,
    persistent_secret,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("ARMATURE_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env_str("SECRET_KEY") or persistent_secret(VAR_DIR / "secret_key")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# --- HTTPS --------------------------------------------------------------------------------
# Off by default: the one-machine mode serves plain HTTP on localhost. docker-compose.yml
# turns them on, for a deployment behind a proxy that terminates TLS (deploy/ENVIRONMENT.md).
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("ARMATURE_SECURE_COOKIES", False)
SECURE_SSL_REDIRECT = env_bool("ARMATURE_SSL_REDIRECT", False)
# Health probes (compose, Kubernetes) speak plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("ARMATURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("ARMATURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("ARMATURE_HSTS_PRELOAD", True)
if env_bool("ARMATURE_TRUST_X_FORWARDED_PROTO", False):
    # Only behind a proxy that sets this header itself: otherwise a client could claim HTTPS.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "daphne",
    # Django's admin, its site behind the access table (controlplane/access/admin_site.py).
    "controlplane.access.admin_app.AdminSiteConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane.core",
    "controlplane.inventory",
    "controlplane.experiments",
    "controlplane.runs",
    "controlplane.console",
    "controlplane.sweeps",
    "controlplane.realtime",
    "controlplane.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Every response: no inline script or style, no eval (docs/permissions.md).
    "controlplane.core.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Before any view or CSRF check reads the body; after auth so its page shows the user.
    "controlplane.core.body_limit.RequestBodyLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout into the response that says so.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------
SQLITE_PATH = VAR_DIR / "armature.sqlite3"
# Connections are kept (per thread) for this many seconds: a trainer link stores a batch
# every few milliseconds, and a new PostgreSQL connection per batch costs more than the
# batch. 0 closes after each request or socket message.
DB_CONN_MAX_AGE = int(env_str("DB_CONN_MAX_AGE", "60"))
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL") or f"sqlite:///{SQLITE_PATH}",
        conn_max_age=DB_CONN_MAX_AGE,
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker) share the file: wait on locks instead of failing,
    # and keep the test database in a file so those processes can see it too.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, Celery and the channel layer ---------------------------------------------
REDIS_URL = env_str("REDIS_URL")
BROKER_DIR = VAR_DIR / "broker"

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis keeps every message bound for one process's consumers in
            # one queue, so its capacity is shared by all the browsers and trainer
            # links of a web process: the default 100 overflowed (messages dropped)
            # with 10 runs streaming to 10 browsers (bench/telemetry.py).
            "CONFIG": {"hosts": [{"address": REDIS_URL}], "capacity": 2000},
        }
    }
    # What robots are online (controlplane.console.live), seen by every web process.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "armature",
        }
    }
else:
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "controlplane.core.filebroker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "polling_interval": 0.02,
    }
    CELERY_RESULT_BACKEND = (
        f"controlplane.core.filebroker:AtomicFilesystemBackend+file://{BROKER_DIR / 'results'}"
    )
    for folder in ("queue", "control", "processed", "results"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    # In-process only: messages published by other processes reach it through
    # controlplane.realtime.publish, which relays them over HTTP to the web process.
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    # Runs whose Ray job changed state without the trainer telling (crash, OOM, stop).
    "reconcile-active-runs": {"task": "runs.reconcile_active", "schedule": 10.0},
    # Each running sweep's step: its trials' progress, pruning, and the next launches.
    "advance-active-sweeps": {"task": "sweeps.advance_active", "schedule": 10.0},
}

# Where processes other than the web server reach it (the realtime relay, trainers).
ARMATURE_WEB_URL = env_str("ARMATURE_WEB_URL", "http://127.0.0.1:8000").rstrip("/")

# --- Ray ---------------------------------------------------------------------------------
# The Ray dashboard / Jobs API address. `./armature up` starts a local head and sets it.
RAY_ADDRESS = env_str("RAY_ADDRESS", "http://127.0.0.1:8265")
# The token of a Ray cluster started with RAY_AUTH_MODE=token, sent with every request
# to RAY_ADDRESS (controlplane/core/ray_auth.py).
RAY_AUTH_TOKEN = env_str("RAY_AUTH_TOKEN")

# --- Auth, static files, i18n ---------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Logins (the login page's and the admin's) are rate-limited by django-axes: after
# ARMATURE_LOGIN_FAILURE_LIMIT failures for one username from one address, that pair is
# locked out for ARMATURE_LOGIN_COOLOFF_MINUTES. Per pair, so nobody can lock a user out
# from everywhere by failing on purpose. `./manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(env_str("ARMATURE_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(env_str("ARMATURE_LOGIN_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "controlplane.access.logins.locked_out"
# The proxies in front of the web server that each append to X-Forwarded-For (one, the
# TLS proxy, wherever X-Forwarded-Proto is trusted): the address a login is counted by.
ARMATURE_PROXY_COUNT = env_int(
    "ARMATURE_PROXY_COUNT", 1 if env_bool("ARMATURE_TRUST_X_FORWARDED_PROTO", False) else 0
)
AXES_CLIENT_IP_CALLABLE = "controlplane.access.logins.client_address"
LOGIN_URL = "login"

# Request bodies past this get 413 (controlplane.core.body_limit); YAML documents inside
# them have their own limits (ARMATURE_YAML_*, read by trainer.bounded_yaml).
MAX_REQUEST_BYTES = int(env_str("ARMATURE_MAX_REQUEST_BYTES", str(2**20)))
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
# Serve straight from the app folders so the one-machine mode needs no collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so its WWW-Authenticate header turns "no credentials" into a 401.
        "controlplane.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every route's rule is in the access table (controlplane/access/doors.py).
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.access.api.DoorPermission"],
    # JSON with the same nesting bound as YAML; forms as DRF reads them by default.
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Armature API",
    "DESCRIPTION": "Clusters, experiments and runs of the Armature control plane.",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The schema and its docs page follow the access table too (logged-in users only).
    "SERVE_PERMISSIONS": ["controlplane.access.api.DoorPermission"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.api.schema_paths.without_optional_slashes",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# How often the live status panel re-checks every component.
ARMATURE_STATUS_INTERVAL_S = float(env_str("ARMATURE_STATUS_INTERVAL_S", "5"))
# How often an open browser socket reads its user's role version (one cache read): a
# logout, a password change, a deactivation or a role taken away closes it within this.
ARMATURE_SOCKET_RECHECK_S = float(env_str("ARMATURE_SOCKET_RECHECK_S", "2"))
# The longest an API token lives (days from its creation, whatever expiry it was given).
ARMATURE_TOKEN_MAX_DAYS = env_int("ARMATURE_TOKEN_MAX_DAYS", 365)

# Every run's files (checkpoints, metrics, TensorBoard events) live in its own folder
# under ARTIFACTS_DIR (a path or a file:// URI). With a Ray cluster of several nodes it
# must be shared storage (NFS, or an object store mounted as a file system).
ARTIFACTS_DIR = artifacts_dir(env_str("ARTIFACTS_DIR"), VAR_DIR / "artifacts")
# The other folders whose files a run's config may name (model folders and success
# classifiers; demo datasets): with ARTIFACTS_DIR, the only ones (trainer.config.path_roots).
ARMATURE_MODELS_DIR = Path(env_str("ARMATURE_MODELS_DIR", str(VAR_DIR / "models")))
ARMATURE_DATASETS_DIR = Path(env_str("ARMATURE_DATASETS_DIR", str(VAR_DIR / "demos")))

# Deadline of every request to Ray's Jobs API.
RAY_REQUEST_TIMEOUT_S = float(env_str("ARMATURE_RAY_TIMEOUT_S", "10"))
# A run that has not started in Ray this long after its submission (waiting for
# resources, or its submission failing again and again) is stopped as timed out.
ARMATURE_PENDING_TIMEOUT_S = float(env_str("ARMATURE_PENDING_TIMEOUT_S", "900"))
# A cancel that Ray cannot confirm (unreachable) this long marks the run cancelled with
# that reason; its job is still stopped as soon as Ray answers.
ARMATURE_CANCEL_CONFIRM_S = float(env_str("ARMATURE_CANCEL_CONFIRM_S", "120"))
# A run's log panel (controlplane/runs/run_logs.py): how long Ray's answer for a run's
# last lines is kept for every tab polling it, and how often each user may poll a panel
# or download a whole log a minute.
ARMATURE_LOG_TAIL_CACHE_S = float(env_str("ARMATURE_LOG_TAIL_CACHE_S", "3"))
ARMATURE_LOG_POLLS_PER_MINUTE = env_int("ARMATURE_LOG_POLLS_PER_MINUTE", 120)
ARMATURE_LOG_DOWNLOADS_PER_MINUTE = env_int("ARMATURE_LOG_DOWNLOADS_PER_MINUTE", 10)

# The Python that runs `python -m trainer` inside Ray jobs; empty: this process's own
# (right for the local head). Set it for a cluster whose nodes have another layout.
ARMATURE_TRAINER_PYTHON = env_str("ARMATURE_TRAINER_PYTHON")
