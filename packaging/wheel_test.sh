#!/usr/bin/env bash
# pip-installs the wheel (no index, no network) into a fresh virtual
# environment, which sees Debian's numpy (--system-site-packages), and from a
# directory outside the workspace trains the Python example (a copy) on 2
# ranks with the environment's python; a libfsdp2 with another ABI is
# refused at import with a clear error.
set -uo pipefail
version="$1"; wheel="$PWD/$2"; train_py="$PWD/$3"; abi_mismatch_c="$PWD/$4"
# The ABI these bindings were built for, as the header says.
abi=$(awk '/#define FSDP2_ABI_VERSION_MAJOR/ {a = $3} /#define FSDP2_ABI_VERSION_MINOR/ {b = $3}
           END {print a "." b}' "$5")
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel_test.XXXXXX")
fail() { echo "FAIL: $*"; exit 1; }
[[ $(basename "$wheel") == "fsdp2-$version-cp311-cp311-linux_x86_64.whl" ]] || fail "wheel named $(basename "$wheel")"

# Every file in the wheel is in its RECORD with the right sha256 and size.
python3 - "$wheel" <<'PY' || fail "RECORD does not match the wheel"
import base64, csv, hashlib, io, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    names = set(whl.namelist())
    record = [n for n in names if n.endswith(".dist-info/RECORD")]
    assert len(record) == 1, record
    rows = list(csv.reader(io.StringIO(whl.read(record[0]).decode())))
    assert {r[0] for r in rows} == names, sorted(names ^ {r[0] for r in rows})
    for path, digest, size in rows:
        if path == record[0]:
            continue
        data = whl.read(path)
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == want and int(size) == len(data), path
PY
python3 -m venv --system-site-packages "$tmp/venv" || fail "python3 -m venv failed"
py="$tmp/venv/bin/python"
"$py" -m pip install --no-index --no-cache-dir --disable-pip-version-check -q "$wheel" \
  || fail "pip install failed"
show=$("$py" -m pip show fsdp2) || fail "pip show failed"
grep -qx "Version: $version" <<<"$show" || fail "pip show: $show"

cp "$train_py" "$tmp/train.py"
cd "$tmp" || fail "cd $tmp"
unset PYTHONPATH
# The package comes from the environment, its extension finds libfsdp2 next
# to itself, and both report the version.
"$py" - "$tmp/venv" "$version" <<'PY' || fail "the installed package is not the one imported"
import os, sys
import fsdp2
venv, version = sys.argv[1], sys.argv[2]
assert os.path.realpath(fsdp2.__file__).startswith(os.path.realpath(venv)), fsdp2.__file__
assert fsdp2.__version__ == version, fsdp2.__version__
assert fsdp2.version().startswith(f"fsdp2 {version} "), fsdp2.version()
maps = open("/proc/self/maps").read()
lib = [l.split()[-1] for l in maps.splitlines() if "libfsdp2.so" in l][0]
assert os.path.realpath(lib).startswith(os.path.realpath(venv)), lib
print("wheel_test:", fsdp2.version(), "from", os.path.dirname(fsdp2.__file__))
PY

out=$(timeout 300 "$py" train.py --nproc 2 --steps 4 --ckpt-dir "$tmp/ckpt" 2>&1) || {
  echo "$out"; fail "train.py exited non-zero"; }
echo "$out"
losses=$(echo "$out" | grep -o 'loss [0-9.]*' | grep -v validation | awk '{print $2}')
[[ $(echo "$losses" | wc -l) -ge 4 ]] || fail "expected 4 step losses"
first=$(echo "$losses" | head -1); last=$(echo "$losses" | sed -n 4p)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall ($first -> $last)"
[[ $(ls "$tmp/ckpt" | grep -c safetensors) -ge 2 ]] || fail "expected a shard file per rank"

# Another ABI: a clear ImportError, no crash.
gcc -shared -fPIC -o "$tmp/libabi_mismatch.so" "$abi_mismatch_c" || fail "gcc"
err=$(LD_PRELOAD="$tmp/libabi_mismatch.so" "$py" -c "import fsdp2" 2>&1) && fail "ABI 2.0 was accepted"
[[ $abi =~ ^[0-9]+\.[0-9]+$ ]] || fail "no ABI version in fsdp2.h (got '$abi')"
grep -q "ImportError: fsdp2 $version: the loaded libfsdp2 has ABI 2.0, but these bindings .* were built for ABI $abi" <<<"$err" \
  || { echo "$err"; fail "unclear ABI error"; }
echo PASS
