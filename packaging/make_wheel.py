"""Writes fsdp2's wheel (PEP 427) from built files, with no network.

    make_wheel.py --out fsdp2-1.9.0-cp311-cp311-linux_x86_64.whl \
        --version 1.9.0 --readme README.md fsdp2/__init__.py=SRC ...

Each ARCHIVE_PATH=SRC pair puts file SRC into the wheel at ARCHIVE_PATH;
the .dist-info (METADATA, WHEEL, top_level.txt, RECORD with sha256 digests)
is written here. The tags come from the file name.
"""

import argparse
import base64
import hashlib
import os
import zipfile

# Reproducible: every entry gets this time (zip cannot store earlier than 1980).
_DATE = (1980, 1, 1, 0, 0, 0)


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--readme", required=True)
    parser.add_argument("files", nargs="+", metavar="ARCHIVE_PATH=SRC")
    args = parser.parse_args()

    name, version, python_tag, abi_tag, platform_tag = (
        os.path.basename(args.out)[: -len(".whl")].split("-"))
    if name != "fsdp2" or version != args.version:
        parser.error(f"{args.out} does not name fsdp2 {args.version}")
    dist_info = f"{name}-{version}.dist-info"

    entries = []
    for pair in args.files:
        archive_path, sep, src = pair.partition("=")
        if not sep or not archive_path or not src:
            parser.error(f"expected ARCHIVE_PATH=SRC, got {pair!r}")
        with open(src, "rb") as f:
            entries.append((archive_path, f.read()))
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()

    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        "Summary: Fully Sharded Data Parallel training (PyTorch's FSDP2) for LibTorch\n"
        "Requires-Python: ==3.11.*\n"
        "Requires-Dist: numpy\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + readme)
    wheel = (
        "Wheel-Version: 1.0\n"
        "Generator: fsdp2 packaging/make_wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {python_tag}-{abi_tag}-{platform_tag}\n")
    top_names = sorted({path.split("/")[0] for path, _ in entries})
    entries += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/top_level.txt", "".join(n + "\n" for n in top_names).encode()),
    ]
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in entries)
    record += f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode()))

    with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in entries:
            info = zipfile.ZipInfo(path, date_time=_DATE)
            executable = path.endswith(".so") or ".so." in path
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)


if __name__ == "__main__":
    main()
