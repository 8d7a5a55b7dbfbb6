#!/usr/bin/env python3
"""Fails on a broken relative link or anchor in README.md, CHANGELOG.md or docs/*.md.

A link [text](path#anchor) must name a file of the repository, and an anchor
a heading of that page as GitHub spells it (lower case, spaces to '-',
punctuation dropped). Links inside code blocks and to http(s) are not checked.
"""
import glob
import os
import re
import sys


def anchors(path):
    found = set()
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    for line in text.splitlines():
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            title = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            found.add(title.replace(" ", "-"))
    return found


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    pages = ["README.md", "CHANGELOG.md"] + sorted(glob.glob("docs/*.md"))
    problems = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(target):
                problems.append(f"{page}: {link}: no such file")
            elif anchor and target.endswith(".md") and anchor not in anchors(target):
                problems.append(f"{page}: {link}: no heading '{anchor}' in {target}")
    if problems:
        print("broken links:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"{len(pages)} pages, every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
