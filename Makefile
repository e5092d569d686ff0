# Tessera: `make run` starts everything on the embedded default; `make test` passes the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export DJANGO_SETTINGS_MODULE ?= config.settings.local

.PHONY: run test lint format install install-dev chromium prometheus admin-password seed bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Tessera needs Python 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# requirements/base.txt installs the `tessera` client from client/ too: a change there installs it again.
CLIENT := client/pyproject.toml $(wildcard client/tessera_cli/*)

$(VENV)/.installed-base: requirements/base.txt $(CLIENT) | $(BIN)/python
	$(BIN)/pip install -q -r requirements/base.txt
	@touch $@

$(VENV)/.installed-dev: requirements/base.txt requirements/dev.txt $(CLIENT) | $(BIN)/python
	$(BIN)/pip install -q -r requirements/dev.txt
	@touch $@ $(VENV)/.installed-base

install: $(VENV)/.installed-base
install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/python manage.py run_embedded

# Debian's Chromium for the browser tests; installed when missing and we are root, else say what to do.
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's chromium for the browser tests…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "The browser tests need Chromium at /usr/bin/chromium: run 'sudo apt-get install chromium'." >&2; exit 1; \
	fi

# Debian's prometheus for the alert-rule tests (promtool) and the alert test against a real server; same policy.
prometheus:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian's prometheus for the alert-rule tests…"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	else \
		echo "The alert-rule tests need promtool and prometheus: run 'sudo apt-get install prometheus'." >&2; exit 1; \
	fi

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=client $(BIN)/lint-imports --no-cache  # the client from its source (client/)

# The suite runs on DATABASE_URL's database (CI: PostgreSQL). The hostile agent-report fuzz runs on SQLite too, the
# default a `make run` install uses (its bounds must hold in both databases' columns; ~26 s of CPU): docs/security.md.
HOSTILE_REPORTS := tests/agents/test_hostile_reports.py
test: install-dev chromium prometheus lint
	@if [ -n "$$DATABASE_URL" ] && [ -z "$(PYTEST_ARGS)" ]; then \
		echo "The hostile agent-report tests on SQLite (then the whole suite on DATABASE_URL):"; \
		env -u DATABASE_URL DJANGO_SETTINGS_MODULE=config.settings.test $(BIN)/pytest -q $(HOSTILE_REPORTS); \
	fi
	DJANGO_SETTINGS_MODULE=config.settings.test $(BIN)/pytest $(PYTEST_ARGS)

format: install-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

seed: install
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py seed_demo

admin-password: install
	$(BIN)/python manage.py changepassword $${TESSERA_ADMIN_USERNAME:-admin}

bench: install-dev
	$(BIN)/python -m bench.b1_gpu_list

clean:
	rm -rf var staticfiles .pytest_cache .ruff_cache
