#!/usr/bin/env bash
# gloo_headers_test: fsdp2 compiles ProcessGroupGloo.hpp against Debian's
# gloo headers, not the gloo inside libtorch_cpu.so. That is sound only if
# our code holds gloo objects through pointers that libtorch made and calls
# no gloo code, so the layout of no gloo class and the body of no gloo
# function enters our binaries. Checked here on gloo_backend.cc compiled
# with -O0 -fno-inline, where every function it uses is a symbol:
#   - the only symbols that name a gloo type are the standard library's
#     shared_ptr/vector code over shared_ptr<gloo::...>, which touches only
#     the control block (libtorch's) and never a gloo object;
#   - no control block or deleter for a gloo type is ours (those would
#     destroy a gloo object with our idea of its class), and no shared_ptr
#     to a gloo object is dereferenced (operator->, operator*, get(): a
#     virtual call through our idea of its vtable would need one);
#   - no gloo function or variable is referenced, defined or undefined
#     (gloo's header constants, private read-only copies, aside);
# The classes we allocate (ProcessGroupGloo, its Options) hold gloo objects
# only through shared_ptr, unique_ptr and vectors of them, so their size does
# not depend on gloo's headers either; their constructors and destructors
# are libtorch's.
#   - no other source file includes ProcessGroupGloo.hpp.
# Usage: gloo_headers_test.sh ARCHIVES... -- SOURCES...
set -euo pipefail
archives=(); sources=()
while [[ $# -gt 0 && $1 != "--" ]]; do archives+=("$1"); shift; done
shift
sources=("$@")
fail=0

objects=0
for a in "${archives[@]}"; do
  case $a in *.a) ;; *) continue ;; esac
  objects=$((objects + 1))
  # "TYPE NAME" for every symbol naming a gloo type or function.
  symbols=$(nm -C "$a" | sed -E 's/^[0-9a-f]* *//' | grep 'gloo::' || true)
  if [[ -z $symbols ]]; then
    echo "FAIL: $a names no gloo type at all: is this the gloo backend's object?" >&2
    fail=1
  fi
  # Allowed: the standard library's code over shared_ptr<gloo::X> (copy,
  # move, destroy, vector growth), where every gloo type named is the
  # pointee of a shared_ptr, and read-only constants that gloo's headers
  # define with internal linkage (type r: this object's private, unread
  # copies). Anything else is a use of gloo.
  bad=$(echo "$symbols" | grep -vE '^r gloo::' \
        | sed -E 's/shared_ptr<gloo::[A-Za-z_:]+/shared_ptr<POINTEE/g' | grep 'gloo::' || true)
  # Nor may our code reach into a gloo object: a dereference of a
  # shared_ptr<gloo::X> (operator->, operator*, get()) would let it call a
  # virtual function through Debian's idea of the vtable; a control block or
  # deleter of ours would destroy one.
  blocks=$(echo "$symbols" | grep -E '_Sp_counted_(ptr|deleter|ptr_inplace)<[^>]*gloo::|__shared_ptr_access<gloo::|shared_ptr<gloo::[^>]*>::get\(' || true)
  if [[ -n $bad || -n $blocks ]]; then
    echo "FAIL: $a uses gloo code, whose definitions come from Debian's headers, not libtorch's gloo:" >&2
    printf '%s\n%s\n' "$bad" "$blocks" | sed '/^$/d; s/^/  /' >&2
    fail=1
  fi
done
if [[ $objects -eq 0 ]]; then
  echo "FAIL: no archive of gloo_backend among: ${archives[*]}" >&2
  fail=1
fi

includers=$(grep -lE '#include *[<"].*ProcessGroupGloo\.hpp'  "${sources[@]}" | grep -v 'internal/gloo_backend\.\(cc\|h\)$' || true)
if [[ -n $includers ]]; then
  echo "FAIL: only core/comm/internal/gloo_backend.cc may include ProcessGroupGloo.hpp; also:" >&2
  echo "$includers" | sed 's/^/  /' >&2
  fail=1
fi

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "gloo_headers_test: ${#archives[@]} archive(s), $(echo "$symbols" | wc -l) gloo-typed symbols, all standard-library pointer code; no other includer"
