#!/usr/bin/env python3
"""Extracts the runnable snippets of README.md and docs/*.md.

A fenced code block whose info string is `<lang> run` (lang: cpp, c, python,
java) is a complete program that //docs:snippets_* build and run as two ranks
(docs/snippets/run_ranks.sh). Bazel needs the files before it analyses
docs/BUILD, so they are kept in docs/snippets/ beside this script, and
//docs:snippets_in_sync_test fails when a page and its files differ:

    python3 docs/snippets/extract.py --write   # after editing a page
    python3 docs/snippets/extract.py --check   # what the test runs

File names: <page>_<k>.<ext> (the page's k-th runnable block, counted over
all languages), or java/<Class>.java for Java, named by its public class.
"""
import argparse
import difflib
import os
import re
import sys

EXTENSIONS = {"cpp": "cc", "c": "c", "python": "py", "java": "java"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")
GENERATED = "generated from {page} by docs/snippets/extract.py; edit the page, not this file"
# How each language opens and closes the one-line header comment.
COMMENT = {"cc": ("// ", ""), "c": ("/* ", " */"), "py": ("# ", ""), "java": ("// ", "")}


def pages(root):
    yield "README.md"
    docs = os.path.join(root, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield f"docs/{name}"


def blocks(text, page):
    """(language, line number, code) of each runnable block of one page."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info = m.group("info").split()
        start, fence = i, m.group("fence")
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise SystemExit(f"{page}:{start + 1}: a code block is never closed")
        i += 1
        if len(info) >= 2 and info[1] == "run":
            if info[0] not in EXTENSIONS:
                raise SystemExit(f"{page}:{start + 1}: `{info[0]} run`: runnable blocks "
                                 f"are one of {', '.join(EXTENSIONS)}")
            yield info[0], start + 1, "\n".join(body) + "\n"


def header(ext, page):
    # The page, not the line: editing a page above a block must not make its
    # copy stale.
    start, end = COMMENT[ext]
    return f"{start}{GENERATED.format(page=page)}{end}\n"


def snippets(root):
    """{relative path under docs/snippets: content}."""
    out = {}
    for page in pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        stem = os.path.splitext(os.path.basename(page))[0].lower().replace("-", "_")
        stem = "readme" if page == "README.md" else stem
        for k, (lang, line, code) in enumerate(blocks(text, page), 1):
            ext = EXTENSIONS[lang]
            if lang == "java":
                m = re.search(r"public\s+(?:final\s+)?class\s+(\w+)", code)
                if not m:
                    raise SystemExit(f"{page}:{line}: a runnable Java block needs a public class")
                name = f"java/{m.group(1)}.java"
            else:
                name = f"{stem}_{k}.{ext}"
            if name in out:
                raise SystemExit(f"{page}:{line}: {name} is made twice (rename the class)")
            out[name] = header(ext, page) + code
    return out


def existing(directory):
    found = {}
    for sub in ("", "java"):
        d = os.path.join(directory, sub)
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            ext = name.rsplit(".", 1)[-1]
            if (os.path.isfile(os.path.join(d, name)) and ext in EXTENSIONS.values()
                    and name != "extract.py"):
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    content = f.read()
                if "generated from" in content.split("\n", 1)[0]:
                    found[os.path.join(sub, name) if sub else name] = content
    return found


def main():
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    args = parser.parse_args()
    directory = os.path.join(args.root, "docs", "snippets")
    want = snippets(args.root)
    have = existing(directory)
    if args.write:
        for name in set(have) - set(want):
            os.remove(os.path.join(directory, name))
        for name, content in want.items():
            path = os.path.join(directory, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if have.get(name) != content:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(content)
        print(f"{len(want)} snippets in docs/snippets")
        return 0
    problems = []
    for name in sorted(set(want) | set(have)):
        if name not in have:
            problems.append(f"missing: docs/snippets/{name}")
        elif name not in want:
            problems.append(f"stale: docs/snippets/{name} (its block is gone)")
        elif have[name] != want[name]:
            diff = difflib.unified_diff(have[name].splitlines(), want[name].splitlines(),
                                        f"docs/snippets/{name}", "from the page", lineterm="")
            problems.append("\n".join(diff))
    if problems:
        print("The pages' runnable snippets and docs/snippets differ; run\n"
              "  python3 docs/snippets/extract.py --write\nand commit the result.\n\n"
              + "\n".join(problems), file=sys.stderr)
        return 1
    print(f"{len(want)} snippets in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
