"""Repository rule for the local CUDA toolkit.

Looks for $CUDA_PATH/bin/nvcc (default /usr/local/cuda). When present it
exposes nvcc, the headers and the static runtime; when absent it writes the
same target names as empty stubs, and `defs.bzl` says CUDA_AVAILABLE = False,
so that `bazel build //...` keeps working on machines without CUDA (Bazel 4.2.3
resolves the dependencies even of skipped targets). //tools/build_defs:cuda.bzl
reads defs.bzl and marks CUDA targets incompatible (skipped) when absent.

Re-detection: the rule is `local` and declares environ = ["CUDA_PATH"], so it
is re-run when CUDA_PATH changes in the environment Bazel hands repository
rules: `--repo_env=CUDA_PATH=/nonexistent` simulates a machine without CUDA
without rebuilding anything else (measured; see //tools/build_defs:cuda.bzl
for the other ways and their cost), and `bazel clean --expunge` starts over.
"""

def _cuda_toolkit_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    found = nvcc.exists
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %s\n" % (
        "True" if found else "False",
        repr(cuda_path if found else ""),
    ))
    if found:
        ctx.symlink(cuda_path, "cuda")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

filegroup(
    name = "nvcc",
    srcs = ["cuda/bin/nvcc"],
)

filegroup(
    name = "headers_files",
    srcs = glob(["cuda/include/**/*.h", "cuda/include/**/*.hpp", "cuda/include/**/*.cuh", "cuda/include/cccl/**"]),
)

cc_library(
    name = "cudart",
    linkopts = [
        "{cuda}/lib64/libcudart_static.a",
        "-ldl", "-lpthread", "-lrt",
    ],
    includes = [],
    copts = [],
)

# Every header (crt/, cuda/std/, the CCCL tree): the sandbox only shows
# declared inputs, and cuda_runtime_api.h already pulls in crt/ headers.
cc_library(
    name = "headers",
    hdrs = glob([
        "cuda/include/**/*.h",
        "cuda/include/**/*.hpp",
        "cuda/include/**/*.cuh",
        "cuda/include/**/*.inl",
    ]),
    includes = ["cuda/include"],
)
""".format(cuda = cuda_path))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

filegroup(name = "nvcc", srcs = [])
filegroup(name = "headers_files", srcs = [])
cc_library(name = "cudart")
cc_library(name = "headers")
""")

cuda_toolkit = repository_rule(
    implementation = _cuda_toolkit_impl,
    local = True,
    environ = ["CUDA_PATH"],
)
