"""YAML read from a cluster is bounded (issue 25, point 3): size, values with aliases expanded, depth, scalar
length; each failure is a Rejected, the refusal the import and the worker already give for a file mig-parted
refuses. Each hostile text is parsed in a child process with a time and memory limit, so that code without the
bounds fails the test (a timeout, MemoryError or RecursionError) instead of hanging or crashing the suite."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sharing import nvidia_configs as nc

ROOT = Path(__file__).resolve().parents[2]
_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from sharing.nvidia_configs import Rejected, read_mig_parted
try:
    read_mig_parted(sys.stdin.read())
except Rejected as error:
    print(json.dumps({"refused": str(error), "rule": error.rule}))
except BaseException as error:
    print(json.dumps({"crashed": f"{type(error).__name__}: {str(error)[:200]}"}))
else:
    print(json.dumps({"accepted": True}))
"""


def read_in_child(text: str, timeout: float = 30) -> dict:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], input=text, capture_output=True, text=True, cwd=ROOT, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {len(text)} characters took over {timeout} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


# Billion laughs in 335 bytes: each line a list of nine aliases of the one before, so `h` names 9**8 strings (the
# issue's 336-byte file cost 34 s and 570 MiB to read before the bounds).
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{before}'] * 9)}]\n" for before, name in zip("abcdefg", "bcdefgh", strict=True)
)
MIG = "version: v1\nmig-configs:\n  c:\n    - {devices: DEVICES, mig-enabled: false}\n"


@pytest.mark.parametrize(
    ("text", "words", "rule"),
    [
        (BOMB, "more than 20,000 values, aliases expanded (line 5)", nc.RULE_BOUNDS),
        ("a: &a [*a]\n", "anchor 'a' value contains itself", nc.RULE_YAML),
        ("a: &a {b: [c, *a]}\n", "anchor 'a' value contains itself", nc.RULE_YAML),
        (
            MIG.replace("DEVICES", "[" + "9" * 5000 + "]"),
            "a value longer than 4,096 characters (line 4)",
            nc.RULE_BOUNDS,
        ),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper than 64 levels", nc.RULE_BOUNDS),
        ("a: [" + "1, " * 30_000 + "]\n", "more than 20,000 values", nc.RULE_BOUNDS),
        (MIG.replace("DEVICES", "all") + "# padding\n" * 30_000, "over 262,144; Tessera reads no more", nc.RULE_BOUNDS),
    ],
    ids=[
        "alias-bomb",
        "recursive-alias",
        "recursive-alias-in-a-map",
        "long-integer",
        "deep",
        "many-values",
        "oversize",
    ],
)
def test_hostile_yaml_is_refused_with_a_reason(text, words, rule):
    outcome = read_in_child(text)
    assert words in outcome.get("refused", ""), outcome
    assert outcome["rule"] == rule


def test_aliases_within_the_bounds_read_as_go_yaml_reads_them():
    text = "filters: &f [0x20B010DE, '0x20B210DE']\nmig-configs: {a: {f: *f}, b: {f: *f}}\n"
    assert nc.load_yaml(text) == {
        "filters": [0x20B010DE, "0x20B210DE"],
        "mig-configs": {"a": {"f": [0x20B010DE, "0x20B210DE"]}, "b": {"f": [0x20B010DE, "0x20B210DE"]}},
    }


def test_each_reader_gets_its_own_copy_of_a_cached_parse():
    text = "version: v1\nflags: {migStrategy: mixed}\n"
    first = nc.load_yaml(text)
    first["flags"]["migStrategy"] = "none"
    assert nc.load_yaml(text)["flags"]["migStrategy"] == "mixed"
