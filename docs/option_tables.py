#!/usr/bin/env python3
"""The docs' tables of options, made from the library's option table
(core/strategy/option_table.h, served as fsdp2_options_schema()).

    option_tables.py --check [--train BINARY]   exit 1, saying what differs,
        when a table in the docs is not the one the option table gives (or,
        with --train, when the main job's --help lacks a row's flag or shows
        another default)
    option_tables.py                            rewrite the tables in the
        workspace (bazel run //docs:option_tables)

A table sits in its page between the lines `<!-- options:NAME -->` and
`<!-- /options:NAME -->`: strategy, step and optimizer in strategy.md (every
option as C++, C/JSON, Python, Java and the main job spell it), main-job in
main-job.md (the main job's flags that the option table makes).
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys

import fsdp2

PAGES = {"strategy": "strategy.md", "step": "strategy.md", "optimizer": "strategy.md",
         "main-job": "main-job.md"}


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def code(text):
    return "`" + cell(text) + "`"


TITLES = {"gpu.md": "GPUs", "tensor-parallel.md": "tensor parallelism",
          "your-model.md": "your model", "mixed-precision.md": "mixed precision"}


def values(row, flag=False):
    """The values an option takes, in words (as a flag's text with `flag`)."""
    if row.get("choices"):
        return ", ".join(code(c) for c in row["choices"])
    if flag and row["type"] == "bool":
        return "`1` or `0`"
    if flag and row["type"] == "text":
        return "text (none by default)" if row["default"] is None else "text"
    kinds = {"bool": "`true` or `false`", "text": "a string, or `null` for none",
             "size": "`\"auto\"` or " + row.get("requirement", "an int"),
             "uint64": "an int from 0 to 2^64 - 1"}
    return cell(row["requirement"]) if row.get("requirement") and row["type"] != "size" \
        else kinds.get(row["type"], row["type"])


def doc(row):
    see = row.get("see")
    link = f" ([{TITLES.get(see, see[:-3].replace('-', ' '))}]({see}))" if see else ""
    return cell(row["doc"]) + link


def flag_text(value):
    """A value as the main job's flag writes it (the table's OptionText)."""
    if value is None:
        return ""
    if value is True or value is False:
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value).rstrip("0").rstrip(".") if "e" not in repr(value) else repr(value)
    return str(value)


def main_job(row):
    if not row["flag"]:
        return cell(row.get("flag_note", "-"))
    text = code("--" + row["flag"])
    if row["flag_default"] != row["default"]:
        text += " (default " + code(flag_text(row["flag_default"])) + ")"
    return text


def table(name, schema):
    """The markdown lines of table `name`."""
    if name == "strategy":
        head = ["option: C field, JSON key, Python keyword", "C++ (`FSDP2StrategyOptions`)",
                "Java `FSDP2Strategy.builder()`", "main job", "values", "default",
                "what it does and costs"]
        rows = [[code(r["name"]), code(r["cpp"]), code(camel(r["name"]) + "(...)"),
                 main_job(r), values(r), code(json.dumps(r["default"])), doc(r)]
                for r in schema["strategy"]]
    elif name == "step":
        head = ["option: C `fsdp2_step_options_t` field, JSON key, Python `training_step` keyword",
                "C++ (`TrainerOptions`)", "Java `trainingStep(...)`", "main job", "values",
                "default", "what it does"]
        rows = [[code(r["name"]), code(r["cpp"]), "`Map` key " + code(json.dumps(r["name"])),
                 main_job(r), values(r), code(json.dumps(r["default"])), doc(r)]
                for r in schema["step"]]
    elif name == "optimizer":
        head = ["option: C field, JSON key, Python `fsdp2.Optimizer` keyword",
                "C++ (`OptimizerOptions`)", "Java `OptimizerOptions`", "main job", "values",
                "default", "what it does"]
        rows = [[code(r["name"]), code(r["cpp"]), code(camel(r["name"]) + "(...)"),
                 main_job(r), values(r), code(json.dumps(r["default"])), doc(r)]
                for r in schema["optimizer"]]
    elif name == "main-job":
        head = ["flag", "default", "option", "meaning"]
        rows = []
        for section in ("strategy", "step", "optimizer"):
            for r in schema[section]:
                if r["flag"]:
                    default = flag_text(r["flag_default"])
                    rows.append([code("--" + r["flag"]), code(default) if default else "none",
                                 code(r["name"]), values(r, flag=True) + ": " + doc(r)])
    else:
        raise KeyError(name)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def rewrite(text, name, lines):
    """`text` with table `name`'s block replaced by `lines`."""
    begin, end = f"<!-- options:{name} -->", f"<!-- /options:{name} -->"
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"no '{begin}' ... '{end}' block")
    return pattern.sub(lambda _: "\n".join([begin] + lines + [end]), text)


def check_main_job(train, schema):
    """Every row with a flag is a flag of the main job, with its default."""
    help_text = subprocess.run([train, "--help"], capture_output=True, text=True,
                               timeout=120).stdout
    problems = []
    for section in ("strategy", "step", "optimizer"):
        for r in schema[section]:
            if not r["flag"]:
                continue
            line = next((l for l in help_text.splitlines()
                         if l.strip().startswith("--" + r["flag"] + " ")), None)
            default = flag_text(r["flag_default"])
            if line is None:
                problems.append(f"the main job has no --{r['flag']} (option {r['name']})")
            elif default and not line.rstrip().endswith(f"(default {default})"):
                problems.append(f"--{r['flag']}: the main job's default is not {default}: {line}")
            elif not default and "(default " in line:
                problems.append(f"--{r['flag']}: the main job has a default, the table none: {line}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--train", help="the main job's binary, to check its --help")
    parser.add_argument("--docs", default=None, help="the docs directory (default: next to this file)")
    args = parser.parse_args()
    docs = args.docs or (os.path.join(os.environ["BUILD_WORKSPACE_DIRECTORY"], "docs")
                         if not args.check and "BUILD_WORKSPACE_DIRECTORY" in os.environ
                         else os.path.dirname(os.path.abspath(__file__)))
    schema = fsdp2.option_schema()
    problems = []
    for page in sorted(set(PAGES.values())):
        path = os.path.join(docs, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = text
        for name, where in PAGES.items():
            if where == page:
                new = rewrite(new, name, table(name, schema))
        if new == text:
            continue
        if args.check:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), f"docs/{page}",
                                        "from the option table", lineterm="", n=0)
            problems.append(f"docs/{page} is not what the option table gives "
                            "(bazel run //docs:option_tables rewrites it):\n" + "\n".join(diff))
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"rewrote docs/{page}")
    if args.train:
        problems += check_main_job(args.train, schema)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        print("PASS: the docs' option tables and the main job's flags are the option table's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
