"""cuda_library: CUDA C++ with Bazel 4.2.3, offline, without rules_cuda.

    load("//tools/build_defs:cuda.bzl", "cuda_library", "CUDA_TARGET_COMPATIBLE_WITH")

    cuda_library(
        name = "kernels",
        srcs = ["kernels.cu", "kernels_internal.h", "host_side.cc"],
        hdrs = ["kernels.h"],
        deps = ["//common:something"],
    )

What it makes:
  <name>_nvcc     genrule: nvcc compiles every .cu in `srcs` into the static
                  archive lib<name>_nvcc.a (relocatable device code is NOT
                  used: each .cu carries its own complete device code).
  <name>_hdrs     the headers of `deps` (from their CcInfo), as genrule inputs:
                  the genrule only sees the files it lists.
  <name>_import   cc_import(alwayslink = True) of that archive (kernels are
                  registered by static constructors, so nothing may be dropped).
  <name>          cc_library (linkstatic): `hdrs`, the non-.cu `srcs`
                  (compiled by the normal C++ toolchain, with CUDA's headers
                  on the include path), the archive, `deps`, and the static
                  CUDA runtime (@local_cuda//:cudart: libcudart_static.a
                  -ldl -lpthread -lrt).

nvcc flags: -O3 -std=c++17 -Xcompiler -fPIC -lib, SASS for sm_90 (H100/H200)
plus compute_90 PTX (so GPUs newer than Hopper JIT-compile it; older ones
cannot run it), -fmad=false (no multiply-add contraction: results can be
bit-identical to the CPU kernels), IEEE division and square root (nvcc's
defaults; never --use_fast_math), -I. and -I$(GENDIR) (workspace-relative
includes, generated headers too), CUDA's include/ and include/cccl/. Then the
caller's `copts`. The genrule does not follow -c opt/dbg.

CUDA is found by @local_cuda (//third_party/system:cuda.bzl): $CUDA_PATH/bin/nvcc,
default /usr/local/cuda. nvcc and CUDA's headers are used by absolute path
(the Linux sandbox can read them; an nvcc invoked through an input symlink
would not find its own cicc/ptxas): a CUDA upgrade in place is not seen as a
change, so `bazel clean` after one.

Without CUDA (@local_cuda//:defs.bzl says CUDA_AVAILABLE = False) every target
above gets target_compatible_with = ["//platforms:never"] (Bazel 4.2.3's
@platforms has no :incompatible; //platforms:BUILD defines one), so
`bazel build //...` and `bazel test //...` skip them and succeed. Give tests
and binaries that depend on a cuda_library CUDA_TARGET_COMPATIBLE_WITH too
(Bazel would skip them anyway, as dependents of an incompatible target, but
saying so keeps the intent visible). cc_import has no target_compatible_with
in 4.2.3; it is skipped with its genrule.

Simulating a machine without CUDA (measured with this Bazel 4.2.3, on a
separate --output_base so that the shared workspace's server was not
disturbed; every way below re-runs @local_cuda, whose defs.bzl then says
CUDA_AVAILABLE = False, and dropping it again re-runs it with CUDA found):
  * `bazel test --repo_env=CUDA_PATH=/nonexistent //...`  THE WAY TO DO IT.
    Only repository rules see the value; no action's key changes, so
    nothing else rebuilds, there or back. Measured: all 16 other tests
    passed and the 3 CUDA tests were reported SKIPPED ("Executed 16 out of
    19 tests: 16 tests pass and 3 were skipped"); `bazel test
    //server/cuda/...` alone exits 0 with "3 were skipped". Naming a CUDA
    target explicitly fails ("is incompatible and cannot be built, but was
    explicitly requested"), as Bazel does for any incompatible target.
  * `CUDA_PATH=/nonexistent bazel ...` (in the client's environment) works
    too, but this workspace's .bazelrc has `build --action_env=CUDA_PATH`,
    which hands the client's value to actions: the C++ compiles etc. re-run
    (measured), once there and once back.
  * `bazel ... --action_env=CUDA_PATH=/nonexistent` likewise re-runs
    @local_cuda (action_env values reach repository rules in 4.2.3) and,
    likewise, re-runs the actions.
  With another --output_base, pass --symlink_prefix=/ (or the workspace's
  bazel-* links get re-pointed) and list the top-level packages instead of
  //... (without its own convenience links Bazel descends into bazel-main/).
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")

# Put on every target that needs CUDA (tests, binaries).
CUDA_TARGET_COMPATIBLE_WITH = [] if CUDA_AVAILABLE else ["//platforms:never"]

# The flags every .cu gets (see the module docstring).
NVCC_COPTS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler",
    "-fPIC",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
]

def _cc_headers_impl(ctx):
    headers = []
    for dep in ctx.attr.deps:
        if CcInfo in dep:
            headers.append(dep[CcInfo].compilation_context.headers)
    return [DefaultInfo(files = depset(transitive = headers))]

# The (transitive) headers of some cc targets, as plain files.
_cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list()},
)

def cuda_library(
        name,
        srcs,
        hdrs = [],
        deps = [],
        copts = [],
        host_copts = [],
        visibility = None,
        testonly = False):
    """A C++ library with CUDA sources.

    Args:
      name: the cc_library's name.
      srcs: .cu files (nvcc), .cc/.cpp files (the C++ toolchain) and private
        headers (seen by both).
      hdrs: public headers.
      deps: cc targets; their headers are visible to nvcc, and they are linked.
      copts: extra nvcc flags (only for the .cu files).
      host_copts: extra C++ compiler flags for the non-.cu srcs.
      visibility: of the cc_library.
      testonly: as usual.
    """
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    cc_srcs = [s for s in srcs if not s.endswith(".cu")]
    private_hdrs = [s for s in srcs if s.endswith(".h") or s.endswith(".cuh")]
    if not cu_srcs:
        fail("cuda_library %s: no .cu file in srcs" % name)
    compat = CUDA_TARGET_COMPATIBLE_WITH
    archive = "lib%s_nvcc.a" % name

    _cc_headers(
        name = name + "_hdrs",
        deps = deps,
        testonly = testonly,
        target_compatible_with = compat,
        visibility = ["//visibility:private"],
    )

    if CUDA_AVAILABLE:
        flags = NVCC_COPTS + [
            "-I.",
            "-I$(GENDIR)",
            "-isystem",
            CUDA_PATH + "/include",
            "-isystem",
            CUDA_PATH + "/include/cccl",
        ] + copts
        cmd = " ".join([
            # nvcc writes its intermediate files to $$TMPDIR; give it a private one.
            "tmp=$$(mktemp -d) &&",
            "trap 'rm -rf \"$$tmp\"' EXIT &&",
            "TMPDIR=$$tmp",
            CUDA_PATH + "/bin/nvcc",
            " ".join(flags),
            "-lib -o $@",
            " ".join(["$(location %s)" % s for s in cu_srcs]),
        ])
    else:
        cmd = "echo 'CUDA is not available (no nvcc at $$CUDA_PATH)' >&2; exit 1"

    native.genrule(
        name = name + "_nvcc",
        srcs = cu_srcs + hdrs + private_hdrs + [":" + name + "_hdrs"],
        outs = [archive],
        cmd = cmd,
        message = "nvcc %s" % name,
        testonly = testonly,
        target_compatible_with = compat,
        visibility = ["//visibility:private"],
    )

    native.cc_import(
        name = name + "_import",
        static_library = ":" + archive,
        alwayslink = True,
        testonly = testonly,
        visibility = ["//visibility:private"],
    )

    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        copts = host_copts,
        deps = [
            ":" + name + "_import",
            "@local_cuda//:cudart",
            "@local_cuda//:headers",
        ] + deps,
        # Only ever linked into the final binary (no lib<name>.so, not even
        # for fastbuild tests): libcudart_static.a comes in through linkopts,
        # and the linker does not pull archive members for a shared
        # library's undefined symbols.
        linkstatic = True,
        testonly = testonly,
        target_compatible_with = compat,
        visibility = visibility,
    )
