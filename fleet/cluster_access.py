"""What a cluster's settings may make the worker read or fetch: kubeconfigs from one configured directory, without
credential plugins that run commands unless allowed, and metrics URLs on allowed hosts only.

An admin registers clusters; without these limits an admin could make the worker read any file it can read or
fetch any URL it can reach. The services check a cluster's settings when it is saved (a 400 per field); the worker
checks again when it reads or fetches, since settings and files change after a cluster was saved.
"""

import fnmatch
import ipaddress
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from django.conf import settings
from urllib3.exceptions import LocationParseError
from urllib3.util import Url, parse_url

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


# A last label of digits or hex: resolvers read such a host as an IPv4 address in any of inet_aton's forms
# (2852039166, 0251.0376.0251.0376, 0xa9fea9fe); only dotted decimal is compared with the allow-list as written.
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


def checked_metrics_url(url: str) -> str:
    """The URL the worker fetches: rebuilt from the parts urllib3 (the library that fetches) parsed, after its host
    was found on METRICS_URL_ALLOW (host patterns such as `*.svc`, or networks such as `10.0.0.0/8`). Raises
    AccessRefused.

    Forms on which URL parsers differ are refused rather than interpreted: userinfo (`user@`), backslashes,
    whitespace, control and non-ASCII characters, percent-encoding or a zone id in the host, IPv4 addresses not in
    dotted decimal, a trailing dot, and any URL that `urllib.parse` reads with another scheme, host or port."""
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise AccessRefused("Write the URL without spaces, control or non-ASCII characters (an IDN host in punycode).")
    if "\\" in url:
        raise AccessRefused("Write the URL without backslashes.")
    try:
        parts = parse_url(url)
        other = urlsplit(url)
        other_port = other.port
    except (LocationParseError, ValueError):
        raise AccessRefused("Not a valid URL.") from None
    if parts.scheme not in ("http", "https") or not parts.host:
        raise AccessRefused("Give an http:// or https:// URL.")
    if parts.auth is not None or other.username is not None or "@" in (other.netloc or ""):
        raise AccessRefused("Write the URL without a user name or password (nothing before an @ in the host).")
    host = parts.host.strip("[]")
    if "%" in host or "%" in (other.netloc or ""):
        raise AccessRefused("Write the host without percent-encoding or an IPv6 zone id.")
    if host.endswith("."):
        raise AccessRefused("Write the host without a trailing dot.")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None and _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
        raise AccessRefused("Write an IPv4 address as four decimal numbers (such as 10.0.0.1).")
    if (other.scheme, (other.hostname or ""), other_port) != (parts.scheme, host, parts.port):
        raise AccessRefused("The URL is read differently by different parsers; write it plainly.")
    if not _host_allowed(host, settings.TESSERA["METRICS_URL_ALLOW"]):
        raise AccessRefused(f"Host {host} is not allowed for metrics; {METRICS_ALLOW_SETTING} lists the allowed hosts.")
    return Url(scheme=parts.scheme, host=parts.host, port=parts.port, path=parts.path, query=parts.query).url


def metrics_url_refusal(url: str) -> str | None:
    """Why the worker may not fetch this metrics URL, or None (see checked_metrics_url)."""
    try:
        checked_metrics_url(url)
    except AccessRefused as exc:
        return str(exc)
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
