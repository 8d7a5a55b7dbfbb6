#!/usr/bin/env python3
"""The Python package's API reference, from its source (no import needed).

    python_reference.py --check PACKAGE_DIR         exit 1 naming every public
                                                    class, function, method or
                                                    property without a docstring
    python_reference.py --html OUT PACKAGE_DIR      also write OUT (one page)

Public: names not starting with "_" at module level, and the methods and
properties of public classes (plus __init__ and __enter__ when a class
defines them, since that is where a constructor's keywords are documented).
Reading the source with `ast` keeps the reference buildable without the
compiled extension (and so without LibTorch) on the machine that builds it.
"""
import argparse
import ast
import html
import os
import sys

DOCUMENTED_DUNDERS = {"__init__", "__new__"}


def public_members(tree):
    """(qualified name, node, signature) for every public definition, in order."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef) and (
                            not sub.name.startswith("_") or sub.name in DOCUMENTED_DUNDERS):
                        yield f"{node.name}.{sub.name}", sub


def signature(node):
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        return f"class {node.name}({bases})" if bases else f"class {node.name}"
    decorators = [ast.unparse(d) for d in node.decorator_list]
    prefix = "property " if "property" in decorators else (
        "classmethod " if "classmethod" in decorators else "")
    return f"{prefix}{node.name}({ast.unparse(node.args)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--html")
    parser.add_argument("package")
    args = parser.parse_args()
    path = os.path.join(args.package, "__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    missing = []
    sections = []
    module_doc = ast.get_docstring(tree)
    if not module_doc:
        missing.append(f"{path}:1: the module has no docstring")
    for name, node in public_members(tree):
        doc = ast.get_docstring(node)
        if not doc:
            missing.append(f"{path}:{node.lineno}: {name} has no docstring")
            continue
        level = "h2" if "." not in name else "h3"
        sections.append(
            f'<{level} id="{html.escape(name)}">{html.escape(name)}</{level}>\n'
            f"<pre><code>{html.escape(signature(node))}</code></pre>\n"
            f"<pre class=\"doc\">{html.escape(doc)}</pre>\n")
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                    "<title>fsdp2 Python package</title>"
                    "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
                    "pre.doc{white-space:pre-wrap;font-family:inherit}</style></head><body>\n"
                    "<h1>The fsdp2 Python package</h1>\n"
                    f"<pre class=\"doc\">{html.escape(module_doc or '')}</pre>\n"
                    + "".join(sections) + "</body></html>\n")
    if missing:
        print("undocumented public Python symbols:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
