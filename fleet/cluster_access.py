"""What a cluster's settings may make the worker read or fetch: kubeconfigs from one configured directory, without
credential plugins that run commands unless allowed, and metrics URLs on allowed hosts only.

An admin registers clusters; without these limits an admin could make the worker read any file it can read or
fetch any URL it can reach. The services check a cluster's settings when it is saved (a 400 per field); the worker
checks again when it reads or fetches, since settings and files change after a cluster was saved.
"""

import fnmatch
import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from django.conf import settings

KUBECONFIG_DIR_SETTING = 'TESSERA["KUBECONFIG_DIR"] (TESSERA_KUBECONFIG_DIR)'
KUBECONFIG_EXEC_SETTING = 'TESSERA["KUBECONFIG_ALLOW_EXEC"] (TESSERA_KUBECONFIG_ALLOW_EXEC)'
METRICS_ALLOW_SETTING = 'TESSERA["METRICS_URL_ALLOW"] (TESSERA_METRICS_URL_ALLOW)'


class AccessRefused(ValueError):
    """A cluster setting points outside what settings allow; the message names no path and no file content."""


def kubeconfig_dir() -> Path:
    return Path(os.path.realpath(settings.TESSERA["KUBECONFIG_DIR"]))


def kubeconfig_resolve(path: str) -> Path:
    """The real path of a kubeconfig inside the directory (relative paths are read from it); symlinks leading out of
    it are refused like absolute paths outside it."""
    base = kubeconfig_dir()
    real = Path(os.path.realpath(base / path))
    if not real.is_relative_to(base):
        raise AccessRefused(f"Kubeconfigs are read from the directory of {KUBECONFIG_DIR_SETTING} only.")
    return real


def kubeconfig_refusal(config) -> str | None:
    """Why this kubeconfig may not be used, or None: credential plugins (`exec`, an auth provider's `cmd-path`)
    run a command in the worker, so they need KUBECONFIG_ALLOW_EXEC."""
    if not isinstance(config, dict):
        return "The file is not a kubeconfig."
    if settings.TESSERA["KUBECONFIG_ALLOW_EXEC"]:
        return None
    users = config.get("users")
    for entry in users if isinstance(users, list) else []:
        user = entry.get("user") if isinstance(entry, dict) else None
        if not isinstance(user, dict):
            continue
        provider = user.get("auth-provider")
        provider_config = provider.get("config") if isinstance(provider, dict) else None
        if "exec" in user or (isinstance(provider_config, dict) and "cmd-path" in provider_config):
            return f"The kubeconfig runs a credential plugin (exec); that needs {KUBECONFIG_EXEC_SETTING}."
    return None


def kubeconfig_read(path: str) -> tuple[dict, Path]:
    """The kubeconfig as a dict and its real path, for the worker: inside the directory and without a refused
    credential plugin. Raises AccessRefused, OSError or yaml.YAMLError."""
    real = kubeconfig_resolve(path)
    config = yaml.safe_load(real.read_text())
    refusal = kubeconfig_refusal(config)
    if refusal:
        raise AccessRefused(refusal)
    return config, real


def _host_allowed(host: str, patterns) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in patterns:
        pattern = pattern.strip().lower().strip("[]")
        if address is not None and "/" in pattern:
            try:
                if address in ipaddress.ip_network(pattern, strict=False):
                    return True
            except ValueError:
                continue
        elif fnmatch.fnmatchcase(host, pattern):
            return True
    return False


def metrics_url_refusal(url: str) -> str | None:
    """Why the worker may not fetch this metrics URL, or None: http(s) to a host METRICS_URL_ALLOW names (host
    patterns such as `*.svc`, or networks such as `10.0.0.0/8`)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return "Not a valid URL."
    if parts.scheme not in ("http", "https") or not host:
        return "Give an http:// or https:// URL."
    if not _host_allowed(host, settings.TESSERA["METRICS_URL_ALLOW"]):
        return f"Host {host} is not allowed for metrics; {METRICS_ALLOW_SETTING} lists the allowed hosts."
    return None


def cluster_access_errors(
    *, kubeconfig_path: str = "", metrics_url: str = "", prometheus_url: str = ""
) -> dict[str, list[str]]:
    """Per-field problems of a cluster's settings when it is saved. A kubeconfig not there yet is accepted (a Secret
    mounted later); the worker reports it until it is."""
    errors: dict[str, list[str]] = {}
    if kubeconfig_path:
        try:
            real = kubeconfig_resolve(kubeconfig_path)
            if real.is_file():
                refusal = kubeconfig_refusal(yaml.safe_load(real.read_text()))
                if refusal:
                    errors["kubeconfig_path"] = [refusal]
        except AccessRefused as exc:
            errors["kubeconfig_path"] = [str(exc)]
        except (OSError, yaml.YAMLError):
            errors["kubeconfig_path"] = ["The kubeconfig cannot be read as YAML."]
    for field, url in (("metrics_url", metrics_url), ("prometheus_url", prometheus_url)):
        refusal = metrics_url_refusal(url) if url else None
        if refusal:
            errors[field] = [refusal]
    return errors
