"""Every flag of a command's parser, given hostile values: a bad argument is one line and exit 2, never a
traceback. The flags are read from the parser itself (its actions), so a new flag is walked too.

Each case runs the command's main up to where its work would start (`Command.work`, replaced by a stop):
the parse and every check before the work. `python -m tests.cli_walk COMMAND TOKENIZER PREPARED FOLDER`
walks one command in a process of its own (its checks may set process-wide state, as the compilation cache
does) and prints the cases that failed as a JSON list; tests/trainer/test_every_flag.py runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import pathlib
import re
import sys
import traceback
from collections.abc import Callable
from unittest import mock

from trainer import contract

HUGE = str(2**64)
NUMBERS = ("-1", "0", HUGE, "nan", "inf")
# What a well-formed line on stderr looks like, whoever prints it: `[prog: ]error: ...`, a note or a warning.
_LINE = re.compile(r"^([\w. ]+: )?(error|note|notice|warning): ")


class WorkStarts(Exception):
    """The command passed its checks: its work would start here."""


@dataclasses.dataclass(frozen=True)
class Command:
    main: str  # module:function, called with argv
    base: tuple[str, ...]  # a command line that passes the checks ({folder}, {tokenizer}, {prepared} filled in)
    work: tuple[str, ...] = ()  # module:attribute each, where the work starts: each is replaced by a stop
    subcommand: str | None = None  # the subparser walked (base starts with it)


COMMANDS = {
    "trainer": Command(
        "trainer.__main__:main",
        ("--model", "tiny", "--weights", "random", "--tokenizer", "{tokenizer}", "--data", "{prepared}",
         "--workdir", "{folder}/run", "--steps", "1", "--seq-len", "32", "--batch-size", "4", "--eval-fraction", "0",
         "--no-samples"),
        # jax.distributed.initialize once a process: the walk's cases share one.
        work=("trainer.run.step:build_run_step", "jax.distributed:initialize")),
    "export": Command("trainer.export:main", ("--run", "{folder}/run", "--out", "{folder}/hf"),
                      work=("trainer.export:export_run",)),
    "publish": Command("trainer.hf.publish:main", ("--run", "{folder}/run", "--publish-dir", "{folder}/published")),
    "goodput": Command("trainer.goodput_report:main", ("{folder}/run",)),
    "supervise": Command("trainer.supervise:main", ("--", "true"), work=("trainer.supervise:Supervisor.run",)),
    "fit": Command("workloads.__main__:main", ("fit", "--stack", "dev"), subcommand="fit",
                   work=("trainer.measure.compiled:tpu_devices",)),
    "render": Command("workloads.__main__:main", ("render", "--stack", "dev"), subcommand="render"),
    "preview": Command("infra.preview:main", ("--stack", "dev")),
}


def _resolve(name: str):
    module, _, attribute = name.partition(":")
    owner = importlib.import_module(module)
    *path, last = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, last


def _stop(*args, **kwargs):
    raise WorkStarts()


def parser_of(main: Callable, base: list[str]) -> argparse.ArgumentParser:
    """The parser `main` builds, caught when it parses `base`."""
    class Caught(Exception):
        pass

    def catch(parser, *args, **kwargs):
        raise Caught(parser)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            main(base)
        except Caught as caught:
            return caught.args[0]
    raise AssertionError("the command parsed no arguments")


def _flags(parser: argparse.ArgumentParser, subcommand: str | None) -> list[argparse.Action]:
    if subcommand is not None:
        chooser = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        parser = chooser.choices[subcommand]
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


def hostile_values(action: argparse.Action, folder: pathlib.Path) -> tuple[str, ...]:
    """An empty string, a file where a folder may be expected and the reverse, and, where the flag takes a
    number or a choice, numbers out of every range (a plain text flag reads them as any other text)."""
    paths = ("", str(folder / "a-file.txt"), str(folder / "a-folder"))
    return paths + (NUMBERS if action.type is not None or action.choices else ("-1",))


def cases(command: Command, parser: argparse.ArgumentParser, base: list[str], folder: pathlib.Path):
    """(flag's name, argv) for every flag and value: the value replaces the base's, or is added (before a
    `--` that starts a command)."""
    for action in _flags(parser, command.subcommand):
        if action.nargs == 0:  # store_true and the like: given, with the rest valid
            if action.option_strings:
                at = base.index("--") if "--" in base else len(base)
                yield action.option_strings[0], [*base[:at], action.option_strings[-1], *base[at:]]
            continue
        for value in hostile_values(action, folder):
            if not action.option_strings:  # a positional: the base's last argument (or the command after --)
                argv = [*base[:-1], value] if action.nargs != argparse.REMAINDER else ["--", value]
                yield action.dest, argv
                continue
            flag = action.option_strings[-1]
            argv = list(base)
            for option in action.option_strings:
                while option in argv:
                    at = argv.index(option)
                    del argv[at:at + 2]
            at = argv.index("--") if "--" in argv else len(argv)
            yield flag, [*argv[:at], flag, value, *argv[at:]]


def outcome(main: Callable, argv: list[str]) -> str | None:
    """None when the command refused `argv` in one line with exit 2, or passed its checks; else what it did."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except WorkStarts:
        return None
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:  # noqa: BLE001 - what the walk is for
        return "traceback: " + traceback.format_exc(limit=-3).strip().splitlines()[-1]
    lines = err.getvalue().splitlines()
    if code in (None, contract.OK):
        return None
    if code == contract.USER_ERROR and lines and all(_LINE.match(line) for line in lines) \
            and sum(" error: " in f" {line}" for line in lines) == 1:
        return None
    return f"exit {code}: {err.getvalue().strip()[-400:]!r}"


def walk(name: str, tokenizer: str, prepared: str, folder: pathlib.Path) -> list[dict]:
    command = COMMANDS[name]
    base = [part.format(folder=folder, tokenizer=tokenizer, prepared=prepared) for part in command.base]
    owner, attribute = _resolve(command.main)
    main = getattr(owner, attribute)
    with contextlib.ExitStack() as stack:
        for work in command.work:
            stack.enter_context(mock.patch.object(*_resolve(work), _stop))
        parser = parser_of(main, base)
        return [{"flag": flag, "given": argv[-2:], "got": got} for flag, argv in cases(command, parser, base, folder)
                if (got := outcome(main, argv)) is not None]


def _inputs(folder: pathlib.Path, tokenizer: str) -> None:
    """A file and a folder to hand flags, and the trainer run that export, publish and goodput read."""
    (folder / "a-file.txt").write_text("not what any flag wants\n")
    (folder / "a-folder").mkdir()
    run = folder / "run"
    (run / "export" / "hf").mkdir(parents=True)
    (run / "export" / "hf" / "config.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"model": "tiny", "tokenizer": tokenizer}))


if __name__ == "__main__":
    command_name, tokenizer_path, prepared_path, work_folder = sys.argv[1:]
    _inputs(pathlib.Path(work_folder), tokenizer_path)
    print(json.dumps(walk(command_name, tokenizer_path, prepared_path, pathlib.Path(work_folder))))
