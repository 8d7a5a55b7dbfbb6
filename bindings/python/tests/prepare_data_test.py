"""fsdp2.prepare_data (bindings/python/fsdp2/prepare_data.py): JSON lines to
meta.json, tokens.bin, labels.bin and segments.bin, against tokenizers built
here (a word-level vocabulary, <s> added in front, a chat template with and
without {% generation %} blocks), so no hub download is needed.

The module is loaded from its file (FSDP2_PREPARE_DATA, else next to this
test's directory), not through `import fsdp2`, whose __init__ loads the
native library: prepare_data must stand alone."""

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import tokenizers  # noqa: F401 (the tokenizers fixtures build on it)
import transformers  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_PATH = os.environ.get("FSDP2_PREPARE_DATA") or os.path.join(
    HERE, os.pardir, "fsdp2", "prepare_data.py")


def _load_module():
    spec = importlib.util.spec_from_file_location("fsdp2_prepare_data", MODULE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pd = _load_module()

WORDS = ("hello world the a cat dog sat on mat is what who are you i am bot "
         "hi fine thanks good say it again").split()
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
PAD, BOS, EOS = 0, 1, 2

# The two templates render the same text; only the first marks the
# assistant turns ({% generation %}: its content and its <|end|>).
MARKED_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> "
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }} <|end|> {% endgeneration %}"
    "{% else %}{{ m['content'] }} <|end|> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}")
PLAIN_TEMPLATE = MARKED_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# Renders an extra </s> after the last message only, so the rendering of
# the messages up to an earlier turn is not a prefix of the whole chat's.
NOT_PREFIX_TEMPLATE = PLAIN_TEMPLATE.replace("{% endfor %}",
                                             "{% if loop.last %}</s> {% endif %}{% endfor %}")

CHATS = [
    [{"role": "system", "content": "you are bot"},
     {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"},
     {"role": "user", "content": "what is it"},
     {"role": "assistant", "content": "fine thanks"}],
    [{"role": "user", "content": "who are you"},
     {"role": "assistant", "content": "i am bot"}],
    [{"role": "system", "content": "say hi"},
     {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hi"},
     {"role": "user", "content": "again"},
     {"role": "assistant", "content": "hi again"},
     {"role": "user", "content": "good"}],  # ends on a user turn: not learned
]


def _make_tokenizer(directory, template):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=SPECIAL[4:])
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: _make_tokenizer(str(root / name), template) for name, template in [
        ("marked", MARKED_TEMPLATE), ("plain", PLAIN_TEMPLATE),
        ("not_prefix", NOT_PREFIX_TEMPLATE), ("no_template", None)]}


def write_jsonl(path, objects):
    with open(path, "w", encoding="utf-8") as f:
        for obj in objects:
            f.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    return str(path)


def read(output_dir):
    with open(os.path.join(output_dir, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    shape = (meta["rows"], meta["seq_len"])
    arrays = {}
    for key, name in meta["files"].items():
        path = os.path.join(output_dir, name)
        assert os.path.getsize(path) == shape[0] * shape[1] * 4, name
        arrays[key] = np.fromfile(path, dtype="<i4").reshape(shape)
    return meta, arrays["tokens"], arrays["labels"], arrays["segments"]


def prepared(tokenizer_dir, data, output_dir, seq_len, pack=False):
    """prepare(), then read() its output; checks the returned meta is the
    file's."""
    meta = pd.prepare(tokenizer_dir, data, str(output_dir), seq_len, pack=pack)
    found = read(str(output_dir))
    assert found[0] == meta
    return found


def documents(tokens, labels, segments):
    """[(tokens, labels)] of every document, in row-major order."""
    found = []
    for r in range(tokens.shape[0]):
        for s in range(segments[r].max() + 1):
            at = segments[r] == s
            found.append((tuple(tokens[r][at]), tuple(labels[r][at])))
    return found


def tokenizer(directory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(directory)


def test_text_every_next_token_is_learned(tmp_path, tokenizers):
    texts = ["hello world", "the cat sat on the mat", "a dog </s>"]  # the last ends with eos
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    out = str(tmp_path / "out")
    meta = pd.prepare(tokenizers["marked"], data, out, seq_len=10)
    assert sorted(os.listdir(out)) == ["labels.bin", "meta.json", "segments.bin", "tokens.bin"]
    meta, tokens, labels, segments = read(out)
    tok = tokenizer(tokenizers["marked"])
    expected = [tok(t)["input_ids"] for t in texts]
    expected = [ids if ids[-1] == EOS else ids + [EOS] for ids in expected]
    assert [len(e) for e in expected] == [4, 8, 4]  # bos + words + one eos each
    for r, ids in enumerate(expected):
        n = len(ids)
        assert list(tokens[r, :n]) == ids
        assert list(labels[r, :n - 1]) == ids[1:]  # every label is the next token
        assert (labels[r, n - 1:] == -100).all()  # the last token's and the padding's
        assert (segments[r, :n] == 0).all() and (segments[r, n:] == -1).all()
        assert (tokens[r, n:] == PAD).all()
    assert meta == {
        "format": "fsdp2-sft", "version": 1, "seq_len": 10, "rows": 3, "packed": False,
        "pad_token_id": PAD, "ignore_index": -100, "dtype": "int32", "byte_order": "little",
        "input_format": "text", "documents": 3, "learned_tokens": 3 + 7 + 3, "tokens": 16,
        "tokenizer": tokenizers["marked"], "input": data,
        "files": {"tokens": "tokens.bin", "labels": "labels.bin", "segments": "segments.bin"}}


def test_prompt_completion_learns_the_completion_and_eos(tmp_path, tokenizers):
    lines = [{"prompt": "who are you", "completion": "i am bot"},
             {"prompt": "what", "completion": "a cat"}]
    data = write_jsonl(tmp_path / "in.jsonl", lines)
    meta, tokens, labels, _ = prepared(tokenizers["marked"], data, tmp_path / "out", 12)
    tok = tokenizer(tokenizers["marked"])
    for r, line in enumerate(lines):
        prompt = tok(line["prompt"])["input_ids"]
        completion = tok(line["completion"], add_special_tokens=False)["input_ids"] + [EOS]
        p, n = len(prompt), len(prompt) + len(completion)
        assert prompt[0] == BOS and completion[0] != BOS
        assert list(tokens[r, :n]) == prompt + completion
        # Unlearned exactly where the next token is the prompt's.
        assert (labels[r, :p - 1] == -100).all()
        assert list(labels[r, p - 1:n - 1]) == completion
        assert (labels[r, n - 1:] == -100).all()
    assert meta["input_format"] == "prompt_completion"
    assert meta["learned_tokens"] == 4 + 3


def test_messages_learn_what_the_templates_generation_blocks_mark(tmp_path, tokenizers):
    data = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in CHATS])
    pd.prepare(tokenizers["marked"], data, str(tmp_path / "marked"), seq_len=32)
    pd.prepare(tokenizers["plain"], data, str(tmp_path / "plain"), seq_len=32)
    meta, tokens, labels, _ = read(tmp_path / "marked")
    tok = tokenizer(tokenizers["marked"])
    learned = 0
    for r, chat in enumerate(CHATS):
        own = tok.apply_chat_template(chat, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids, mask = list(own["input_ids"]), list(own["assistant_masks"])
        n = len(ids)
        assert any(mask) and not all(mask)
        assert list(tokens[r, :n]) == ids
        shifted = [ids[t + 1] if mask[t + 1] else -100 for t in range(n - 1)] + [-100]
        assert list(labels[r, :n]) == shifted
        learned += sum(mask[1:])
    assert meta["input_format"] == "messages" and meta["learned_tokens"] == learned
    # The system turn and the last user turn are not learned; <|end|> of an
    # assistant turn is.
    end = SPECIAL.index("<|end|>")
    assert end in labels[0] and (labels[0] != SPECIAL.index("<|system|>")).all()
    # The template without markers, found by rendering turn by turn: the
    # same tokens, the same labels.
    plain = read(tmp_path / "plain")
    assert (plain[1] == tokens).all() and (plain[2] == labels).all()
    assert plain[0]["learned_tokens"] == learned


def test_packing_fills_rows_in_order_without_splitting_documents(tmp_path, tokenizers):
    lines = [{"text": "hello world"}, {"text": "the cat sat on the mat"}, {"text": "a dog"},
             {"text": "hi"}, {"text": "the dog sat on a mat it is good"}, {"text": "fine"}]
    data = write_jsonl(tmp_path / "in.jsonl", lines)
    T = 12
    unpacked = prepared(tokenizers["marked"], data, tmp_path / "one", T)
    packed = prepared(tokenizers["marked"], data, tmp_path / "packed", T, pack=True)
    meta, tokens, labels, segments = packed
    assert meta["packed"] and meta["rows"] < unpacked[0]["rows"] == len(lines)
    assert meta["documents"] == len(lines)
    for key in ("tokens", "learned_tokens"):
        assert meta[key] == unpacked[0][key]
    # The same documents, whole, in input order.
    one = documents(*unpacked[1:])
    assert documents(tokens, labels, segments) == one
    assert Counter(documents(tokens, labels, segments)) == Counter(one)
    lengths = [len(d[0]) for d in one]
    # Segments count 0, 1, ... along each row, then padding; and a row's
    # first document would not have fitted in the row before (greedy).
    fill = []
    for r in range(meta["rows"]):
        real = segments[r][segments[r] >= 0]
        assert (segments[r][len(real):] == -1).all() and (tokens[r][len(real):] == PAD).all()
        assert (np.diff(real) >= 0).all() and real[0] == 0
        assert set(np.diff(real)) <= {0, 1}
        fill.append(len(real))
    first = 0
    for r in range(meta["rows"] - 1):
        first += segments[r].max() + 1
        assert fill[r] + lengths[first] > T


def test_packing_cuts_a_document_longer_than_a_row(tmp_path, tokenizers):
    text = "the cat sat on the mat and the dog sat on a mat"  # 13 words: 15 tokens
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}, {"text": text}])
    whole = prepared(tokenizers["marked"], data, tmp_path / "whole", 16)
    meta, tokens, labels, segments = prepared(tokenizers["marked"], data, tmp_path / "cut", 7,
                                              pack=True)
    short, long_ = documents(*whole[1:])
    assert len(long_[0]) == 15
    pieces = documents(tokens, labels, segments)
    # "hi" (3 tokens) fills row 0 alone: the first piece (7) does not fit
    # beside it. Then pieces of 7, 7 and 1, each a document of its own.
    assert pieces[0] == short and [len(p[0]) for p in pieces[1:]] == [7, 7, 1]
    assert sum((p[0] for p in pieces[1:]), ()) == long_[0]
    for p in pieces[1:]:
        # Within a piece, the whole document's labels; none across a cut.
        start = sum(len(q[0]) for q in pieces[1:pieces.index(p)])
        assert p[1][:-1] == long_[1][start:start + len(p[0]) - 1] and p[1][-1] == -100
    # The last piece, one token, learns nothing: its row is written all the same.
    assert meta["rows"] == 4 and (labels[3] == -100).all() and segments[3][0] == 0
    assert meta["tokens"] == 3 + 15 and meta["learned_tokens"] == 2 + 6 + 6


BAD = [
    # (name, lines, seq_len, pack, tokenizer, what the message names)
    ("not json", [{"text": "hi"}, '{"text": "hello"'], 8, False, "marked",
     ["line 2", "not JSON"]),
    ("not an object", [{"text": "hi"}, "[1, 2]"], 8, False, "marked",
     ["line 2", "JSON object", "list"]),
    ("no known field", ['{"body": "hi"}'], 8, False, "marked", ["line 1", "'text'", "body"]),
    ("missing completion", [{"prompt": "hi", "completion": "a"}, {"prompt": "hi"}], 8, False,
     "marked", ["line 2", "field 'completion' is missing"]),
    ("missing content", [{"messages": CHATS[1]},
                         {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}],
     16, False, "marked", ["line 2", "field 'messages[1].content' is missing"]),
    ("wrong type", [{"text": "hi"}, {"text": 5}], 8, False, "marked",
     ["line 2", "field 'text' must be a string", "int"]),
    ("messages not a list", [{"messages": "hi"}], 8, False, "marked",
     ["line 1", "field 'messages' must be a non-empty list"]),
    ("other format", [{"text": "hi"}, "", {"prompt": "hi", "completion": "a"}], 8, False,
     "marked", ["line 3", "field 'prompt'", "prompt_completion", "text"]),
    ("two formats on a line", [{"text": "hi", "messages": CHATS[1]}], 8, False, "marked",
     ["line 1", "'text'", "'messages'"]),
    ("no assistant turn", [{"messages": CHATS[1]}, {"messages": CHATS[0][:2]}], 32, False,
     "marked", ["line 2", "field 'messages'", "no assistant turn"]),
    ("too long unpacked", [{"text": "hi"}, {"text": "the cat sat on the mat"}], 6, False,
     "marked", ["line 2", "field 'text'", "8 tokens", "seq_len 6"]),
    ("no chat template", [{"messages": CHATS[1]}], 32, False, "no_template",
     ["line 1", "field 'messages'", "chat template"]),
    ("turn not a prefix", [{"messages": CHATS[0]}], 32, False, "not_prefix",
     ["line 1", "field 'messages'", "not a prefix"]),
    ("empty input", ["", "  "], 8, False, "marked", ["no lines"]),
    ("seq_len 1", [{"text": "hi"}], 1, True, "marked", ["seq_len", "at least 2"]),
]


@pytest.mark.parametrize("lines, seq_len, pack, which, names",
                         [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_line_and_field_and_writes_nothing(
        tmp_path, tokenizers, lines, seq_len, pack, which, names):
    data = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "new" / "out"  # its parent does not exist either
    with pytest.raises(pd.PrepareDataError) as raised:
        pd.prepare(tokenizers[which], data, str(out), seq_len, pack=pack)
    message = str(raised.value)
    if "seq_len" not in names:
        assert data in message
    for name in names:
        assert name in message, message
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no output, no temporary directory


def test_a_tokenizer_that_does_not_load(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}])
    for directory in (tmp_path / "empty", tmp_path / "absent"):
        if directory.name == "empty":
            directory.mkdir()
        with pytest.raises(pd.PrepareDataError, match="tokenizer directory .* (does not load|"
                                                      "does not exist)") as raised:
            pd.prepare(str(directory), data, str(tmp_path / "out"), 8)
        assert str(directory) in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_an_output_that_exists_is_kept_unless_overwrite(tmp_path, tokenizers):
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(pd.PrepareDataError, match="not empty.*--overwrite"):
        pd.prepare(tokenizers["marked"], data, str(out), 8)
    assert os.listdir(out) == ["keep"]
    # A failed overwrite keeps the old output too.
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": 1}])
    with pytest.raises(pd.PrepareDataError):
        pd.prepare(tokenizers["marked"], bad, str(out), 8, overwrite=True)
    assert os.listdir(out) == ["keep"]
    pd.prepare(tokenizers["marked"], data, str(out), 8, overwrite=True)
    assert "keep" not in os.listdir(out) and read(str(out))[0]["rows"] == 1
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "in.jsonl", "out"]
    # An empty directory is taken as it is.
    (tmp_path / "empty").mkdir()
    pd.prepare(tokenizers["marked"], data, str(tmp_path / "empty"), 8)
    assert read(str(tmp_path / "empty"))[0]["rows"] == 1


def test_main_writes_and_prints_a_summary(tmp_path, tokenizers, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world"}, {"text": "a cat"}])
    out = str(tmp_path / "out")
    assert pd.main(["--tokenizer", tokenizers["marked"], "--input", data, "--output", out,
                    "--seq-len", "8", "--pack"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert "1 rows" in printed[0] and "2 documents" in printed[0] and "8 tokens" in printed[0]
    assert "6 learned tokens" in printed[0] and "fill 100.0%" in printed[0]
    assert read(out)[0]["packed"] is True


def test_main_returns_2_and_prints_the_error(tmp_path, tokenizers, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", [{"text": "hi"}, {"prompt": "hi"}])
    out = str(tmp_path / "out")
    assert pd.main(["--tokenizer", tokenizers["marked"], "--input", data, "--output", out,
                    "--seq-len", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_data: ") and "line 2" in err and "'prompt'" in err
    assert not os.path.exists(out)


def test_runs_as_a_script_without_the_native_library(tmp_path, tokenizers):
    """`python prepare_data.py` (what `python -m fsdp2.prepare_data` runs,
    without fsdp2/__init__'s native library)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, MODULE_PATH, "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--seq-len" in done.stdout and "--pack" in done.stdout
    data = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in CHATS])
    done = subprocess.run([sys.executable, MODULE_PATH, "--tokenizer", tokenizers["plain"],
                           "--input", data, "--output", str(tmp_path / "out"),
                           "--seq-len", "64", "--pack"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "3 documents" in done.stdout
    assert read(str(tmp_path / "out"))[0]["input_format"] == "messages"


if __name__ == "__main__":  # bazel's py_test runs the file
    import pytest

    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"]))
