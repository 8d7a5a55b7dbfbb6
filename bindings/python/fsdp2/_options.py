"""The library's option table (fsdp2_options_schema in fsdp2.h): every
option of the strategy, the optimizer and a training step, with its type,
default, allowed values and one line of documentation.

The keywords of FSDP2Strategy(), Optimizer() and training_step() are the
table's rows: their signatures and documentation are made from it when
fsdp2 is imported, and their values go to the library as JSON, where each
row's check runs. An option added to the library's table is a keyword here
at once; no default or check is written again in Python."""

import inspect
import json

from . import fsdp2_c as _c


def option_schema():
    """The library's option table, as a new dict: {"strategy": [row, ...],
    "optimizer": [...], "step": [...]}, each row a dict with "name" (the
    keyword), "type" ("bool", "int", "uint64", "number", "choice", "size":
    "auto" or an int, "text": a str or None), "default", "doc" (one line)
    and, where they apply, "choices", "min", "max", "requirement" (the range
    in words), "flag" (the main job's), "see" (a page of the docs).
    fsdp2_options_schema in fsdp2.h says each."""
    return json.loads(_c.fsdp2_options_schema())


_SCHEMA = option_schema()


def _rows(section):
    return _SCHEMA[section]


def _describe(row):
    """A row as one line of a docstring: keyword=default (values): doc."""
    if row.get("choices"):
        values = " (" + ", ".join(repr(c) for c in row["choices"]) + ")"
    elif row.get("requirement"):
        values = " (" + row["requirement"] + ")"
    else:
        values = ""
    return f"- {row['name']}={row['default']!r}{values}: {row['doc']}"


def _with_options(function, section, positional=()):
    """Gives `function`, which takes the options of `section` as keywords
    (and those named in `positional` also by position, in that order after
    its own arguments), their signature, with the table's defaults, and
    appends one line per option to its docstring."""
    P = inspect.Parameter
    rows = _rows(section)
    names = {row["name"] for row in rows}
    own = [p for p in inspect.signature(function).parameters.values()
           if p.name not in names and p.kind not in (P.VAR_KEYWORD, P.VAR_POSITIONAL)]
    by_name = {row["name"]: row for row in rows}
    options = [P(name, P.POSITIONAL_OR_KEYWORD, default=by_name[name]["default"])
               for name in positional]
    options += [P(row["name"], P.KEYWORD_ONLY, default=row["default"])
                for row in rows if row["name"] not in positional]
    function.__signature__ = inspect.Signature(own + options)
    doc = (function.__doc__ or "").rstrip()
    # Indented as the docstring's own lines, so inspect.getdoc (help())
    # takes the indent off them all alike.
    lines = doc.splitlines()[1:]
    indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
    function.__doc__ = doc + "\n\n" + "\n".join(
        " " * indent + _describe(row) for row in rows)


def _coerced(section, given):
    """`given` (keyword: value, None for the library's default) without the
    Nones, ints and numbers made Python's int and float (numpy scalars
    included), for json."""
    types = {row["name"]: row["type"] for row in _rows(section)}
    values = {}
    for name, value in given.items():
        if value is None:
            continue
        if types.get(name) in ("int", "uint64"):
            value = int(value)
        elif types.get(name) == "number":
            value = float(value)
        values[name] = value
    return values


def _step_options(**given):
    """An fsdp2_step_options_t from training_step's keywords (None: the
    library's default), through fsdp2_step_options_from_json."""
    options = _c.fsdp2_step_options_t()
    _c.fsdp2_step_options_init(options)
    _c.fsdp2_step_options_from_json(json.dumps(_coerced("step", given)), options)
    return options


class Optimizer:
    """How to build the optimizer over the local shards: AdamW unless `kind`
    says otherwise; its keywords are the library's optimizer options (see
    __init__)."""

    def __init__(self, kind=None, **options):
        """Keyword options, the keys of fsdp2_optimizer_options_from_json;
        those not given keep the library's defaults, below. `kind` may also
        come first by position (Optimizer("sgd", lr=0.1)). An unknown kind
        or key, a value of the wrong type or out of its range (lr <= 0,
        betas outside [0, 1), eps <= 0, negative weight_decay or momentum)
        raises InvalidArgumentError here; a value json cannot encode raises
        TypeError. The options, their defaults and what each does:"""
        if kind is not None:
            options = dict(kind=kind, **options)
        self._options = _c.fsdp2_optimizer_options_t()
        _c.fsdp2_optimizer_options_init(self._options)
        _c.fsdp2_optimizer_options_from_json(json.dumps(options), self._options)

    @property
    def lr(self):
        """The learning rate (float) the optimizer will be built with."""
        return self._options.lr


_with_options(Optimizer.__init__, "optimizer", positional=("kind",))
