#!/usr/bin/env python3
"""The Python package's API reference, from its source (no import needed).

    python_reference.py --check PACKAGE_DIR         exit 1 naming every public
                                                    class, function, method or
                                                    property without a docstring
    python_reference.py --html OUT PACKAGE_DIR      also write OUT (one page)

Public: the names of the package's __all__ (__init__.py gathers them from
the package's modules, one per handle and concern: _strategy.py, _model.py,
...), each found where it is defined, and the methods and properties of
public classes (plus __init__ and __enter__ when a class defines them, since
that is where a constructor's keywords are documented). Reading the source
with `ast` keeps the reference buildable without the compiled extension (and
so without LibTorch) on the machine that builds it. A name of __all__ that no
module defines is an error too.
"""
import argparse
import ast
import html
import os
import sys

DOCUMENTED_DUNDERS = {"__init__", "__new__"}


def exported_names(init_tree):
    """The strings of __init__.py's __all__, in order."""
    for node in init_tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def definitions(package):
    """{name: (path, node)} of every top-level definition and assignment in
    the package's modules."""
    found = {}
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(package, name)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found[node.name] = (path, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, (path, node))
    return found


def public_members(names, found):
    """(qualified name, path, node) for every public definition, in the
    order of __all__."""
    for name in names:
        path, node = found[name]
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue  # a constant: documented by the comment above it
        yield name, path, node
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and (
                        not sub.name.startswith("_") or sub.name in DOCUMENTED_DUNDERS):
                    yield f"{node.name}.{sub.name}", path, sub


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
    names = exported_names(tree)
    found = definitions(args.package)
    for name in names:
        if name not in found:
            missing.append(f"{path}: __all__ names {name}, which no module of the package defines")
    for name, where, node in public_members([n for n in names if n in found], found):
        doc = ast.get_docstring(node)
        if not doc:
            missing.append(f"{where}:{node.lineno}: {name} has no docstring")
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
