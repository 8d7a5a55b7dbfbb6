"""cuda_toolkit_repository: where the CUDA toolkit's nvcc is, for cuda.bzl.

It looks in FSDP2_CUDA_HOME, then /usr/local/cuda-13.0, then /usr/local/cuda,
and writes @cuda_toolkit//:defs.bzl with NVCC (the path of an nvcc that
runs, or "" where there is none) and CUDA_VERSION ("13.0", or "").
"""

def _cuda_toolkit_repository_impl(ctx):
    nvcc = ""
    version = ""
    homes = [ctx.os.environ.get("FSDP2_CUDA_HOME", ""), "/usr/local/cuda-13.0", "/usr/local/cuda"]
    for home in homes:
        if home and ctx.path(home + "/bin/nvcc").exists:
            nvcc = home.rstrip("/") + "/bin/nvcc"
            break
    if nvcc:
        result = ctx.execute([nvcc, "--version"])
        for word in result.stdout.replace(",", " ").replace("\n", " ").split(" "):
            if word.startswith("V") and word[1:2].isdigit():
                version = ".".join(word[1:].split(".")[:2])
        if result.return_code != 0 or not version:
            # An nvcc that does not run is no nvcc: build without it.
            nvcc = ""
            version = ""
    ctx.file("WORKSPACE", "workspace(name = \"cuda_toolkit\")\n")
    ctx.file("BUILD", "")
    ctx.file("defs.bzl", "NVCC = %r\nCUDA_VERSION = %r\n" % (nvcc, version))

cuda_toolkit_repository = repository_rule(
    implementation = _cuda_toolkit_repository_impl,
    environ = ["FSDP2_CUDA_HOME"],
    local = True,
)
