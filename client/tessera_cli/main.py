"""`tessera export DIR`, `tessera diff -f DIR`, `tessera apply -f DIR`, `tessera validate -f DIR`.

Exit codes for pipelines: 0 no change (apply: done), 2 changes planned (diff), 1 error."""

import argparse
import json
import os
import sys
from pathlib import Path

from tessera_cli import files, render
from tessera_cli.api import Api, ApiError

NO_CHANGE, ERROR, CHANGES = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera", description="Tessera's profiles, pools, schedules, QoS policies and Kueue bindings as files."
    )
    parser.add_argument("--url", default=os.environ.get("TESSERA_URL", ""), help="server (default: $TESSERA_URL)")
    parser.add_argument(
        "--token", default=os.environ.get("TESSERA_TOKEN", ""), help="API token (default: $TESSERA_TOKEN)"
    )
    parser.add_argument("--output", choices=["text", "json"], default="text")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write the server's desired state into DIR")
    export.add_argument("directory", type=Path)
    for name, text in (("diff", "print the plan; exit 2 when it changes something"), ("apply", "carry the plan out")):
        command = commands.add_parser(name, help=text)
        command.add_argument("-f", "--filename", type=Path, required=True, help="a directory of YAML files, or one")
        command.add_argument("--prune", action="store_true", help="also delete what the files no longer name")
    commands.choices["diff"].add_argument("--save-plan", type=Path, help="write the plan here, for `apply --plan`")
    commands.choices["apply"].add_argument(
        "--plan", type=Path, help="a plan saved by `diff --save-plan`: refused if anything in it changed since"
    )
    commands.choices["apply"].add_argument("-m", "--message", default="", help="kept in the audit log (e.g. commit)")
    validate = commands.add_parser("validate", help="check the files against the schema, offline")
    validate.add_argument("-f", "--filename", type=Path, required=True)
    return parser


def _out(args, text: str, data: dict) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.output == "json" else text)


def _fail(args, message: str, problems: list[files.Problem]) -> int:
    if args.output == "json":
        rows = [
            {"file": p.file, "line": p.line, "object": p.key, "field": p.field, "message": p.message} for p in problems
        ]
        print(json.dumps({"error": message, "problems": rows}, indent=2, ensure_ascii=False))
    else:
        print(f"tessera: {message}", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    return ERROR


def _export(args, api: Api) -> int:
    answer = api.get("config/documents/")
    written = files.write(args.directory, answer["documents"])
    _out(args, f"Wrote {len(written)} document(s) to {args.directory}.", {"documents": len(written)})
    return NO_CHANGE


def _plan(api: Api, documents: list[files.Document], prune: bool) -> dict:
    return api.post("config/plan/", {"documents": [d.value for d in documents], "prune": prune})


def _diff(args, api: Api, documents: list[files.Document]) -> int:
    plan = _plan(api, documents, args.prune)
    if args.save_plan:
        saved = {"documents_digest": files.digest(documents), "prune": args.prune, "plan": plan}
        args.save_plan.write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n")
    _out(args, render.plan_text(plan), plan)
    return CHANGES if plan["changes"] else NO_CHANGE


def _apply(args, api: Api, documents: list[files.Document]) -> int:
    if args.plan:
        saved = json.loads(args.plan.read_text())
        if saved["documents_digest"] != files.digest(documents) or saved["prune"] != args.prune:
            raise ApiError(0, f"The files (or --prune) are not those {args.plan} was made from: run diff again.")
        versions = saved["plan"]["versions"]
    else:
        versions = _plan(api, documents, args.prune)["versions"]
    body = {"documents": [d.value for d in documents], "prune": args.prune, "versions": versions}
    result = api.post("config/apply/", {**body, "message": args.message})
    _out(args, render.plan_text(result, applied=True), result)
    return NO_CHANGE


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "validate":
            count = len(files.load(args.filename))
            _out(args, f"{count} document(s): valid.", {"documents": count})
            return NO_CHANGE
        documents = files.load(args.filename) if args.command in ("diff", "apply") else []
        api = Api(args.url, args.token)
        if args.command == "export":
            return _export(args, api)
        return _diff(args, api, documents) if args.command == "diff" else _apply(args, api, documents)
    except files.DocumentsError as exc:
        return _fail(args, "The files are not valid.", exc.problems)
    except ApiError as exc:
        problems = files.server_problems(documents, exc.errors) if args.command in ("diff", "apply") else []
        return _fail(args, exc.message, problems)
