"""A repository rule that exposes LibTorch 2.x as @libtorch//:libtorch.

The LibTorch is PyTorch's own wheel (torch==2.11.0), installed by
scripts/setup.sh into the project's Python environment, FSDP2_VENV (default
/opt/fsdp2/venv). FSDP2_LIBTORCH points the build anywhere else:
  - a pip wheel's torch/ folder (include/, lib/),
  - an unpacked official libtorch zip (include/, lib/).

Where that LibTorch has lib/libtorch_cuda.so, the CUDA and NCCL path is built
too (USE_C10D_NCCL, FSDP2_WITH_CUDA) against the CUDA and NCCL headers the
wheel was built with: the nvidia-* wheels beside torch/ (nvidia/cu13/include,
nvidia/nccl/include), then the CUDA toolkit (FSDP2_CUDA_HOME, default
/usr/local/cuda-13.0, then /usr/local/cuda) for what those wheels lack
(crt/). FSDP2_CXX11_ABI (0 or 1, default 1) must match how that LibTorch was
built; PyPI's wheels since 2.7 use 1.

Gloo: PyTorch installs no gloo headers, while ProcessGroupGloo.hpp includes
them. Debian's libgloo-dev provides their declarations (not its library);
core/comm/internal/gloo_backend.cc is the one file that includes them, and
//core/comm:gloo_headers_test proves that no code of ours uses a gloo
definition (a layout, an inline function), so the header version cannot
matter.
"""

DEFAULT_VENV = "/opt/fsdp2/venv"

def _first_existing(ctx, paths):
    for p in paths:
        if p and ctx.path(p).exists:
            return p
    return None

def _venv_path(ctx):
    return ctx.os.environ.get("FSDP2_VENV", DEFAULT_VENV).rstrip("/")

def _venv_torch(ctx, venv):
    found = ctx.execute(["sh", "-c", "ls -d %s/lib/python3*/site-packages/torch 2>/dev/null | head -n 1" % venv])
    return found.stdout.strip()

def _libtorch_repository_impl(ctx):
    venv = _venv_path(ctx)
    root = ctx.os.environ.get("FSDP2_LIBTORCH", "").rstrip("/")
    if root == "":
        root = _venv_torch(ctx, venv)
        if root == "":
            fail("No LibTorch: %s holds no torch package. Run scripts/setup.sh " % venv +
                 "(it installs torch==2.11.0 there), or point FSDP2_LIBTORCH at a torch/ " +
                 "folder or an unpacked libtorch zip.")
    api = root + "/include/torch/csrc/api/include"
    if not ctx.path(api).exists:
        fail("FSDP2_LIBTORCH=%s holds no LibTorch: %s is missing. Point it at a torch/ " % (root, api) +
             "folder with include/ and lib/ (a pip wheel's, or an unpacked libtorch zip).")
    libdir = root + "/lib"
    for lib in ["libtorch.so", "libtorch_cpu.so", "libc10.so"]:
        if not ctx.path(libdir + "/" + lib).exists:
            fail("%s/%s is missing (FSDP2_LIBTORCH=%s)" % (libdir, lib, root))
    # X.Y.Z from torch/headeronly/version.h (2.11) or torch/version.h (older 2.x).
    parts = {}
    for header in [root + "/include/torch/headeronly/version.h", root + "/include/torch/version.h"]:
        if ctx.path(header).exists:
            for line in ctx.read(header).splitlines():
                words = [w for w in line.replace("\t", " ").split(" ") if w]
                if len(words) == 3 and words[0] == "#define" and words[1] in ["TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"]:
                    parts.setdefault(words[1], words[2])
    version = ".".join([parts.get(k, "?") for k in ["TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"]])
    if int(parts.get("TORCH_VERSION_MAJOR", "0")) < 2:
        fail("FSDP2_LIBTORCH=%s is LibTorch %s; fsdp2 needs LibTorch 2.x" % (root, version))

    ctx.symlink(api, "api_include")
    ctx.symlink(root + "/include", "include")
    includes = ["api_include", "include"]

    libs = ["torch", "torch_cpu", "c10"]
    cuda = ctx.path(libdir + "/libtorch_cuda.so").exists
    linkopts = []
    defines = ["_GLIBCXX_USE_CXX11_ABI=" + ctx.os.environ.get("FSDP2_CXX11_ABI", "1"), "USE_C10D_GLOO"]
    cuda_libdirs = []
    if cuda:
        libs += ["torch_cuda", "c10_cuda"]
        defines += ["USE_C10D_NCCL", "FSDP2_WITH_CUDA"]
        nvidia = root + "/../nvidia"
        toolkit = _first_existing(ctx, [ctx.os.environ.get("FSDP2_CUDA_HOME", ""), "/usr/local/cuda-13.0", "/usr/local/cuda"])
        toolkit_include = None
        if toolkit:
            toolkit_include = _first_existing(ctx, [toolkit + "/targets/x86_64-linux/include", toolkit + "/include"])
        runtime_include = _first_existing(ctx, [nvidia + "/cu13/include", nvidia + "/cuda_runtime/include", toolkit_include])
        nccl_include = _first_existing(ctx, [nvidia + "/nccl/include", toolkit_include])
        if not runtime_include or not ctx.path(runtime_include + "/cuda_runtime_api.h").exists:
            fail("%s has libtorch_cuda.so but no CUDA headers were found: install the CUDA toolkit " % libdir +
                 "(FSDP2_CUDA_HOME) or the nvidia-* wheels beside torch/")
        if not nccl_include or not ctx.path(nccl_include + "/nccl.h").exists:
            fail("%s has libtorch_cuda.so but no nccl.h was found (nvidia/nccl/include or the CUDA toolkit)" % libdir)
        ctx.symlink(runtime_include, "cuda_include")
        includes.append("cuda_include")
        if nccl_include != runtime_include:
            ctx.symlink(nccl_include, "nccl_include")
            includes.append("nccl_include")
        if toolkit_include and toolkit_include != runtime_include:
            # Only for what the runtime wheel lacks (crt/); searched last.
            ctx.symlink(toolkit_include, "toolkit_include")
            includes.append("toolkit_include")
        for d, lib in [(nvidia + "/cu13/lib", "libcudart.so.13"), (nvidia + "/nccl/lib", "libnccl.so.2")]:
            if ctx.path(d + "/" + lib).exists:
                cuda_libdirs.append(d)
                linkopts += ["-L" + d, "-Wl,-rpath," + d, "-l:" + lib]
        if not cuda_libdirs and toolkit:
            linkopts += ["-L" + toolkit + "/lib64", "-Wl,-rpath," + toolkit + "/lib64", "-lcudart", "-lnccl"]

    # libstdc++ first: PyPI's libtorch.so, built with GCC 13's toolset for
    # manylinux, exports its own copies of newer libstdc++ functions
    # (std::filesystem among them), and a program that finds libtorch.so
    # before libstdc++.so binds its own calls to those: remove_all crashed
    # (a jump to address 0) in every checkpoint commit.
    linkopts = ["-L" + libdir, "-Wl,-rpath," + libdir, "-Wl,--no-as-needed", "-lstdc++"] + ["-l" + l for l in libs] + linkopts
    linkopts += ["-Wl,--as-needed", "-lpthread"]

    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = glob(["api_include/**/*.h", "include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"{cuda_glob}]),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(
        cuda_glob = ', "cuda_include/**/*.h", "cuda_include/**/*.hpp", "nccl_include/**/*.h", "toolkit_include/crt/*.h", "toolkit_include/crt/*.hpp"' if cuda else "",
        includes = repr(includes),
        defines = repr(defines),
        linkopts = repr(linkopts),
    ))
    ctx.file("WORKSPACE", "workspace(name = \"libtorch\")\n")
    ctx.file("root.bzl", "LIBTORCH_ROOT = %r\nLIBTORCH_LIBDIR = %r\nLIBTORCH_HAS_CUDA = %r\n" % (root, libdir, cuda))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["FSDP2_LIBTORCH", "FSDP2_VENV", "FSDP2_CXX11_ABI", "FSDP2_CUDA_HOME"],
    local = True,
)

def _venv_repository_impl(ctx):
    venv = _venv_path(ctx)
    python = venv + "/bin/python3"
    if not ctx.path(python).exists:
        fail("%s is missing: run scripts/setup.sh, which makes the project's Python environment " % python +
             "(FSDP2_VENV, default %s) with torch, numpy and pytest" % DEFAULT_VENV)
    ctx.file("WORKSPACE", "workspace(name = \"venv\")\n")
    ctx.file("python.bzl", "PYTHON = %r\nVENV = %r\n" % (python, venv))
    ctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# py_test and py_binary run on the project's environment: PyTorch 2.11 (the
# reference), numpy, pytest, safetensors.
py_runtime(
    name = "py3_runtime",
    interpreter_path = {python},
    python_version = "PY3",
    stub_shebang = "#!" + {python},
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py3_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

# C++ code that starts the reference Python (tests, benchmarks) names it
# FSDP2_PYTHON.
cc_library(
    name = "python_path",
    defines = [{define}],
)
""".format(python = repr(python), define = repr('FSDP2_PYTHON=\\"%s\\"' % python)))

venv_repository = repository_rule(
    implementation = _venv_repository_impl,
    environ = ["FSDP2_VENV"],
    local = True,
)
