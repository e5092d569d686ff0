"""The protobuf envelope kubectl 1.32 sends for `create configmap`."""

import pytest

from simulator import protobuf
from simulator.errors import ApiError


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def _entry(key: str, value: str) -> bytes:
    return _field(1, key.encode()) + _field(2, value.encode())


def test_decodes_a_configmap_like_kubectl_sends_it():
    meta = _field(1, b"tessera") + _field(3, b"gpu-operator") + _field(11, _entry("team", "ml"))
    config_map = (
        _field(1, meta) + _field(2, _entry("config.yaml", "version: v1\n")) + _field(3, _entry("blob", "\x00\x01"))
    )
    config_map += bytes([4 << 3, 1])  # immutable: true
    body = protobuf.MAGIC + _field(1, _field(1, b"v1") + _field(2, b"ConfigMap")) + _field(2, config_map)
    assert protobuf.decode(body) == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "tessera", "namespace": "gpu-operator", "labels": {"team": "ml"}},
        "data": {"config.yaml": "version: v1\n"},
        "binaryData": {"blob": "AAE="},
        "immutable": True,
    }


def test_other_kinds_are_unsupported_media():
    body = protobuf.MAGIC + _field(1, _field(1, b"v1") + _field(2, b"Secret")) + _field(2, b"")
    with pytest.raises(ApiError) as error:
        protobuf.decode(body)
    assert error.value.code == 415
