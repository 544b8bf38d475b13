#!/usr/bin/env python3
"""Generate man pages (man/) and shell completions (completions/) from the click tree, and the tables of docs/.

    python tools/gen_docs.py            # write the files
    python tools/gen_docs.py --check    # exit 1 and name the files that are stale

Everything comes from the commands themselves: their help, options, choices,
defaults, subcommands and the extra man sections they carry (`man_sections`).
The output is deterministic (no dates) so the test suite can tell when a
checked-in file no longer matches the code.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import generated  # noqa: E402

from tpu_tools import __version__, environment  # noqa: E402
from tpu_tools.cli.main import cli  # noqa: E402
from tpu_tools.top import keys  # noqa: E402

GROUP_PROGRAM = "tpu-tools"


@dataclass
class Program:
    """A program the user types: `tpu-tools` or one of the `tpu-<command>` scripts."""

    name: str
    command: click.Command
    subcommand_of: str | None = None  # "ls" for tpu-ls, also reachable as `tpu-tools ls`


def _context(command: click.Command, info_name: str | None = None) -> click.Context:
    """A context as the command itself would make one: with its settings (-h among its help options).

    Click caches a command's help option from the first context that asks for it, so a bare context
    here would take -h away from the commands for the rest of the process.
    """
    return click.Context(command, info_name=info_name, **command.context_settings)


def programs() -> list[Program]:
    ctx = _context(cli, GROUP_PROGRAM)
    result = [Program(GROUP_PROGRAM, cli)]
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        result.append(Program(f"tpu-{name}", command, name))
    return result


# --- man pages --------------------------------------------------------------------------------------

def _roff(text: str) -> str:
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in escaped.splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _paragraphs(text: str) -> str:
    blocks = [b.strip() for b in text.strip().split("\n")]
    return "\n.PP\n".join(_roff(b) for b in blocks if b)


def _option_synopsis(param: click.Parameter) -> str:
    names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in [*param.opts, *param.secondary_opts])
    if isinstance(param, click.Option) and not param.is_flag:
        names += f" \\fI{_roff(_metavar(param))}\\fR"
    return names


def _metavar(param: click.Parameter) -> str:
    if param.metavar:
        return param.metavar
    if isinstance(param.type, click.Choice):
        return "[" + "|".join(str(c) for c in param.type.choices) + "]"
    return param.type.name.upper()


def _option_help(param: click.Option) -> str:
    parts = [param.help or ""]
    if param.show_default and param.default is not None and not param.is_flag:
        parts.append(f"Default: {param.default}.")
    if param.envvar:
        parts.append(f"Environment: {param.envvar}.")
    return " ".join(p for p in parts if p)


def _usage(command: click.Command, path: list[str]) -> str:
    ctx = _context(command, " ".join(path))
    pieces = command.collect_usage_pieces(ctx)
    return _roff(" ".join([*path, *pieces]))


def _options_section(command: click.Command) -> list[str]:
    lines = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            lines += [".TP", _option_synopsis(param), _roff(_option_help(param))]
    lines += [".TP", "\\fB\\-h\\fR, \\fB\\-\\-help\\fR", "Show the help and exit."]
    return lines


def _arguments_section(command: click.Command) -> list[str]:
    lines = []
    for param in command.params:
        if isinstance(param, click.Argument):
            lines += [".TP", f"\\fI{_roff(param.human_readable_name)}\\fR", _roff(getattr(param, "help", "") or "")]
    return lines


def _subcommands(command: click.Command) -> list[tuple[str, click.Command]]:
    if not isinstance(command, click.Group):
        return []
    ctx = _context(command)
    return [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]  # type: ignore[misc]


def man_page(program: Program, all_programs: list[Program]) -> str:
    command = program.command
    summary = (command.get_short_help_str(limit=200) or "").rstrip(".")
    arguments_usage = _usage(command, [])
    lines = [
        f'.TH {program.name.upper()} 1 "" "tpu-tools {__version__}" "tpu-tools manual"',
        ".SH NAME",
        f"{_roff(program.name)} \\- {_roff(summary)}",
        ".SH SYNOPSIS",
        f".B {_roff(program.name)}",
        arguments_usage,
    ]
    if program.subcommand_of:
        lines += [".br", f".B tpu\\-tools {_roff(program.subcommand_of)}", arguments_usage]
    lines += [".SH DESCRIPTION", _paragraphs(command.help or "")]
    sections = dict(getattr(command, "man_sections", {}))
    if "DESCRIPTION" in sections:
        lines += [".PP", _paragraphs(sections.pop("DESCRIPTION"))]
    arguments = _arguments_section(command)
    if arguments:
        lines += [".SH ARGUMENTS", *arguments]
    lines += [".SH OPTIONS", *_options_section(command)]
    subcommands = _subcommands(command)
    if subcommands:
        lines.append(".SH COMMANDS")
        for name, sub in subcommands:
            path = [program.name, name]
            lines += [".SS " + _roff(" ".join(path)), _usage(sub, path), ".PP",
                      _paragraphs(sub.help or "")]
            for extra_title, extra_text in getattr(sub, "man_sections", {}).items():
                lines += [".PP", f"\\fB{_roff(extra_title.title())}\\fR", ".PP", _paragraphs(extra_text)]
            options = [p for p in sub.params if isinstance(p, click.Option) and not p.hidden]
            if options:
                lines += [".PP", "Options:", ".RS"]
                for param in options:
                    lines += [".TP", _option_synopsis(param), _roff(_option_help(param))]
                lines.append(".RE")
    for title, text in sections.items():
        lines += [f".SH {title}", _paragraphs(text)]
    if program.name != GROUP_PROGRAM:
        group_sections = getattr(cli, "man_sections", {})
        for title in ("EXIT STATUS", "ERRORS"):
            if title not in sections and title in group_sections:
                lines += [f".SH {title}", _paragraphs(group_sections[title])]
        # The variables this program reads, from the one table of them (tpu_tools/environment.py).
        lines += [".SH ENVIRONMENT", _paragraphs(environment.man_section(program.name))]
    others = [p.name for p in all_programs if p.name != program.name]
    lines += [".SH SEE ALSO", ", ".join(f"\\fB{_roff(name)}\\fR(1)" for name in others)]
    return "\n".join(line for line in lines if line is not None) + "\n"


# --- completions ------------------------------------------------------------------------------------

@dataclass
class OptionSpec:
    names: list[str]
    takes_value: bool
    choices: list[str]
    is_path: bool
    help: str


def _option_specs(command: click.Command) -> list[OptionSpec]:
    specs = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        choices = [str(c) for c in param.type.choices] if isinstance(param.type, click.Choice) else []
        is_path = isinstance(param.type, (click.Path, click.File))
        specs.append(OptionSpec([*param.opts, *param.secondary_opts], not param.is_flag, choices, is_path,
                                (param.help or "").split(". ")[0].rstrip(".")))
    specs.append(OptionSpec(["-h", "--help"], False, [], False, "Show the help and exit"))
    return specs


def _command_tree(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every (path of subcommand names, command) below and including `command`."""
    tree = [(path, command)]
    for name, sub in _subcommands(command):
        tree += _command_tree(sub, (*path, name))
    return tree


def _bash_words(words: list[str]) -> str:
    return " ".join(words)


def bash_completion(all_programs: list[Program]) -> str:
    out = [
        "# bash completion for tpu-tools; generated by tools/gen_docs.py, do not edit.",
        "",
        "_tpu_tools_complete() {",
        "    local cur prev words cword",
        "    cur=\"${COMP_WORDS[COMP_CWORD]}\"",
        "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
        "    local prog=\"${COMP_WORDS[0]##*/}\" path=\"\" i w",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        w=\"${COMP_WORDS[i]}\"",
        "        [[ $w == -* ]] && continue",
        "        if _tpu_tools_is_command \"$prog\" \"$path${path:+ }$w\"; then path=\"$path${path:+ }$w\"; fi",
        "    done",
        "    local key=\"$prog|$path\"",
        "    local opts=\"\" subs=\"\" choices=\"\" pathopts=\"\" valopts=\"\"",
        "    case \"$key\" in",
    ]
    for program in all_programs:
        for path, command in _command_tree(program.command):
            specs = _option_specs(command)
            opts = [n for s in specs for n in s.names]
            subs = [name for name, _ in _subcommands(command)]
            out.append(f"        '{program.name}|{' '.join(path)}')")
            out.append(f"            opts='{_bash_words(opts)}'; subs='{_bash_words(subs)}'")
            valopts = [n for s in specs if s.takes_value for n in s.names]
            pathopts = [n for s in specs if s.is_path for n in s.names]
            out.append(f"            valopts='{_bash_words(valopts)}'; pathopts='{_bash_words(pathopts)}'")
            choice_cases = [(n, s.choices) for s in specs if s.choices for n in s.names]
            if choice_cases:
                out.append("            case \"$prev\" in")
                for name, choices in choice_cases:
                    out.append(f"                {name}) choices='{_bash_words(choices)}' ;;")
                out.append("            esac")
            out.append("            ;;")
    out += [
        "    esac",
        "    if [[ -n $choices ]]; then COMPREPLY=($(compgen -W \"$choices\" -- \"$cur\")); return; fi",
        "    if [[ \" $pathopts \" == *\" $prev \"* ]]; then COMPREPLY=($(compgen -f -- \"$cur\")); return; fi",
        "    if [[ \" $valopts \" == *\" $prev \"* ]]; then COMPREPLY=(); return; fi",
        "    if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\")); return; fi",
        "    if [[ -n $subs ]]; then COMPREPLY=($(compgen -W \"$subs\" -- \"$cur\")); return; fi",
        "    COMPREPLY=($(compgen -f -- \"$cur\"))",
        "}",
        "",
        "_tpu_tools_is_command() {",
        "    case \"$1|$2\" in",
    ]
    paths = [f"{p.name}|{' '.join(path)}" for p in all_programs for path, _ in _command_tree(p.command) if path]
    out.append("        " + "|".join(f"'{p}'" for p in paths) + ") return 0 ;;" if paths else "        *) ;;")
    out += [
        "    esac",
        "    return 1",
        "}",
        "",
        "complete -o default -F _tpu_tools_complete " + " ".join(p.name for p in all_programs),
    ]
    return "\n".join(out) + "\n"


def _zsh_escape(text: str) -> str:
    return text.replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh_arguments(command: click.Command) -> list[str]:
    specs = _option_specs(command)
    lines = []
    for spec in specs:
        names = spec.names
        group = "(" + " ".join(names) + ")" if len(names) > 1 else ""
        flags = "{" + ",".join(names) + "}" if len(names) > 1 else names[0]
        action = ""
        if spec.takes_value:
            if spec.choices:
                action = ":value:(" + " ".join(spec.choices) + ")"
            elif spec.is_path:
                action = ":file:_files"
            else:
                action = ":value: "
        lines.append(f"'{group}'{flags}'[{_zsh_escape(spec.help)}]{action}'")
    return lines


def zsh_completion(all_programs: list[Program]) -> str:
    out = [
        "#compdef " + " ".join(p.name for p in all_programs),
        "# zsh completion for tpu-tools; generated by tools/gen_docs.py, do not edit.",
        "",
    ]
    functions = []
    for program in all_programs:
        for path, command in _command_tree(program.command):
            fname = "_" + "_".join([program.name, *path]).replace("-", "_")
            subs = _subcommands(command)
            body = [f"{fname}() {{"]
            args = _zsh_arguments(command)
            if subs:
                body.append("    local curcontext=\"$curcontext\" state line")
                body.append("    _arguments -C \\")
                for arg in args:
                    body.append(f"        {arg} \\")
                body.append("        '1:command:->command' '*::argument:->argument'")
                body.append("    case $state in")
                body.append("        command)")
                entries = " ".join(f"'{name}:{_zsh_escape(sub.get_short_help_str(limit=60))}'" for name, sub in subs)
                body.append(f"            local -a commands; commands=({entries})")
                body.append("            _describe command commands ;;")
                body.append("        argument)")
                body.append("            case $line[1] in")
                for name, _ in subs:
                    body.append(f"                {name}) {fname}_{name.replace('-', '_')} ;;")
                body.append("            esac ;;")
                body.append("    esac")
            else:
                body.append("    _arguments \\")
                for arg in args:
                    body.append(f"        {arg} \\")
                body.append("        '*:file:_files'")
            body.append("}")
            functions.append("\n".join(body))
    out += functions
    out += ["", "case $service in"]
    for program in all_programs:
        out.append(f"    {program.name}) _{program.name.replace('-', '_')} \"$@\" ;;")
    out.append("esac")
    return "\n".join(out) + "\n"


def _fish_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def fish_completion(all_programs: list[Program]) -> str:
    out = ["# fish completion for tpu-tools; generated by tools/gen_docs.py, do not edit.", ""]
    for program in all_programs:
        tree = _command_tree(program.command)
        out.append(f"complete -c {program.name} -f")
        for path, command in tree:
            if path:
                parent = " ".join(path[:-1])
                condition = (f"__fish_seen_subcommand_from {path[-2]}; and not __fish_seen_subcommand_from "
                             f"{path[-1]}" if parent else "__fish_use_subcommand")
                out.append(f"complete -c {program.name} -n '{condition}' -a {path[-1]} "
                           f"-d '{_fish_escape(command.get_short_help_str(limit=60))}'")
            subs = _subcommands(command)
            if path:
                condition = f"-n '__fish_seen_subcommand_from {path[-1]}'"
            elif subs:
                condition = "-n '__fish_use_subcommand'"
            else:
                condition = ""
            for spec in _option_specs(command):
                parts = [f"complete -c {program.name}"]
                if condition:
                    parts.append(condition)
                for name in spec.names:
                    parts.append(f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}")
                if spec.takes_value:
                    parts.append("-r")
                    if spec.choices:
                        parts.append("-f -a '" + " ".join(spec.choices) + "'")
                    elif spec.is_path:
                        parts.append("-F")
                parts.append(f"-d '{_fish_escape(spec.help)}'")
                out.append(" ".join(parts))
        out.append("")
    return "\n".join(out)


# --- docs/development.md's tables -------------------------------------------------------------------

def _test_module(name: str) -> Any:
    """A module of tests/ (its tables are the source of a doc's), loaded by path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_struct_base(base: ast.expr, structs: set[str]) -> bool:
    name = ast.unparse(base)
    return name in ("msgspec.Struct", "Struct") or name.rpartition(".")[2] in structs


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(ast.unparse(d).split("(")[0].rpartition(".")[2] == "dataclass" for d in node.decorator_list)


def record_types() -> list[tuple[str, str, str]]:
    """(record, module, what) of every record type: each msgspec Struct of the package, and each dataclass of a
    `records` module or package of a feature or below."""
    package = REPO / "tpu_tools"
    classes = []
    for path in sorted(package.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        relative = path.relative_to(REPO)
        in_records = len(relative.parts) > 2 and (path.stem == "records" or "records" in relative.parts[:-1])
        tree = ast.parse(path.read_text())
        classes += [(node, relative, in_records) for node in tree.body
                    if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
    structs: set[str] = set()
    while True:  # a Struct may derive from another (a group's record from GroupRecord)
        more = {node.name for node, _, _ in classes if any(_is_struct_base(b, structs) for b in node.bases)}
        if more <= structs:
            break
        structs |= more
    found = []
    for node, relative, in_records in classes:
        if node.name in structs or (in_records and _is_dataclass(node)):
            doc = " ".join((ast.get_docstring(node) or "").split())
            what = re.split(r"(?<=\.)\s", doc, maxsplit=1)[0].rstrip(".")
            if not what:  # no docstring: its figures say what it holds
                fields = [f.target.id for f in node.body if isinstance(f, ast.AnnAssign)
                          and isinstance(f.target, ast.Name)]
                what = "fields " + ", ".join(f"`{f}`" for f in fields[:8]) + (", ..." if len(fields) > 8 else "")
            found.append((node.name, str(relative), what.replace("|", "\\|")))
    return found


def record_table() -> str:
    rows = [f"| `{name}` | `{module}` | {what} |" for name, module, what in record_types()]
    return "\n".join(["| record | module | what it holds |", "| --- | --- | --- |", *rows])


# --- files ------------------------------------------------------------------------------------------

def generated_files() -> dict[Path, str]:
    all_programs = programs()
    files = {REPO / "man" / f"{p.name}.1": man_page(p, all_programs) for p in all_programs}
    files[REPO / "completions" / "tpu-tools.bash"] = bash_completion(all_programs)
    files[REPO / "completions" / "_tpu-tools"] = zsh_completion(all_programs)
    files[REPO / "completions" / "tpu-tools.fish"] = fish_completion(all_programs)
    files[REPO / "docs" / "environment.md"] = environment.markdown_table()
    development = REPO / "docs" / "development.md"
    text = generated.spliced(development, "layers from tests/test_layers.py", _test_module("test_layers").layer_table())
    development_text = generated.spliced_text(text, development, "record types", record_table())
    files[development] = development_text
    top_screen = REPO / "docs" / "top-screen.md"
    files[top_screen] = generated.spliced(top_screen, "keys from tpu_tools/top/keys.py", keys.markdown_table())
    return files


OWNED = (REPO / "man", REPO / "completions")  # whatever else is in these folders is a leftover


def stale_files() -> list[Path]:
    return generated.stale(generated_files(), OWNED)


def main() -> int:
    return generated.main(__doc__.splitlines()[0], generated_files, OWNED)


if __name__ == "__main__":
    sys.exit(main())
