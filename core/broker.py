"""The embedded broker: kombu's filesystem transport, made safe for several producers and consumers on one machine.

kombu's own `_put` creates the message file and then writes it, so a consumer polling the folder can claim the empty
file, fail to parse it (`JSONDecodeError: Expecting value`, which stops a Celery worker) and lose the message. Here a
producer writes `.<name>.part` (which no consumer matches) and renames it into place, and a consumer claims a file by
renaming it into its own folder on the same filesystem: both renames are atomic, so a message is seen whole or not at
all, and exactly one consumer wins it. A consumer that dies between claiming and reading leaves the claim behind; it
goes back on the queue after `ORPHAN_SECONDS` (at-least-once: tasks are idempotent, and every state change is in the
database before a task acts on it, so a lost or repeated message only delays work).

Used by `make run` as `tessera-fs://` (registered in `config/celery.py`); production uses Redis.
"""

import os
import time
import uuid
from queue import Empty

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

SCHEME = "tessera-fs"
ORPHAN_SECONDS = 300
SWEEP_SECONDS = 30
_PART = ".part"


def _message_name(queue: str) -> str:
    # Milliseconds first: a sorted listing is oldest first, as in kombu's transport.
    return f"{time.time_ns() // 1_000_000:015d}_{uuid.uuid4().hex}.{queue}.msg"


class Channel(filesystem.Channel):
    """Atomic put (write aside, rename in) and atomic claim (rename into the claim folder, then read and remove)."""

    def _put(self, queue, payload, **kwargs):
        name = _message_name(queue)
        part = os.path.join(self.data_folder_out, f".{name}{_PART}")
        with open(part, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(part, os.path.join(self.data_folder_out, name))

    @property
    def claim_folder(self) -> str:
        return self.processed_folder

    def _get(self, queue):
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.startswith(".") or filename.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(self.claim_folder, f"{os.getpid()}-{uuid.uuid4().hex[:8]}-{filename}")
            try:
                os.rename(os.path.join(self.data_folder_in, filename), claimed)
            except FileNotFoundError:
                continue  # another consumer won it
            with open(claimed, "rb") as f:
                payload = f.read()
            os.remove(claimed)
            return loads(bytes_to_str(payload))
        if time.monotonic() >= getattr(self, "_next_sweep", 0.0):
            self._next_sweep = time.monotonic() + SWEEP_SECONDS
            self._requeue_orphans()
        raise Empty()

    def _requeue_orphans(self) -> None:
        """Put back claims whose consumer died before reading them, and drop parts whose producer died."""
        cutoff = time.time() - ORPHAN_SECONDS
        for folder in (self.claim_folder, self.data_folder_out):
            for filename in os.listdir(folder):
                path = os.path.join(folder, filename)
                try:
                    if os.stat(path).st_mtime > cutoff:
                        continue
                    if folder == self.claim_folder:
                        os.rename(path, os.path.join(self.data_folder_in, filename.split("-", 2)[2]))
                    elif filename.endswith(_PART):
                        os.remove(path)
                except FileNotFoundError:
                    continue


class Transport(filesystem.Transport):
    Channel = Channel
