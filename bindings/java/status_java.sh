#!/bin/sh
# Writes org/fsdp2/Status.java (argument 2) from c_api/fsdp2.h (argument 1):
# one int constant per value of fsdp2_status_t, named without its FSDP2_ or
# FSDP2_ERROR_ prefix, equal to SWIG's constant of the same C name and
# documented by the header's comment. A status added to the header reaches
# Java with the next build; tests/org/fsdp2/StatusTest.java checks the result.
set -eu
header=$1
out=$2
awk '
  BEGIN {
    print "// Generated from c_api/fsdp2.h by bindings/java/status_java.sh: do not edit."
    print "package org.fsdp2;"
    print ""
    print "import org.fsdp2.internal.Fsdp2NativeConstants;"
    print ""
    print "/** The C ABI'"'"'s status codes (fsdp2_status_t), as {@link FSDP2Exception#status()} reports them. */"
    print "public final class Status {"
  }
  /^typedef enum fsdp2_status *\{/ { inside = 1; next }
  inside && /^\}/ { inside = 0 }
  inside && match($0, /FSDP2_(OK|ERROR_[A-Z0-9_]+)/) {
    c_name = substr($0, RSTART, RLENGTH)
    java_name = c_name
    sub(/^FSDP2_(ERROR_)?/, "", java_name)
    if (match($0, /\/\*.*\*\//)) print "  /** " substr($0, RSTART + 3, RLENGTH - 6) " */"
    print "  public static final int " java_name " = Fsdp2NativeConstants." c_name ";"
    ++count
  }
  END {
    print ""
    print "  private Status() {}"
    print "}"
    if (count < 2) {
      print "status_java.sh: found no fsdp2_status_t values in the header" > "/dev/stderr"
      exit 1
    }
  }
' "$header" > "$out"
