# One image for web, worker and beat; the command picks the role (see docker-compose.yml).
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=config.settings.production
WORKDIR /app
COPY requirements/ requirements/
COPY client/ client/
RUN pip install --no-cache-dir -r requirements/base.txt
COPY . .
RUN DJANGO_SECRET_KEY=build-only DATABASE_URL=postgres://build@localhost/build \
    python manage.py collectstatic --noinput --verbosity 0
RUN useradd --system --uid 10001 tessera && mkdir -p /app/var && chown tessera /app/var
USER tessera
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "4"]
