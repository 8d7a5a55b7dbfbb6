"""nvcc inside the Bazel build, without rules_cuda.

cuda_library compiles .cu files with the CUDA toolkit's nvcc (found by
repository.bzl) into position-independent objects and wraps them in a
cc_library. CUDA_KERNELS_BUILT says whether it does: only where there is an
nvcc and the LibTorch has CUDA (@libtorch//:root.bzl); elsewhere, and under
`--define=fsdp2_cuda_kernels=off`, the cc_library is empty and code that
defines cuda_local_defines()'s macro is compiled without its CUDA part.

The .cu files include only the CUDA toolkit's headers (no LibTorch, no
Abseil): nvcc then costs a few seconds a file, and no C++ ABI question
arises between nvcc's host pass and the rest of the build. The device code
is Hopper machine code (sm_90) plus compute_90 PTX, which the driver
compiles for newer cards when the program loads.
"""

load("@cuda_toolkit//:defs.bzl", "NVCC")
load("@libtorch//:root.bzl", "LIBTORCH_HAS_CUDA")

CUDA_KERNELS_BUILT = NVCC != "" and LIBTORCH_HAS_CUDA

# Hopper machine code, and PTX of the same virtual architecture for the
# cards after it.
CUDA_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def _cuda_objects_impl(ctx):
    objects = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(".cu")]
        out = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add_all(["-c", src.path, "-o", out.path])
        args.add_all(["-std=c++17", "-O3", "-lineinfo", "-Xcompiler", "-fPIC"])
        args.add_all(CUDA_GENCODE)
        # The workspace root, so that sources include "core/kernels/...".
        args.add("-I.")
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = [args],
            inputs = depset([src] + ctx.files.hdrs),
            outputs = [out],
            env = {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"},
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
        )
        objects.append(out)
    return [DefaultInfo(files = depset(objects))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    doc = "Compiles each .cu file of srcs with nvcc into a .pic.o (sm_90 and compute_90 PTX).",
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".cuh", ".h"]),
        "copts": attr.string_list(),
        "nvcc": attr.string(mandatory = True),
    },
)

_OFF = "//third_party/cuda:kernels_off"

def cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    """A cc_library of the objects nvcc makes from srcs (.cu), headers hdrs.

    Empty where CUDA_KERNELS_BUILT is false or under
    --define=fsdp2_cuda_kernels=off. The objects call the CUDA runtime,
    which @libtorch links where it has CUDA.
    """
    objects = []
    if CUDA_KERNELS_BUILT:
        cuda_objects(
            name = name + "_objects",
            srcs = srcs,
            hdrs = hdrs,
            nvcc = NVCC,
            visibility = ["//visibility:private"],
        )
        objects = select({_OFF: [], "//conditions:default": [":" + name + "_objects"]})
    native.cc_library(
        name = name,
        srcs = objects,
        deps = deps,
        **kwargs
    )

def cuda_local_defines(define):
    """[define] where cuda_library compiles its objects, [] otherwise."""
    if not CUDA_KERNELS_BUILT:
        return []
    return select({_OFF: [], "//conditions:default": [define]})
