"""Documents on disk: YAML files read with the line of every field (so an error names file and line), checked
against the schema the client ships, and written back in a stable layout by `export`."""

import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from tessera_cli.schema import validate

SCHEMA_FILE = "tessera.schema.json"
# Where export writes each kind: a directory, and the identity fields that name the file inside it.
LAYOUT = {
    "QoSPolicy": ("qos-policies", ("name",)),
    "Profile": ("profiles", ("name",)),
    "Pool": ("pools", ("cluster", "name")),
    "Schedule": ("schedules", ("cluster", "pool")),
    "KueueBinding": ("kueue-bindings", ("cluster", "pool")),
}


def shipped_schema() -> dict:
    return json.loads(resources.files("tessera_cli").joinpath("schema.json").read_text())


class _Loader(yaml.SafeLoader):
    """YAML as people mean it in these files: `10:00` is a time (a string), not YAML 1.1's base-60 integer 600,
    and `2026-12-25` a date string, not a date object."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


@dataclass
class Document:
    """One document, where it comes from, and the line of each path in it (a tuple of keys and indexes)."""

    value: dict
    file: str
    lines: dict[tuple, int] = field(default_factory=dict)

    @property
    def line(self) -> int:
        return self.lines.get((), 1)

    def line_of(self, path: tuple) -> int:
        """The line of `path`, or of its nearest parent the file has."""
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, self.line)

    @property
    def key(self) -> str:
        kind = self.value.get("kind", "?")
        parts = LAYOUT.get(kind, ("", ("name",)))[1]
        return "/".join([str(kind), *(str(self.value.get(p, "?")) for p in parts)])


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    key: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"{self.file}:{self.line}: {where}{self.field + ': ' if self.field else ''}{self.message}"


class DocumentsError(Exception):
    def __init__(self, problems: list[Problem]):
        super().__init__(f"{len(problems)} problem(s) in the files")
        self.problems = problems


def _lines(node, path: tuple = ()) -> dict[tuple, int]:
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value)
            lines.update(_lines(value_node, child))
            lines[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_lines(item, (*path, i)))
    return lines


def _files(directory: Path) -> list[Path]:
    if directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise DocumentsError([Problem(str(directory), 0, "", "", "No such file or directory.")])
    return sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def load(directory: Path) -> list[Document]:
    """Every document of every YAML file under `directory` (sorted by path), each checked against the shipped
    schema; raises DocumentsError listing every problem with its file and line."""
    documents, problems = [], []
    schema = shipped_schema()
    for path in _files(directory):
        name = str(path.relative_to(directory)) if directory.is_dir() else str(path)
        loader = _Loader(path.read_text(encoding="utf-8"))
        try:
            while loader.check_node():
                node = loader.get_node()
                value = loader.construct_document(node)
                if value is None:
                    continue
                document = Document(value, name, _lines(node))
                if not isinstance(value, dict):
                    problems.append(Problem(name, document.line, "", "", "A document is a mapping with a `kind`."))
                    continue
                documents.append(document)
                for error_path, message in validate(value, schema):
                    field_name = _path_text(error_path)
                    problems.append(Problem(name, document.line_of(error_path), document.key, field_name, message))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problems.append(Problem(name, mark.line + 1 if mark else 1, "", "", f"Not YAML: {exc}"))
        finally:
            loader.dispose()
    if problems:
        raise DocumentsError(problems)
    return documents


def _path_text(path) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return text.lstrip(".")


_SERVER_PATH = re.compile(r"^documents\[(\d+)\]\.?(.*)$")


def server_problems(documents: list[Document], errors: dict) -> list[Problem]:
    """The server's errors (`documents[3].windows[0].profile`: [...]) at the file and line they are about."""
    problems = []
    for where, messages in errors.items():
        match = _SERVER_PATH.match(where)
        for message in messages if isinstance(messages, list) else [messages]:
            if match and int(match.group(1)) < len(documents):
                document = documents[int(match.group(1))]
                path = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", match.group(2)))
                problems.append(Problem(document.file, document.line_of(path), document.key, match.group(2), message))
            else:
                problems.append(Problem("(server)", 0, "", where, str(message)))
    return problems


def digest(documents: list[Document]) -> str:
    """What a saved plan was made from: apply with that plan refuses other files."""
    text = json.dumps([d.value for d in documents], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _file_name(parts: list[str]) -> str:
    return "_".join(re.sub(r"[^A-Za-z0-9._-]", "_", p) or "_" for p in parts)


def write(directory: Path, documents: list[dict]) -> list[Path]:
    """Write `documents` (in the server's order) one file each, `<kind dir>/<cluster>/<name>.yaml`, replacing the
    YAML files export wrote before (an object gone from the server must not come back on the next apply)."""
    directory.mkdir(parents=True, exist_ok=True)
    for folder, _ in LAYOUT.values():
        for old in sorted((directory / folder).rglob("*.yaml")) if (directory / folder).is_dir() else []:
            old.unlink()
    (directory / SCHEMA_FILE).write_text(json.dumps(shipped_schema(), indent=2) + "\n")
    written = []
    for document in documents:
        folder, parts = LAYOUT[document["kind"]]
        values = [str(document[p]) for p in parts]
        path = directory / folder / Path(*[_file_name([v]) for v in values[:-1]]) / f"{_file_name(values[-1:])}.yaml"
        if path in written:  # two names that only differ in characters a file name cannot hold
            path = path.with_name(f"{path.stem}-{hashlib.sha256('/'.join(values).encode()).hexdigest()[:8]}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        relative = Path(*[".."] * (len(path.relative_to(directory).parts) - 1), SCHEMA_FILE)
        header = f"# yaml-language-server: $schema={relative.as_posix()}\n"
        path.write_text(header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120))
        written.append(path)
    return written
