"""fsdp2.prepare_data: JSON lines to the binary dataset the C++ loader maps.

    python3 -m fsdp2.prepare_data --tokenizer DIR --input FILE.jsonl \\
        --output DIR --seq-len T [--pack] [--overwrite]

(or `python3 prepare_data.py ...`: the file imports nothing else of fsdp2,
so it runs without the native library; transformers is needed for the
tokenizer). From Python: prepare(tokenizer_dir, input_path, output_dir,
seq_len, pack=False) returns the meta dict below.

Input: one JSON object a line (blank lines are skipped); the first line's
fields choose the format, and every line must then have it:
- {"text": ...}: pre-training text, every token learned. Tokenised as the
  tokenizer does by default (bos etc.), then its eos appended if it has one
  and the ids do not already end with it.
- {"prompt": ..., "completion": ...}: the prompt (default special tokens)
  is not learned; the completion (no special tokens) and an appended eos are.
- {"messages": [{"role": ..., "content": ...}, ...]}: rendered with the
  tokenizer's chat template; the assistant turns are learned. A template
  with {% generation %} blocks marks them itself; without, each assistant
  turn is the tokens between the rendering of the messages before it (with
  the generation prompt) and the rendering that includes it. No eos is
  appended: the template ends the turns.

Output: a directory of four files. A document of n tokens occupies n
consecutive positions of a row of T = seq_len.
- meta.json: {"format": "fsdp2-sft", "version": 1, "seq_len": T,
  "rows": R, "packed": bool, "pad_token_id": int, "ignore_index": -100,
  "dtype": "int32", "byte_order": "little", "input_format": "text" |
  "prompt_completion" | "messages", "documents": D (non-blank input lines),
  "learned_tokens": labels != -100, "tokens": real (non-pad) tokens,
  "tokenizer": DIR as given, "input": FILE as given, "files": {"tokens":
  "tokens.bin", "labels": "labels.bin", "segments": "segments.bin"}}
- tokens.bin: int32 little-endian [R, T] row-major, the input ids; padding
  holds pad_token_id (the tokenizer's pad id, else its eos id, else 0).
- labels.bin: int32 [R, T], already shifted: labels[r, t] is the token at
  t + 1 of the same document if that token is learned, else -100 (so the
  last token of a document, unlearned next tokens and padding are -100).
  The trainer does not shift again.
- segments.bin: int32 [R, T], the document's index within its row (0, 1,
  ... in order), -1 for padding. Positions restart at 0 at each document and
  attention stays inside it; the trainer derives both from this.

Without --pack each document is one row, right-padded; one longer than T is
an error. With --pack documents go into rows in input order, greedily (into
the current row if they fit, else a new row; no reordering, so the output is
deterministic). A document longer than T is cut into consecutive pieces of T
tokens (the last shorter), each piece a document of its own: no label
crosses a cut. Rows without a learned token are written all the same.

Bad input raises PrepareDataError naming the file, line (1-based) and field,
and writes nothing: the files go to a temporary directory next to the output,
renamed into place at the end. An existing non-empty output directory is
refused unless overwrite=True (--overwrite). docs/data-format.md says the
same for readers of the files.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

IGNORE_INDEX = -100
FORMAT_FIELDS = {"text": ("text",), "prompt_completion": ("prompt", "completion"),
                 "messages": ("messages",)}
FILES = {"tokens": "tokens.bin", "labels": "labels.bin", "segments": "segments.bin"}
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


class PrepareDataError(ValueError):
    """Input, tokenizer or output that cannot make a dataset; the message
    says where (file, line, field) and what to change."""


# --- Tokenizer -------------------------------------------------------------


def _load_tokenizer(tokenizer_dir):
    """transformers' AutoTokenizer from a local directory (no hub look-up)."""
    if not os.path.isdir(tokenizer_dir):
        raise PrepareDataError(f"tokenizer directory {tokenizer_dir} does not exist")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise PrepareDataError(f"the tokenizer needs transformers ({e}); pip install transformers")
    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except Exception as e:  # transformers raises many kinds; all mean "not a tokenizer"
        raise PrepareDataError(f"tokenizer directory {tokenizer_dir} does not load: "
                               f"{type(e).__name__}: {e}") from None


def _chat_template(tokenizer):
    """The tokenizer's chat template as text, or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one renders chats
        template = template.get("default")
    return template if isinstance(template, str) else None


def _ids(encoding):
    """input_ids as a list of ints, from a BatchEncoding, a dict or a list
    (apply_chat_template's return differs across transformers versions)."""
    if hasattr(encoding, "keys"):
        encoding = encoding["input_ids"]
    return [int(i) for i in encoding]


class _Encoder:
    """One document's (ids, learned) from one parsed line; `learned[i]` says
    whether token i is a target."""

    def __init__(self, tokenizer, tokenizer_dir):
        self.tok = tokenizer
        self.eos = tokenizer.eos_token_id
        self.template = template = _chat_template(tokenizer)
        self.marked = bool(template and _GENERATION_BLOCK.search(template))
        self.tokenizer_dir = tokenizer_dir

    def _with_eos(self, ids, learned):
        if self.eos is not None and (not ids or ids[-1] != self.eos):
            ids.append(int(self.eos))
            learned.append(True)
        return ids, learned

    def text(self, obj, where):
        ids = _ids(self.tok(obj["text"], verbose=False))
        return self._with_eos(ids, [True] * len(ids))

    def prompt_completion(self, obj, where):
        prompt = _ids(self.tok(obj["prompt"], verbose=False))
        completion = _ids(self.tok(obj["completion"], add_special_tokens=False, verbose=False))
        return self._with_eos(prompt + completion,
                              [False] * len(prompt) + [True] * len(completion))

    def _render(self, messages, generation_prompt=False, mask=False):
        extra = {"return_assistant_tokens_mask": True} if mask else {}
        return self.tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            add_generation_prompt=generation_prompt, **extra)

    def messages(self, obj, where):
        messages = obj["messages"]
        if self.template is None:
            raise PrepareDataError(f"{where}: field 'messages' needs a chat template, and the "
                                   f"tokenizer in {self.tokenizer_dir} has none; add one "
                                   f"(chat_template.jinja) or use the text format")
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            raise PrepareDataError(f"{where}: field 'messages' has no assistant turn, so "
                                   f"nothing would be learned; add one or drop the line")
        try:
            if self.marked:  # the template's {% generation %} blocks mark the turns
                rendered = self._render(messages, mask=True)
                ids = _ids(rendered)
                learned = [bool(m) for m in rendered["assistant_masks"]]
                if not any(learned):
                    raise PrepareDataError(f"{where}: the chat template's generation blocks "
                                           f"marked no token of field 'messages'")
                return ids, learned
            # No markers: each assistant turn is what its message adds to the
            # rendering of the ones before it, with the generation prompt.
            ids = _ids(self._render(messages))
            learned = [False] * len(ids)
            for i in turns:
                start = _ids(self._render(messages[:i], generation_prompt=True))
                end = _ids(self._render(messages[:i + 1]))
                for name, prefix in ((f"messages[:{i}] with the generation prompt", start),
                                     (f"messages[:{i + 1}]", end)):
                    if ids[:len(prefix)] != prefix:
                        raise PrepareDataError(
                            f"{where}: field 'messages': the rendering of {name} is not a prefix "
                            f"of the whole chat's, so the assistant turn cannot be found; add "
                            f"{{% generation %}} blocks to the chat template")
                learned[len(start):len(end)] = [True] * max(0, len(end) - len(start))
            return ids, learned
        except PrepareDataError:
            raise
        except Exception as e:  # a template error (raise_exception, a bad role order, ...)
            raise PrepareDataError(f"{where}: field 'messages' does not render with the chat "
                                   f"template: {type(e).__name__}: {e}") from None


# --- Input -----------------------------------------------------------------


def _line_format(obj, where):
    """The format whose fields `obj` has (None: none of them)."""
    found = [name for name, fields in FORMAT_FIELDS.items() if any(f in obj for f in fields)]
    if len(found) > 1:
        fields = [f for name in found for f in FORMAT_FIELDS[name] if f in obj]
        raise PrepareDataError(f"{where}: fields {fields} belong to different formats "
                               f"({', '.join(found)}); a line has one")
    return found[0] if found else None


def _check_fields(obj, fmt, where):
    """Every field of `fmt` present and of its type."""
    for field in FORMAT_FIELDS[fmt]:
        if field not in obj:
            raise PrepareDataError(f"{where}: field '{field}' is missing")
    if fmt != "messages":
        for field in FORMAT_FIELDS[fmt]:
            if not isinstance(obj[field], str):
                raise PrepareDataError(f"{where}: field '{field}' must be a string, "
                                       f"not {type(obj[field]).__name__}")
        return
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise PrepareDataError(f"{where}: field 'messages' must be a non-empty list of "
                               f"{{\"role\": ..., \"content\": ...}} objects")
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PrepareDataError(f"{where}: field 'messages[{k}]' must be an object, "
                                   f"not {type(message).__name__}")
        for field in ("role", "content"):
            if field not in message:
                raise PrepareDataError(f"{where}: field 'messages[{k}].{field}' is missing")
            if not isinstance(message[field], str):
                raise PrepareDataError(f"{where}: field 'messages[{k}].{field}' must be a "
                                       f"string, not {type(message[field]).__name__}")


def _records(input_path):
    """(where, object) per non-blank line; `where` is "FILE, line N", for
    messages."""
    try:
        f = open(input_path, "rb")
    except OSError as e:
        raise PrepareDataError(f"cannot read input {input_path}: {e.strerror}") from None
    with f:
        for number, raw in enumerate(f, 1):
            where = f"{input_path}, line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PrepareDataError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareDataError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise PrepareDataError(f"{where}: a line must be a JSON object with field "
                                       f"'text', 'prompt'/'completion' or 'messages', "
                                       f"not {type(obj).__name__}")
            yield where, obj


# --- Rows ------------------------------------------------------------------


class _RowWriter:
    """Places documents into rows of T and appends the finished rows to the
    three files; counts what meta.json reports."""

    def __init__(self, directory, seq_len, pad_id, pack):
        self.T, self.pad_id, self.pack = seq_len, pad_id, pack
        self.files = {k: open(os.path.join(directory, v), "wb") for k, v in FILES.items()}
        self.rows = self.tokens = self.learned = 0
        self._new_row()

    def _new_row(self):
        self.row_tokens = np.full(self.T, self.pad_id, dtype="<i4")
        self.row_labels = np.full(self.T, IGNORE_INDEX, dtype="<i4")
        self.row_segments = np.full(self.T, -1, dtype="<i4")
        self.fill, self.segment = 0, 0

    def _flush(self):
        if self.fill == 0:
            return
        for key, row in (("tokens", self.row_tokens), ("labels", self.row_labels),
                         ("segments", self.row_segments)):
            self.files[key].write(row.tobytes())
        self.rows += 1
        self._new_row()

    def _place(self, ids, learned):
        """One document of at most T tokens: into this row if it fits (and
        packing is on), else into a new one."""
        n = len(ids)
        if self.fill and (not self.pack or self.fill + n > self.T):
            self._flush()
        a, b = self.fill, self.fill + n
        self.row_tokens[a:b] = ids
        # Shifted: position t predicts token t + 1 of this document, if learned.
        labels = np.where(learned[1:], ids[1:], IGNORE_INDEX)
        self.row_labels[a:b - 1] = labels
        self.row_segments[a:b] = self.segment
        self.fill, self.segment = b, self.segment + 1
        self.tokens += n
        self.learned += int(np.count_nonzero(labels != IGNORE_INDEX))

    def add(self, ids, learned):
        ids, learned = np.asarray(ids, dtype=np.int64), np.asarray(learned, dtype=bool)
        # Pieces of T (longer documents reach here only when packing); a
        # document of no tokens takes no position.
        for start in range(0, len(ids), self.T):
            self._place(ids[start:start + self.T], learned[start:start + self.T])

    def close(self):
        self._flush()
        for f in self.files.values():
            f.close()


# --- Output directory ------------------------------------------------------


def _check_output(output_dir, overwrite):
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            raise PrepareDataError(f"output {output_dir} exists and is not a directory")
        if os.listdir(output_dir) and not overwrite:
            raise PrepareDataError(f"output directory {output_dir} exists and is not empty; "
                                   f"remove it, choose another or pass --overwrite")


def _make_parents(path):
    """Creates the missing directories above `path`; returns them, deepest
    first, so a failed run can remove them again."""
    made = []
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(made):
        os.mkdir(directory)
    return made


def _move_into_place(staging, output_dir, overwrite):
    """Renames the finished `staging` directory to `output_dir`; an old
    output (allowed by overwrite) is moved aside first, removed last."""
    _check_output(output_dir, overwrite)  # again: it may have appeared meanwhile
    old = None
    if os.path.exists(output_dir):
        old = staging + ".old"
        os.rename(output_dir, old)
    os.rename(staging, output_dir)
    if old:
        shutil.rmtree(old)


# --- Entry points ----------------------------------------------------------


def prepare(tokenizer_dir, input_path, output_dir, seq_len, pack=False, overwrite=False):
    """Writes the dataset of `input_path` (JSON lines) to `output_dir` in
    rows of `seq_len` tokens, packed if `pack`, and returns its meta dict
    (see the module docstring). Raises PrepareDataError, with nothing
    written, on bad input, a tokenizer that does not load or a non-empty
    output directory (unless `overwrite`)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 2:
        raise PrepareDataError(f"seq_len must be an int of at least 2 (a row needs an input "
                               f"and a next token), not {seq_len!r}")
    seq_len = int(seq_len)
    output_dir = os.fspath(output_dir)
    _check_output(output_dir, overwrite)
    tokenizer = _load_tokenizer(tokenizer_dir)
    encoder = _Encoder(tokenizer, tokenizer_dir)
    pad_id = next((int(i) for i in (tokenizer.pad_token_id, tokenizer.eos_token_id)
                   if i is not None), 0)

    made, staging = _make_parents(output_dir), None
    try:
        staging = tempfile.mkdtemp(
            prefix=f".{os.path.basename(os.path.abspath(output_dir))}.tmp-",
            dir=os.path.dirname(os.path.abspath(output_dir)))
        writer = _RowWriter(staging, seq_len, pad_id, pack)
        fmt, documents = None, 0
        try:
            for where, obj in _records(input_path):
                line_fmt = _line_format(obj, where)
                if fmt is None:
                    if line_fmt is None:
                        raise PrepareDataError(
                            f"{where}: no field 'text', 'prompt'/'completion' or 'messages' "
                            f"(fields: {sorted(obj)}); the first line chooses the format")
                    fmt = line_fmt
                elif line_fmt not in (fmt, None):
                    field = next(f for f in FORMAT_FIELDS[line_fmt] if f in obj)
                    raise PrepareDataError(
                        f"{where}: field '{field}' is of the {line_fmt} "
                        f"format, but the first line is {fmt}; a file has one format")
                _check_fields(obj, fmt, where)
                ids, learned = getattr(encoder, fmt)(obj, where)
                if len(ids) > seq_len and not pack:
                    fields = " and ".join(f"'{f}'" for f in FORMAT_FIELDS[fmt])
                    raise PrepareDataError(
                        f"{where}: {len(ids)} tokens (field {fields}), more than seq_len "
                        f"{seq_len}; raise --seq-len, shorten the line or "
                        f"pass --pack (which cuts it into pieces)")
                writer.add(ids, learned)
                documents += 1
        finally:
            writer.close()
        if documents == 0:
            raise PrepareDataError(f"input {input_path} has no lines (blank lines are skipped)")
        meta = {
            "format": "fsdp2-sft", "version": 1, "seq_len": seq_len, "rows": writer.rows,
            "packed": bool(pack), "pad_token_id": pad_id, "ignore_index": IGNORE_INDEX,
            "dtype": "int32", "byte_order": "little", "input_format": fmt,
            "documents": documents, "learned_tokens": writer.learned, "tokens": writer.tokens,
            "tokenizer": os.fspath(tokenizer_dir), "input": os.fspath(input_path),
            "files": dict(FILES),
        }
        with open(os.path.join(staging, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
        _move_into_place(staging, output_dir, overwrite)
    except BaseException:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        for directory in made:  # deepest first; only the ones this run made
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
    return meta


def main(argv=None):
    """The command line (see the module docstring): 0 on success, after one
    summary line; 2 after printing "prepare_data: <message>" to stderr."""
    parser = argparse.ArgumentParser(
        prog="python3 -m fsdp2.prepare_data",
        description="JSON lines (text, prompt/completion or chat messages) to fsdp2's binary "
                    "dataset: meta.json, tokens.bin, labels.bin, segments.bin "
                    "(docs/data-format.md).")
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="a directory transformers' AutoTokenizer loads")
    parser.add_argument("--input", required=True, metavar="FILE.jsonl",
                        help="one JSON object a line")
    parser.add_argument("--output", required=True, metavar="DIR", help="the dataset directory")
    parser.add_argument("--seq-len", required=True, type=int, metavar="T", help="tokens a row")
    parser.add_argument("--pack", action="store_true",
                        help="several documents a row, in input order; longer ones are cut")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty output directory")
    args = parser.parse_args(argv)
    try:
        meta = prepare(args.tokenizer, args.input, args.output, args.seq_len,
                       pack=args.pack, overwrite=args.overwrite)
    except PrepareDataError as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 2
    slots = meta["rows"] * meta["seq_len"]
    print(f"prepare_data: wrote {args.output}: {meta['rows']} rows of {meta['seq_len']}, "
          f"{meta['documents']} documents, {meta['tokens']} tokens, "
          f"{meta['learned_tokens']} learned tokens, fill {meta['tokens'] / max(slots, 1):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
