"""The embedded broker under load: several producers and consumers in separate processes, every message delivered
exactly once and whole, no consumer crashing (kombu's own filesystem transport half-reads and loses messages here)."""

import json
import multiprocessing
import os
import time
from queue import Empty

import pytest
from kombu import Connection

from core import broker

PRODUCERS, CONSUMERS, PER_PRODUCER = 3, 4, 1000


def _options(root) -> dict:
    folders = {"data_folder_in": root / "queue", "data_folder_out": root / "queue", "processed_folder": root / "claims"}
    for folder in {*folders.values(), root / "control"}:
        folder.mkdir(parents=True, exist_ok=True)
    return {
        **{k: str(v) for k, v in folders.items()},
        "control_folder": str(root / "control"),
        "polling_interval": 0.01,
    }


def _produce(options: dict, producer: int) -> None:
    with Connection(f"{broker.SCHEME}://", transport_options=options) as conn:
        queue = conn.SimpleQueue("hammer")
        for n in range(PER_PRODUCER):
            queue.put({"id": f"{producer}-{n}", "pad": "x" * (n % 7) * 200})
        queue.close()


def _consume(options: dict, out_path: str, deadline: float) -> None:
    seen = []
    with Connection(f"{broker.SCHEME}://", transport_options=options) as conn:
        queue = conn.SimpleQueue("hammer")
        idle_since = None
        while time.monotonic() < deadline:
            try:
                message = queue.get(timeout=0.2)
            except Empty:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 3:
                    break
                continue
            idle_since = None
            seen.append(message.payload["id"])
            message.ack()
        queue.close()
    with open(out_path, "w") as f:
        json.dump(seen, f)


def test_many_producers_and_consumers_deliver_every_message_exactly_once(tmp_path):
    options = _options(tmp_path / "broker")
    # Registered as config/celery.py does; the children inherit it (fork) or import it again (spawn).
    ctx = multiprocessing.get_context("fork")
    deadline = time.monotonic() + 240
    consumers = [
        ctx.Process(target=_consume, args=(options, str(tmp_path / f"seen-{c}.json"), deadline))
        for c in range(CONSUMERS)
    ]
    producers = [ctx.Process(target=_produce, args=(options, p)) for p in range(PRODUCERS)]
    for process in consumers + producers:
        process.start()
    for process in producers + consumers:
        process.join(timeout=300)
    assert [p.exitcode for p in producers + consumers] == [0] * (PRODUCERS + CONSUMERS), "a process crashed"

    seen = [i for c in range(CONSUMERS) for i in json.loads((tmp_path / f"seen-{c}.json").read_text())]
    expected = {f"{p}-{n}" for p in range(PRODUCERS) for n in range(PER_PRODUCER)}
    assert len(seen) == len(expected), f"{len(seen) - len(set(seen))} duplicates, {len(expected - set(seen))} lost"
    assert set(seen) == expected
    assert sum(1 for c in range(CONSUMERS) if json.loads((tmp_path / f"seen-{c}.json").read_text())) > 1
    assert os.listdir(options["data_folder_in"]) == [] and os.listdir(options["processed_folder"]) == []


def test_a_claim_left_by_a_dead_consumer_goes_back_on_the_queue(tmp_path, monkeypatch):
    options = _options(tmp_path / "broker")
    with Connection(f"{broker.SCHEME}://", transport_options=options) as conn:
        queue = conn.SimpleQueue("orphans")
        queue.put({"id": "lost-once"})
        # A consumer that died between claiming and reading: the message sits in the claim folder.
        (name,) = [f for f in os.listdir(options["data_folder_in"]) if f.endswith(".orphans.msg")]
        claimed = os.path.join(options["processed_folder"], f"4242-deadbeef-{name}")
        os.rename(os.path.join(options["data_folder_in"], name), claimed)
        with pytest.raises(Empty):
            queue.get(timeout=0.1)
        monkeypatch.setattr(broker, "ORPHAN_SECONDS", 0)
        monkeypatch.setattr(broker, "SWEEP_SECONDS", 0)
        os.utime(claimed, (time.time() - 1, time.time() - 1))
        conn.default_channel._next_sweep = 0.0
        # The next empty poll sweeps the claim back onto the queue, and the same get() then receives it.
        assert queue.get(timeout=2).payload == {"id": "lost-once"}
        assert os.listdir(options["processed_folder"]) == []
        queue.close()


def test_a_half_written_message_is_never_seen(tmp_path):
    options = _options(tmp_path / "broker")
    part = os.path.join(options["data_folder_out"], f".{broker._message_name('halves')}.part")
    with open(part, "w") as f:
        f.write('{"body": ')  # a producer still writing (or dead mid-write)
    with Connection(f"{broker.SCHEME}://", transport_options=options) as conn:
        queue = conn.SimpleQueue("halves")
        with pytest.raises(Empty):
            queue.get(timeout=0.2)
        assert queue.qsize() == 0
        queue.close()
