"""Just enough of Kubernetes' protobuf encoding to read what kubectl 1.32's typed clients send.

kubectl sends `application/vnd.kubernetes.protobuf` bodies for `create configmap` (and for the DELETE in
`drain`, whose DeleteOptions we ignore); a 415 is not retried as JSON, so the simulator must read them.
The body is the `k8s\\x00` magic followed by a runtime.Unknown {typeMeta, raw} wrapping the object.
"""

from __future__ import annotations

import base64

from simulator.errors import ApiError

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ApiError.bad_request("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Flat (field number, value) pairs; length-delimited values stay bytes for the caller to interpret."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ApiError.bad_request(f"unsupported protobuf wire type {wire}")
        fields.append((number, value))
    return fields


def _map_entry(data: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, raw in _fields(data):
        if number == 1:
            key = raw.decode()
        elif number == 2:
            value = raw
    return key, value


def _object_meta(data: bytes) -> dict:
    meta: dict = {}
    names = {1: "name", 2: "generateName", 3: "namespace", 6: "resourceVersion"}
    for number, raw in _fields(data):
        if number in names and raw:
            meta[names[number]] = raw.decode()
        elif number in (11, 12):
            key, value = _map_entry(raw)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = value.decode()
    return meta


def _config_map(raw: bytes) -> dict:
    obj: dict = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {}}
    for number, value in _fields(raw):
        if number == 1:
            obj["metadata"] = _object_meta(value)
        elif number == 2:
            key, text = _map_entry(value)
            obj.setdefault("data", {})[key] = text.decode()
        elif number == 3:
            key, blob = _map_entry(value)
            obj.setdefault("binaryData", {})[key] = base64.b64encode(blob).decode()
        elif number == 4:
            obj["immutable"] = bool(value)
    return obj


_DECODERS = {("v1", "ConfigMap"): _config_map}


def decode(body: bytes) -> dict:
    """Decode a protobuf request body into the JSON form of the object; unsupported kinds are a 415."""
    if not body.startswith(MAGIC):
        raise ApiError.bad_request("protobuf body without the k8s magic prefix")
    api_version = kind = ""
    raw = b""
    for number, value in _fields(body[len(MAGIC) :]):
        if number == 1:
            for meta_number, meta_value in _fields(value):
                if meta_number == 1:
                    api_version = meta_value.decode()
                elif meta_number == 2:
                    kind = meta_value.decode()
        elif number == 2:
            raw = value
    decoder = _DECODERS.get((api_version, kind))
    if decoder is None:
        raise ApiError.unsupported_media_type(f"{MEDIA_TYPE} ({api_version}/{kind})")
    return decoder(raw)
