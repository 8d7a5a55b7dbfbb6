#!/usr/bin/env python3
"""Doxygen's INPUT_FILTER for fsdp2's public headers.

The headers are commented as Abseil's are: plain `//` comments (and `/* */`
in the C header) directly above a declaration, or after it on the same line.
Doxygen reads only its own markers, so this filter rewrites each line in
place (the line count never changes, so warnings point at the right line):
  - the banner's first line (the file's path)  -> `/// @file` (`/** @file`)
  - a whole-line `// text` / `/* text`         -> `/// text` / `/** text`
  - `decl;  // text` / `decl; /* text */`      -> `decl;  ///< text` / `/**< text */`
  - a `// ---- banner` stays a plain comment
  - `<word>` in comment prose                  -> `\\<word\\>` (not an HTML tag)
Comments inside inline function bodies are left alone. The headers are never
edited for Doxygen: the reference says what a reader of the header reads.
"""
import re
import sys

TRAILING = re.compile(
    r"^(?P<code>[^\"'/]*?[;,{\w])(?P<space>\s+)"
    r"(?://(?!/)(?P<line>.*)|/\*(?!\*)(?P<block>.*)\*/\s*)$")
# A section banner (`// ---- Checkpoints ----`) titles what follows; it is
# not the next declaration's documentation.
BANNER = re.compile(r"^\s*(?://|/\*)\s*-{3,}")
FUNCTION_HEAD = re.compile(r"\)\s*(?:const|override|noexcept|final|\s)*(?::.*)?$")


def escape(text):
    """Escapes <word> outside `code spans` so Doxygen does not read HTML."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"<([^<>\n]*)>", r"\\<\1\\>", parts[i])
    return "".join(parts)


def strip_code(line):
    """The line without comments, strings and character literals."""
    return re.sub(r"//.*|/\*.*?\*/|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])+'", "", line)


def filter_lines(lines):
    out = []
    first = True
    in_comment = False   # inside a /* ... */ that spans lines
    comment_is_doc = False
    depth = 0
    bodies = []          # brace depths at which inline function bodies opened
    last_code = ""
    for line in lines:
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if in_comment:
            if "*/" in line:
                in_comment = False
            out.append(escape(line) if comment_is_doc else line)
            continue
        if first and stripped.startswith(("//", "/*")):
            first = False
            out.append(indent + ("/// @file\n" if stripped.startswith("//") else "/** @file\n"))
            if stripped.startswith("/*") and "*/" not in stripped:
                in_comment, comment_is_doc = True, True
            continue
        first = False
        if BANNER.match(line):
            if stripped.startswith("/*") and "*/" not in stripped:
                in_comment, comment_is_doc = True, False
            out.append(line)
            continue
        if stripped.startswith("//") and not stripped.startswith(("///", "//!")):
            out.append(line if bodies else indent + "///" + escape(stripped[2:]) + "\n")
            continue
        if stripped.startswith("/*") and not stripped.startswith(("/**", "/*!")):
            if "*/" not in stripped:
                in_comment, comment_is_doc = True, not bodies
            out.append(line if bodies else indent + "/**" + escape(stripped[2:]) + "\n")
            continue
        m = TRAILING.match(line.rstrip("\n"))
        if m and not bodies and not stripped.startswith(("#", "}")):
            if m.group("line") is not None:
                line = f"{m.group('code')}{m.group('space')}///<{escape(m.group('line'))}\n"
            else:
                line = f"{m.group('code')}{m.group('space')}/**<{escape(m.group('block'))}*/\n"
        code = strip_code(line)
        for i, ch in enumerate(code):
            if ch == "{":
                depth += 1
                head = code[:i].strip() or last_code
                if bodies or FUNCTION_HEAD.search(head):
                    bodies.append(depth)
            elif ch == "}":
                if bodies and bodies[-1] == depth:
                    bodies.pop()
                depth -= 1
        if code.strip() and not stripped.startswith("#"):
            last_code = code.strip()
        out.append(line)
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write("".join(filter_lines(f.readlines())))
