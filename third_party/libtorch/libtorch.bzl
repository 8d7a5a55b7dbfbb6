"""A repository rule that exposes an installed LibTorch as @libtorch//:libtorch.

FSDP2_LIBTORCH selects the installation (default: Debian's /usr):
  - a pip wheel's torch/ folder (include/, lib/),
  - an unpacked official libtorch zip (include/, lib/),
  - /usr for Debian's libtorch-dev (headers in /usr/include, libraries in the
    multiarch folder).
FSDP2_CXX11_ABI (0 or 1, default 1) must match how that LibTorch was built.
"""

def _first_existing(ctx, paths):
    for p in paths:
        if ctx.path(p).exists:
            return p
    return None

def _libtorch_repository_impl(ctx):
    root = ctx.os.environ.get("FSDP2_LIBTORCH", "/usr").rstrip("/")
    if root == "":
        root = "/"
    api = root + "/include/torch/csrc/api/include"
    if not ctx.path(api).exists:
        fail("FSDP2_LIBTORCH=%s holds no LibTorch: %s is missing. Install libtorch-dev " % (root, api) +
             "or point FSDP2_LIBTORCH at a torch/ folder with include/ and lib/.")
    libdir = _first_existing(ctx, [root + "/lib/x86_64-linux-gnu", root + "/lib/aarch64-linux-gnu", root + "/lib"])
    for lib in ["libtorch.so", "libtorch_cpu.so", "libc10.so"]:
        if not ctx.path(libdir + "/" + lib).exists:
            fail("%s/%s is missing (FSDP2_LIBTORCH=%s)" % (libdir, lib, root))

    ctx.symlink(api, "api_include")
    includes = ["api_include"]
    if root != "/usr":
        # /usr/include is already a system include directory; adding it again
        # with -isystem would break libstdc++'s #include_next.
        ctx.symlink(root + "/include", "include")
        includes.append("include")

    libs = ["torch", "torch_cpu", "c10"]
    cuda = ctx.path(libdir + "/libtorch_cuda.so").exists
    if cuda:
        libs += ["torch_cuda", "c10_cuda"]
    abi = ctx.os.environ.get("FSDP2_CXX11_ABI", "1")
    defines = ["_GLIBCXX_USE_CXX11_ABI=" + abi, "USE_C10D_GLOO"]
    if cuda:
        defines += ["USE_C10D_NCCL", "FSDP2_WITH_CUDA"]

    linkopts = ["-L" + libdir, "-Wl,-rpath," + libdir, "-Wl,--no-as-needed"]
    linkopts += ["-l" + l for l in libs]
    linkopts += ["-Wl,--as-needed", "-lpthread"]

    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = glob(["api_include/**/*.h"{extra_glob}]),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)

# The installation this build uses, for scripts and tests that need to know.
filegroup(name = "root_marker", srcs = [])
""".format(
        extra_glob = ', "include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"' if root != "/usr" else "",
        includes = repr(includes),
        defines = repr(defines),
        linkopts = repr(linkopts),
    ))
    ctx.file("WORKSPACE", "workspace(name = \"libtorch\")\n")
    ctx.file("root.bzl", "LIBTORCH_ROOT = %r\nLIBTORCH_LIBDIR = %r\nLIBTORCH_HAS_CUDA = %r\n" % (root, libdir, cuda))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["FSDP2_LIBTORCH", "FSDP2_CXX11_ABI"],
    local = True,
)
