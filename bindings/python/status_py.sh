#!/bin/sh
# Writes fsdp2/_status.py (argument 2) from c_api/fsdp2.h (argument 1): the
# dict STATUSES maps each value of fsdp2_status_t, named without its FSDP2_
# or FSDP2_ERROR_ prefix, to SWIG's constant of the same C name, and DOCS
# holds the header's comment for it. A status added to the header reaches
# Python with the next build; fsdp2_test.py checks that each one has an
# exception class (as bindings/java/status_java.sh does for Java).
set -eu
header=$1
out=$2
awk '
  BEGIN {
    print "# Generated from c_api/fsdp2.h by bindings/python/status_py.sh: do not edit."
    print "\"\"\"The C ABI'"'"'s status codes (fsdp2_status_t), by name.\"\"\""
    print ""
    print "from . import fsdp2_c as _c"
    print ""
    statuses = "STATUSES = {\n"
    docs = "DOCS = {\n"
  }
  /^typedef enum fsdp2_status *\{/ { inside = 1; next }
  inside && /^\}/ { inside = 0 }
  inside && match($0, /FSDP2_(OK|ERROR_[A-Z0-9_]+)/) {
    c_name = substr($0, RSTART, RLENGTH)
    name = c_name
    sub(/^FSDP2_(ERROR_)?/, "", name)
    statuses = statuses "    \"" name "\": _c." c_name ",\n"
    if (match($0, /\/\*.*\*\//)) {
      doc = substr($0, RSTART + 3, RLENGTH - 6)
      gsub(/"/, "\\\"", doc)
      docs = docs "    \"" name "\": \"" doc "\",\n"
    }
    ++count
  }
  END {
    print statuses "}"
    print ""
    print docs "}"
    if (count < 2) {
      print "status_py.sh: found no fsdp2_status_t values in the header" > "/dev/stderr"
      exit 1
    }
  }
' "$header" > "$out"
