"""A self-signed serving certificate (openssl CLI), the bearer token, and the kubeconfig that trusts them.

In a state directory both are kept across restarts, so a kubeconfig written before a restart still works after it.

client-go never sends a bearer token over plain HTTP, so kubectl needs HTTPS; the official Python client
reads the same `certificate-authority-data`.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import ssl
import subprocess
from pathlib import Path

import yaml


def certificate(directory: Path, host: str) -> tuple[Path, Path]:
    """An EC P-256 certificate valid for `host`, 127.0.0.1 and localhost: the one in `directory` if it is that and
    valid for another day, else a new one; returns (cert, key) paths."""
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    names = {"DNS:localhost", "IP:127.0.0.1"}
    try:
        ipaddress.ip_address(host)
        names.add(f"IP:{host}")
    except ValueError:
        names.add(f"DNS:{host}")
    if not (cert.exists() and key.exists() and _still_valid(cert, names)):
        _create(cert, key, names)
    return cert, key


def _still_valid(cert: Path, names: set[str]) -> bool:
    check = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-checkend", "86400", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
    )
    listed = next((line for line in check.stdout.splitlines() if "DNS:" in line or "IP Address:" in line), "")
    return check.returncode == 0 and {name.strip().replace("IP Address:", "IP:") for name in listed.split(",")} == names


def _create(cert: Path, key: Path, names: set[str]) -> None:
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "365",
            "-subj",
            "/CN=tessera-simulator",
            "-addext",
            "subjectAltName=" + ",".join(sorted(names)),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyCertSign",
            "-addext",
            "extendedKeyUsage=serverAuth",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    os.chmod(key, 0o600)


def saved_token(directory: Path, new_token: str) -> str:
    """The bearer token kept in `directory`, or `new_token`, kept there from now on."""
    path = directory / "token"
    try:
        return path.read_text().strip() or new_token
    except FileNotFoundError:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(new_token)
        return new_token


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])  # never negotiate h2: the server speaks HTTP/1.1 only
    return context


def write_kubeconfig(path: Path, url: str, cert: Path, token: str, name: str = "tessera-sim") -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": url,
                    "certificate-authority-data": base64.b64encode(cert.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": f"{name}-admin", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin"}}],
        "current-context": name,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.chmod(path, 0o600)
