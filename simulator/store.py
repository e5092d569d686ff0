"""Object storage with etcd's semantics: one global resourceVersion, immutable snapshots, a bounded event history.

Stored objects are never mutated in place: every write stores a fresh dict, so list results, watch history and
the cached JSON of an entry stay valid without copying. Callers that want to change an object clone it first.
"""

from __future__ import annotations

import base64
import bisect
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from simulator.errors import ApiError
from simulator.ids import uuid4_text
from simulator.patches import apply_patch, clone
from simulator.resources import ResourceType

_clock: tuple[int, str] = (0, "")


def now_timestamp() -> str:
    """RFC 3339 seconds, as metadata timestamps are; formatted once per second (start-up asks 100,000 times)."""
    global _clock
    second = int(time.time())
    if _clock[0] != second:
        _clock = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _clock[1]


class Entry:
    """One stored version of an object, with its JSON encoded at most once."""

    __slots__ = ("obj", "_raw")

    def __init__(self, obj: dict):
        self.obj = obj
        self._raw: bytes | None = None

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = json.dumps(self.obj, separators=(",", ":")).encode()
        return self._raw

    @property
    def rv(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])


@dataclass(frozen=True)
class Change:
    """A committed write, as watchers and the simulated controllers see it."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: ResourceType
    namespace: str
    entry: Entry
    old: dict | None


@dataclass(frozen=True)
class StoreSnapshot:
    """Every stored object at one resourceVersion, for the state file; entries are immutable, so this copies none."""

    rv: int
    uid_state: tuple
    entries: dict[str, list[Entry]]  # by plural


Key = tuple[str, str]
Normalizer = Callable[[dict | None, dict], None]


class Store:
    def __init__(self, *, seed: int, history_size: int):
        self._lock = threading.Condition(threading.RLock())
        self._rv = 0
        self._objects: dict[str, dict[Key, Entry]] = {}
        self._keys: dict[str, list[Key]] = {}
        self._history: list[Change] = []
        self._history_base = 1  # rv of self._history[0]; every rv is exactly one change
        self._history_size = history_size  # changes kept after start-up
        self._loaded_rv = 0
        self._uids = random.Random(seed ^ 0x5EED)
        self._normalizers: dict[str, Normalizer] = {}
        self._listeners: list[Callable[[Change], None]] = []
        self._indexes: dict[str, tuple[Callable[[dict], str | None], dict[str, set[Key]]]] = {}
        self.closed = False
        self._frozen = False  # after the last snapshot of a stop: no write may follow it

    # -- wiring -------------------------------------------------------------------------------------------

    def set_normalizer(self, resource: ResourceType, normalizer: Normalizer) -> None:
        """Admission-like hook run under the lock on every write of a type (e.g. the cordon taint)."""
        self._normalizers[resource.plural] = normalizer

    def add_index(self, resource: ResourceType, key_of: Callable[[dict], str | None]) -> None:
        """One secondary index per type (pods by node): drain and the MIG Manager ask for it constantly."""
        with self._lock:
            index: dict[str, set[Key]] = {}
            for key, entry in self._objects.get(resource.plural, {}).items():
                value = key_of(entry.obj)
                if value is not None:
                    index.setdefault(value, set()).add(key)
            self._indexes[resource.plural] = (key_of, index)

    def add_listener(self, listener: Callable[[Change], None]) -> None:
        """Called under the lock, in commit order, for every change; it must only enqueue work."""
        self._listeners.append(listener)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def new_uid(self) -> str:
        with self._lock:
            return uuid4_text(self._uids.getrandbits(128))

    # -- reads --------------------------------------------------------------------------------------------

    def get(self, resource: ResourceType, namespace: str, name: str) -> Entry:
        with self._lock:
            entry = self._objects.get(resource.plural, {}).get((namespace, name))
        if entry is None:
            raise ApiError.not_found(resource.plural, name, resource.group)
        return entry

    def find(self, resource: ResourceType, namespace: str, name: str) -> dict | None:
        with self._lock:
            entry = self._objects.get(resource.plural, {}).get((namespace, name))
        return entry.obj if entry else None

    def list(
        self,
        resource: ResourceType,
        namespace: str | None = None,
        matcher: Callable[[dict], bool] | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        indexed_value: str | None = None,
    ) -> tuple[list[Entry], int, str | None]:
        """Entries in key order (within the index bucket `indexed_value` if given); with `limit`, a continue token."""
        start_key = _decode_continue(continue_token) if continue_token else None
        with self._lock:
            if indexed_value is not None:
                keys = sorted(self._indexes[resource.plural][1].get(indexed_value, ()))
            else:
                keys = self._keys.get(resource.plural, [])
            objects = self._objects.get(resource.plural, {})
            rv = self._rv
            if start_key is not None:
                start = bisect.bisect_right(keys, start_key)
            elif namespace is not None and resource.namespaced:
                start = bisect.bisect_left(keys, (namespace, ""))
            else:
                start = 0
            result: list[Entry] = []
            next_token = None
            for index in range(start, len(keys)):
                key = keys[index]
                if namespace is not None and resource.namespaced and key[0] != namespace:
                    if key[0] > namespace:
                        break
                    continue
                entry = objects[key]
                if matcher is None or matcher(entry.obj):
                    if limit and len(result) >= limit:
                        next_token = _encode_continue(result[-1].obj, rv)
                        break
                    result.append(entry)
        return result, rv, next_token

    def indexed(self, resource: ResourceType, value: str) -> list[dict]:
        return [entry.obj for entry in self.list(resource, indexed_value=value)[0]]

    def objects(self, resource: ResourceType) -> list[dict]:
        with self._lock:
            return [entry.obj for entry in self._objects.get(resource.plural, {}).values()]

    # -- writes -------------------------------------------------------------------------------------------

    def load(self, resource: ResourceType, objs: list[dict]) -> None:
        """Bulk insert at start-up, without listeners. Its ADDED events are kept until the first compaction, so a
        watch from any object's resourceVersion works on a fresh simulator as it would on a real cluster."""
        with self._lock:
            if self._rv != self._loaded_rv:
                raise RuntimeError("Store.load() is for start-up, before any change is recorded")
            table = self._objects.setdefault(resource.plural, {})
            for obj in objs:
                self._rv += 1
                self._fill_metadata(resource, obj)
                key = self._key(resource, obj)
                self._reindex(resource, key, None, obj)
                entry = Entry(obj)
                table[key] = entry
                self._history.append(Change(self._rv, "ADDED", resource, key[0], entry, None))
            self._keys[resource.plural] = sorted(table)
            self._loaded_rv = self._rv

    def start_at(self, rv: int) -> None:
        """Start-up where an earlier cluster handed out versions up to `rv`: versions go on above them, and a watch
        from one of those gets 410 Gone (no history reaches back), so its client lists again."""
        with self._lock:
            if self._rv:
                raise RuntimeError("Store.start_at() is for start-up, on an empty store")
            self._rv = self._loaded_rv = rv
            self._history_base = rv + 1

    def restore(self, rv: int, uid_state: list, objects: dict[ResourceType, list[dict]]) -> None:
        """Start-up from a saved snapshot instead of `load()`: objects keep their resourceVersions and the counter goes
        on from `rv`, with no history (see `start_at`)."""
        with self._lock:
            self.start_at(rv)
            for resource, objs in objects.items():
                table = self._objects.setdefault(resource.plural, {})
                for obj in objs:
                    key = self._key(resource, obj)
                    self._reindex(resource, key, None, obj)
                    table[key] = Entry(obj)
                self._keys[resource.plural] = sorted(table)
            self._uids.setstate((uid_state[0], tuple(uid_state[1]), uid_state[2]))

    def snapshot(self, *, final: bool = False) -> StoreSnapshot:
        """`final` (a clean stop): later writes are refused with 503, so none is lost after the state saved last."""
        with self._lock:
            self._frozen = final
            entries = {plural: list(table.values()) for plural, table in self._objects.items()}
            return StoreSnapshot(self._rv, self._uids.getstate(), entries)

    def create(self, resource: ResourceType, obj: dict) -> dict:
        with self._lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(self._uids.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            if not meta.get("name"):
                raise ApiError.invalid(
                    resource.plural, "", "metadata.name: Required value: name or generateName is required"
                )
            key = self._key(resource, obj)
            if key in self._objects.get(resource.plural, {}):
                raise ApiError.already_exists(resource.plural, meta["name"], resource.group)
            meta.pop("resourceVersion", None)
            return self._commit(resource, key, None, obj)

    def replace(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        obj: dict,
        keep: tuple[str, ...] = (),
        keep_all_but: tuple[str, ...] | None = None,
    ) -> dict:
        """PUT: unconditional without a resourceVersion, 409 when it is stale; `keep` fields are not writable, or,
        with `keep_all_but` (a status subresource), only those fields are."""
        with self._lock:
            current = self.get(resource, namespace, name).obj
            meta = obj.setdefault("metadata", {})
            wanted = meta.get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(resource.plural, name, resource.group)
            if meta.get("name", name) != name:
                raise ApiError.bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL"
                )
            _keep(current, obj, _kept(current, obj, keep, keep_all_but))
            return self._commit(resource, (namespace, name), current, obj)

    def patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        keep: tuple[str, ...] = (),
        keep_all_but: tuple[str, ...] | None = None,
    ) -> dict:
        """A resourceVersion inside a merge patch is a precondition, as on the real server."""
        with self._lock:
            current = self.get(resource, namespace, name).obj
            patched = clone(apply_patch(current, content_type, body))
            meta = patched.setdefault("metadata", {})
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(resource.plural, name, resource.group)
            if meta.get("name") != name:
                raise ApiError.bad_request("metadata.name cannot be changed by a patch")
            _keep(current, patched, _kept(current, patched, keep, keep_all_but))
            return self._commit(resource, (namespace, name), current, patched)

    def mutate(self, resource: ResourceType, namespace: str, name: str, change: Callable[[dict], None]) -> dict | None:
        """Internal read-modify-write (the simulated controllers); returns None when the object is gone."""
        with self._lock:
            entry = self._objects.get(resource.plural, {}).get((namespace, name))
            if entry is None:
                return None
            updated = clone(entry.obj)
            change(updated)
            return self._commit(resource, (namespace, name), entry.obj, updated)

    def delete(self, resource: ResourceType, namespace: str, name: str) -> dict:
        with self._lock:
            key = (namespace, name)
            current = self.get(resource, namespace, name).obj
            self._refuse_if_frozen()
            del self._objects[resource.plural][key]
            keys = self._keys[resource.plural]
            del keys[bisect.bisect_left(keys, key)]
            self._reindex(resource, key, current, None)
            self._rv += 1
            final = dict(current)
            final["metadata"] = dict(current["metadata"], resourceVersion=str(self._rv))
            self._record(Change(self._rv, "DELETED", resource, namespace, Entry(final), current))
            return final

    def _commit(self, resource: ResourceType, key: Key, old: dict | None, new: dict) -> dict:
        self._refuse_if_frozen()
        normalizer = self._normalizers.get(resource.plural)
        if normalizer:
            normalizer(old, new)
        new["kind"] = resource.kind
        new["apiVersion"] = resource.api_version
        if old is not None:
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            for immutable in ("uid", "creationTimestamp", "name", "namespace"):
                if immutable in old["metadata"]:
                    new["metadata"][immutable] = old["metadata"][immutable]
            if new == old:
                return old  # a no-op write keeps its resourceVersion and wakes no watcher
        self._rv += 1
        self._fill_metadata(resource, new)
        self._reindex(resource, key, old, new)
        entry = Entry(new)
        table = self._objects.setdefault(resource.plural, {})
        if key not in table:
            bisect.insort(self._keys.setdefault(resource.plural, []), key)
        table[key] = entry
        self._record(Change(self._rv, "ADDED" if old is None else "MODIFIED", resource, key[0], entry, old))
        return new

    def _refuse_if_frozen(self) -> None:
        if self._frozen:
            raise ApiError(503, "ServiceUnavailable", "the API server is shutting down")

    def _fill_metadata(self, resource: ResourceType, obj: dict) -> None:
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        if "uid" not in meta:
            meta["uid"] = uuid4_text(self._uids.getrandbits(128))
        meta.setdefault("creationTimestamp", now_timestamp())
        if not resource.namespaced:
            meta.pop("namespace", None)

    def _reindex(self, resource: ResourceType, key: Key, old: dict | None, new: dict | None) -> None:
        if resource.plural not in self._indexes:
            return
        key_of, index = self._indexes[resource.plural]
        before, after = key_of(old) if old else None, key_of(new) if new else None
        if before == after:
            return
        if before is not None:
            index[before].discard(key)
        if after is not None:
            index.setdefault(after, set()).add(key)

    @staticmethod
    def _key(resource: ResourceType, obj: dict) -> Key:
        meta = obj["metadata"]
        return (meta.get("namespace", "") if resource.namespaced else "", meta["name"])

    def _record(self, change: Change) -> None:
        self._history.append(change)
        if len(self._history) > self._history_size and self._rv - self._loaded_rv > self._history_size:
            dropped = len(self._history) - self._history_size * 3 // 4
            del self._history[:dropped]
            self._history_base += dropped
        for listener in self._listeners:
            listener(change)
        self._lock.notify_all()

    # -- watch --------------------------------------------------------------------------------------------

    def changes_since(self, rv: int, timeout: float) -> tuple[list[Change], int]:
        """Changes after `rv` (waiting up to `timeout` for one); 410 Gone if the history no longer reaches back."""
        with self._lock:
            if rv + 1 < self._history_base:
                raise ApiError.gone(f"too old resource version: {rv} ({self._history_base - 1})")
            if rv >= self._rv and not self.closed:
                self._lock.wait(timeout)
            if rv + 1 < self._history_base:
                raise ApiError.gone(f"too old resource version: {rv} ({self._history_base - 1})")
            start = rv + 1 - self._history_base
            batch = self._history[start : start + 1000]
            return batch, (batch[-1].rv if batch else rv)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._lock.notify_all()


def _keep(current: dict, new: dict, fields: tuple[str, ...]) -> None:
    """Top-level fields the main resource endpoint may not change (status, as for real nodes and pods)."""
    for name in fields:
        if name in current:
            new[name] = clone(current[name])
        else:
            new.pop(name, None)


def _kept(current: dict, new: dict, keep: tuple[str, ...], keep_all_but: tuple[str, ...] | None) -> tuple[str, ...]:
    """Top-level fields a write may not change; metadata stays writable (its resourceVersion is the precondition)."""
    if keep_all_but is None:
        return keep
    return tuple(k for k in {*current, *new} if k not in keep_all_but and k not in ("metadata", "kind", "apiVersion"))


def _encode_continue(last_obj: dict, rv: int) -> str:
    meta = last_obj["metadata"]
    token = {"rv": rv, "ns": meta.get("namespace", ""), "name": meta["name"]}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def _decode_continue(token: str) -> Key:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (data["ns"], data["name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError.bad_request(f"invalid continue token: {token!r}") from exc
